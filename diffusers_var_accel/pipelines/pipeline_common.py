"""The pipeline mixin the next-scale pipelines share: compiled passes and CUDA graphs, sampling mode, the properties
diffusers users read, the per-scale callback and decoding to the requested output type."""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Any, Callable, Dict, Optional, Sequence, Union

import torch
from diffusers.pipelines.pipeline_utils import ImagePipelineOutput

from ..next_scale.state import ScheduleTables
from ..next_scale.graphs import PassRunners
from .sampling import DrawCheck, check_sampling_mode


class NextScalePipelineMixin:
    """Properties and steps common to the next-scale pipelines (mixed into ``DiffusionPipeline`` subclasses)."""

    _interrupt = False
    _sampling = "device"

    @property
    def _pass_runners(self) -> PassRunners:
        """The runner this pipeline's passes go through (and what compiling set process-wide), one per pipeline."""
        runners = self.__dict__.get("_pass_runners_")
        if runners is None:
            runners = self.__dict__["_pass_runners_"] = PassRunners()
        return runners

    @property
    def _pass_runner(self) -> Optional[Callable]:
        """The loop's ``pass_runner`` of the next call (``None``: eager passes)."""
        return self._pass_runners.runner

    @_pass_runner.setter
    def _pass_runner(self, runner: Optional[Callable]) -> None:
        self._pass_runners.runner = runner

    # -- the low-memory recipe -------------------------------------------------------------------------------------
    def enable_low_memory(
        self, gpu_id: Optional[int] = None, device: Union[torch.device, str, None] = None, tiling: bool = True
    ) -> None:
        """The documented low-memory recipe's memory part in one call: diffusers' model offload (one component on the
        accelerator at a time, ``enable_model_cpu_offload``) and tiled decoding (``vae.enable_tiling()``, which bounds
        the decoder's buffers at large sizes). Nothing else: the acceleration method (``enable_lazyvar()`` in the
        recipes), weight quantisation and the int8 KV cache stay separate choices (``docs/memory.md`` counts each).

        Args:
            gpu_id (`int`, *optional*): passed to ``enable_model_cpu_offload``.
            device (`torch.device` or `str`, *optional*): the accelerator, passed to ``enable_model_cpu_offload``.
            tiling (`bool`, defaults to `True`): also decode in tiles.
        """
        if not isinstance(tiling, bool):
            raise ValueError(f"tiling must be True or False, got {tiling!r}")
        self.enable_model_cpu_offload(gpu_id=gpu_id, device=device)
        if tiling:
            self.vae.enable_tiling()
        else:
            self.vae.disable_tiling()

    # -- the KV cache's storage ------------------------------------------------------------------------------------
    def enable_kv_cache_quantization(self, dtype: str = "int8") -> None:
        """Store the self-attention KV cache of the next calls in int8: keys with one scale per channel (per pass),
        values with one scale per token (the KIVI / VAR-Compressor layout, :mod:`~diffusers_var_accel.next_scale.
        quantized_cache`). Attention reads the earlier scales back in its own dtype; the cache takes about half the
        bytes of a bfloat16 one. Works with every acceleration method and the plan-sized cache; the passes run
        eagerly (not with ``enable_cuda_graphs`` or ``compile_passes``).

        Args:
            dtype (`str`, defaults to `"int8"`): the storage form; ``"int8"`` is the one there is.
        """
        from ..next_scale.quantized_cache import KV_CACHE_DTYPES, check_kv_cache_dtype

        if dtype is None:
            raise ValueError(
                f"dtype None is not a quantised form (allowed: {', '.join(map(repr, KV_CACHE_DTYPES))}); "
                "pipe.disable_kv_cache_quantization() restores the attention's dtype"
            )
        self._kv_cache_dtype = check_kv_cache_dtype(dtype)

    def disable_kv_cache_quantization(self) -> None:
        """Store the KV cache in the attention's dtype again (the default; bit-identical to never enabling it)."""
        self._kv_cache_dtype = None

    @property
    def kv_cache_dtype(self) -> Optional[str]:
        """The KV cache's storage form set by :meth:`enable_kv_cache_quantization` (``None``: the attention's dtype)."""
        return self.__dict__.get("_kv_cache_dtype")

    # -- compiled passes and CUDA graphs ------------------------------------------------------------------------------
    def compile_passes(
        self,
        backend: Union[str, Callable] = "inductor",
        fullgraph: bool = True,
        mode: Optional[str] = None,
        **options: Any,
    ) -> None:
        """Run the transformer blocks of every pass through ``torch.compile`` from the next call on.

        Each pass (the blocks over its scales' tokens, with its acceleration routes) becomes one graph, compiled on
        its first run with static shapes; a later call with the same size, batch and acceleration plan replays the
        graphs without recompiling. The head, guidance, sampling and the tokenizer steps between passes stay eager.

        Args:
            backend (`str` or callable, defaults to `"inductor"`): the ``torch.compile`` backend (``"eager"`` and
                ``"aot_eager"`` check the capture on a CPU without generating code).
            fullgraph (`bool`, defaults to `True`): a graph break inside a pass is an error instead of a split graph.
            mode (`str`, *optional*): the ``torch.compile`` mode (``"reduce-overhead"``: CUDA graphs).
            **options: passed on to ``torch.compile``.

        Dynamo's process-wide cache size limits are raised above the number of passes of a few plans (each pass is its
        own graph) while a pipeline compiles its passes; ``disable_cuda_graphs()`` goes back to eager passes and, for
        the last such pipeline, to the limits as they were.
        """
        self._pass_runners.compile(self.transformer, backend, fullgraph, mode, options)

    def compile_repeated_blocks(
        self,
        backend: Union[str, Callable] = "inductor",
        fullgraph: bool = True,
        mode: Optional[str] = None,
        **options: Any,
    ) -> None:
        """Regional compilation (diffusers' ``compile_repeated_blocks``): compile the transformer's repeated,
        shape-only regions (``transformer._repeated_blocks``: the feed-forward networks, about two thirds of a
        block's FLOPs) once per token count, one compiled graph shared by every block, instead of one graph per pass.
        Everything else runs eagerly (attention, KV cache, routes, head, sampling).

        A schedule has one token count per scale (plus the routed counts of an acceleration plan), so dynamo's cache
        limits are raised as for :meth:`compile_passes`, and hitting them raises instead of running eagerly.
        ``disable_cuda_graphs()`` goes back to eager modules.

        Args:
            backend (`str` or callable, defaults to `"inductor"`): the ``torch.compile`` backend.
            fullgraph (`bool`, defaults to `True`): a graph break is an error.
            mode (`str`, *optional*): the ``torch.compile`` mode.
            **options: passed on to ``torch.compile``.
        """
        self._pass_runners.compile_regions(self.transformer, backend, fullgraph, mode, options)

    @property
    def compiled_regions(self) -> int:
        """Modules of the transformer compiled by :meth:`compile_repeated_blocks` (0: none)."""
        return sum(getattr(m, "_compiled_call_impl", None) is not None for m in self.transformer.modules())

    def enable_cuda_graphs(
        self, capture: str = "cuda", strict: bool = False, max_workspaces: int = 4, decode: bool = True
    ) -> bool:
        """Capture every transformer pass as a graph on its first run and replay it from then on (one graph per size,
        batch, acceleration plan and pass). Call it after moving the pipeline to the GPU.

        ``capture="cuda"`` (the default) captures the eager pass directly as a ``torch.cuda.CUDAGraph``
        (:class:`~diffusers_var_accel.next_scale.graphs.PassGraphs`): no compiler, so a pass is ready after one warm-up
        run and one capture (seconds, where compiling each 32-block pass took minutes). The KV cache of each plan
        is allocated once, outside any graph, and reused by every call of that plan; the first call's tensors that a
        pass reads become its static inputs. ``pipe.disable_cuda_graphs()`` frees them. ``capture="compile"`` is the
        earlier route, ``torch.compile(mode="reduce-overhead", fullgraph=True)`` per pass (inductor also fuses the
        element-wise ops; minutes of compile per pass). ``capture="trace"`` is the CPU stand-in of ``"cuda"`` that
        the tests run: each pass traced once into an FX graph and replayed without its Python, on any device.
        With ``"cuda"`` and ``"trace"`` the VAE decode is captured too (once per latent shape), unless ``decode=False``.
        Every capture runs under :class:`~diffusers_var_accel.next_scale.capture_check.CaptureCheck`: an op a graph
        cannot hold (a host sync, an upload, a random draw) raises, naming the op and its line.

        Nothing falls back silently: with ``"compile"`` a pass that would need more graphs than dynamo's raised
        cache limit raises, and a pass that CUDA-graph trees skip (it then runs compiled but without graphs) warns
        once per pipeline and is counted in :attr:`passes_without_graphs`, or raises with ``strict=True``. Direct
        capture either captures a pass or raises.

        Args:
            capture (`str`, defaults to `"cuda"`): ``"cuda"``, ``"compile"`` or ``"trace"``.
            strict (`bool`, defaults to `False`): with ``"compile"``, raise at the first skipped graph (inductor's
                ``triton.cudagraph_or_error``, process-wide while graphs are on) instead of warning.
            max_workspaces (`int`, defaults to 4): with ``"cuda"`` / ``"trace"``, how many workspaces (schedule x batch
                x plan x scheduler configuration) keep their graphs; the least recently used is dropped. Workspaces
                whose KV caches have the same shape share one cache.
            decode (`bool`, defaults to `True`): with ``"cuda"`` / ``"trace"``, also capture the VAE decode.

        Returns:
            `bool`: whether graphs are on. ``"cuda"`` and ``"compile"`` on a device other than CUDA change nothing: a
            warning says so and the passes stay eager (``compile_passes`` compiles them without graphs on any
            device; ``capture="trace"`` runs anywhere).
        """
        if capture not in ("cuda", "compile", "trace"):
            raise ValueError(f"capture must be 'cuda', 'compile' or 'trace', got {capture!r}")
        if not isinstance(strict, bool):
            raise ValueError(f"strict must be True or False, got {strict!r}")
        if not isinstance(decode, bool):
            raise ValueError(f"decode must be True or False, got {decode!r}")
        device = self._pass_device()
        if capture != "trace" and device.type != "cuda":
            warnings.warn(
                f"enable_cuda_graphs() does nothing on the {device.type} device: CUDA graphs need the transformer "
                "on a CUDA GPU (move the pipeline with .to('cuda') first); passes stay eager",
                UserWarning,
                stacklevel=2,
            )
            return False
        if capture == "compile":
            self.compile_passes(backend="inductor", fullgraph=True, mode="reduce-overhead")
            if strict:
                self._pass_runners.strict()
        else:
            self._pass_runners.reset(self.transformer)
            self._pass_runners.capture(capture, max_workspaces, decode)
        return True

    @contextlib.contextmanager
    def eager_passes(self):
        """Run the calls inside the ``with`` block eagerly, keeping what ``enable_cuda_graphs()`` /
        ``compile_passes()`` hold for the calls after it (to check a captured call against the eager one without
        capturing everything again)."""
        runner, self._pass_runner = self._pass_runner, None
        try:
            yield
        finally:
            self._pass_runner = runner

    @property
    def passes_without_graphs(self) -> int:
        """Passes that ran without CUDA graphs since ``enable_cuda_graphs()`` (skipped by CUDA-graph trees); 0 when
        graphs are off."""
        return self._pass_runners.skipped_passes

    def disable_cuda_graphs(self) -> None:
        """Run every pass eagerly again (undoes ``enable_cuda_graphs``, ``compile_passes`` and
        ``compile_repeated_blocks``). The dynamo cache size limits go back to their values before the first compiled
        pipeline once no pipeline compiles its passes."""
        self._pass_runners.reset(self.transformer)

    @property
    def schedule_tables(self) -> ScheduleTables:
        """The constant tables (scale ids, positions) this pipeline's calls share: the one cache of the runtime that
        outlives a call, owned here (``pipe.schedule_tables.clear()`` drops it). See
        :class:`~diffusers_var_accel.next_scale.state.ScheduleTables`."""
        tables = self.__dict__.get("_schedule_tables")
        if tables is None:
            tables = self.__dict__["_schedule_tables"] = ScheduleTables()
        return tables

    def call_default(self, argument: str) -> Any:
        """The default value of the pipeline call's ``argument`` (read from ``__call__``'s signature)."""
        import inspect

        parameter = inspect.signature(type(self).__call__).parameters.get(argument)
        if parameter is None or parameter.default is inspect.Parameter.empty:
            raise ValueError(f"{type(self).__name__}.__call__ has no argument {argument!r} with a default")
        return parameter.default

    @property
    def passes_compiled(self) -> bool:
        """Whether the transformer passes run compiled or captured (``compile_passes`` / ``enable_cuda_graphs``)."""
        return self._pass_runner is not None

    @property
    def pass_graphs(self):
        """The :class:`~diffusers_var_accel.next_scale.graphs.PassGraphs` replaying captured passes (its
        ``captured_passes`` / ``replayed_passes`` say how the passes ran), or ``None``."""
        return self._pass_runners.graphs

    def _pass_device(self) -> torch.device:
        transformer = getattr(self, "transformer", None)
        parameter = next(transformer.parameters(), None) if transformer is not None else None
        return parameter.device if parameter is not None else torch.device("cpu")

    @property
    def sampling(self) -> str:
        """How tokens are drawn: ``"device"`` (the default; an exponential race with no host sync) or
        ``"official"`` (``torch.multinomial``, as the official code). See :meth:`set_sampling`."""
        return self._sampling

    def set_sampling(self, mode: str) -> None:
        """Choose how every following call draws its tokens.

        Args:
            mode (`str`): ``"device"`` draws ``argmax(probs / Exp(1))`` on the generator's device, with no host check
                per draw (``torch.multinomial`` reads its probabilities back on CUDA, a sync per draw): the call
                checks every draw once after its loop and raises like ``multinomial`` on a row of NaN or zero mass
                (:class:`~diffusers_var_accel.pipelines.sampling.DrawCheck`); ``"official"`` calls
                ``torch.multinomial(probs, 1)`` as the official code does. Both consume the generators in the same way
                and, on the CPU, give the same tokens bit for bit (``multinomial`` runs the same race for one sample).

        Raises:
            ValueError: ``mode`` is not one of ``"device"``, ``"official"``.
        """
        self._sampling = check_sampling_mode(mode)

    @property
    def guidance_scale(self):
        """The guidance of the current (or last) call: the ``guidance_scale`` number, or the per-scale list when
        ``cfg_list`` was given (or a callback set one)."""
        return self._guidance_scale

    @property
    def num_timesteps(self):
        """The number of scales of the current (or last) call."""
        return self._num_timesteps

    @property
    def interrupt(self):
        return self._interrupt

    def _scale_callback(
        self, callback: Optional[Callable], tensor_inputs: Sequence[str], scale_schedule, prompt_embeds, progress
    ):
        """The loop's ``on_scale_end``: the user's ``callback_on_step_end`` (which may replace ``latents``) and the
        progress bar. A diffusers ``PipelineCallback`` / ``MultiPipelineCallbacks`` brings its own ``tensor_inputs``
        (as diffusers' pipelines take them), checked against ``_callback_tensor_inputs`` here."""
        from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback

        if isinstance(callback, (PipelineCallback, MultiPipelineCallbacks)):
            tensor_inputs = list(callback.tensor_inputs)
            bad = [k for k in tensor_inputs if k not in self._callback_tensor_inputs]
            if bad:
                raise ValueError(
                    f"{type(callback).__name__}.tensor_inputs {bad} are not in {self._callback_tensor_inputs}"
                )

        def on_scale_end(si: int, state) -> None:
            if callback is not None:
                values: Dict[str, Any] = {
                    "latents": state.f_hat,
                    "tokens": state.tokens.get(si),
                    "logits": state.logits.get(si),
                    "prompt_embeds": prompt_embeds,
                }
                out = callback(self, si, tuple(scale_schedule[si]), {k: values[k] for k in tensor_inputs}) or {}
                if "latents" in out:
                    state.f_hat = out["latents"]
            progress.update()

        return on_scale_end

    def _decode_output(
        self,
        latents: torch.Tensor,
        output_type: str,
        return_dict: bool,
        per_image: bool = False,
        draw_check: Optional[DrawCheck] = None,
    ):
        """The images in ``output_type`` (``"latent"`` returns the summed latent as is).

        ``per_image`` (a list of generators was given: each image must not depend on its batch) decodes the images
        one by one: a convolution's result depends on the batch size in its last bits (the backend picks its kernel
        by shape), which is enough to move a pixel by 1/255 after quantisation. ``draw_check`` (the call's device
        draws) is read once, after the decode is queued, and raises ``RuntimeError`` like ``multinomial`` when a draw
        had a row of NaN or zero mass.
        """
        if output_type == "latent":
            image = latents
            if draw_check is not None:
                draw_check.raise_if_invalid()
        else:
            latents = latents.to(self.vae.dtype)
            decode = self.vae.decode
            graphs = self.pass_graphs
            if graphs is not None and graphs.capture_decode:  # enable_cuda_graphs(): the decode replays a graph too
                decode = functools.partial(graphs.decode, self.vae)
            if per_image and latents.shape[0] > 1:
                image = torch.cat([decode(latents[b : b + 1]) for b in range(latents.shape[0])])
            else:
                image = decode(latents)
            if draw_check is not None:  # the decode is queued: its kernels run while the host reads the check
                draw_check.raise_if_invalid()
            image = self.image_processor.postprocess(image, output_type=output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return (image,)
        return ImagePipelineOutput(images=image)
