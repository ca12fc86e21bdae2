"""Kernel launches and host-device syncs of one Infinity or HART generation, counted on the CPU.

A ``TorchDispatchMode`` sees every ATen op the generation dispatches (after autocast and the composite
decompositions, i.e. what a GPU would run), and a ``TorchFunctionMode`` sees the tensor methods that copy to the host
without an ATen op (``.tolist()``, ``.cpu()``, ``.numpy()``). The count of ops and their kind do not depend on the
width of the model, only on its structure (depth, scale schedule, size, batch, CFG, method), so the real structures
run here with a tiny width and random weights, in seconds to minutes on a CPU, and the counts are those of the real
models on a GPU (up to backend-specific decompositions, e.g. the attention kernel).

Counting convention:

* **ops**: every ATen op dispatched.
* **kernels**: the ops that launch a device kernel: every op except views and aliases (ops whose schema returns a
  non-writing alias of an input: ``view``, ``reshape`` as a view, ``transpose``, ``expand``, ``select``, slicing...),
  empty allocations (``empty*``, ``new_empty*``), metadata ops (``detach``, ``alias``, ``set_``, ``resize_``) and
  the host copies below (``_local_scalar_dense``, ``lift_fresh``). Sync ops that also launch a kernel
  (``nonzero``, ``masked_select``, ``unique``, ``repeat_interleave``, ``multinomial``) are counted as kernels *and*
  as syncs.
* **syncs**: the points where the host waits for the device, or uploads host data: ``_local_scalar_dense``
  (``.item()``, ``bool(t)``, ``int(t)``, ``float(t)``), ``nonzero``, ``masked_select``, ``unique*``,
  ``repeat_interleave`` with a tensor of repeats and no ``output_size``, ``multinomial`` (counted as **2**: the CUDA
  kernel checks its input twice on the host), ``.tolist()`` / ``.cpu()`` / ``.numpy()``, and device uploads of host
  data (``torch.tensor(list)`` / ``torch.as_tensor(list)`` dispatch ``lift_fresh``). On the CPU every
  ``torch.tensor(...)`` is counted as an upload, since on a GPU the same line runs with ``device=...``.
  Each sync is recorded with its source line: the innermost frame inside ``diffusers_var_accel`` (else the innermost
  frame outside torch and this module).

**Memory.** Each record also carries ``kv_cache_bytes``: what the call's self-attention KV cache allocates at the
model's *real* width (Infinity-2B 2048, HART-0.7B 1536 channels) in the counted dtype, for the counted size, batch and
CFG (:meth:`~diffusers_var_accel.pipelines.acceleration_mixin.VARAccelerationMixin.kv_cache_bytes`, from the plan:
the positions a later pass reads).

**Limits.** Everything runs on the CPU, so a copy the code writes as ``.to(device)`` (a tensor built on the host, then
moved; or ``.to("cpu")`` written with a device variable) is not an op there and is not seen; nor are the kernels a
CUDA backend adds or fuses (cuDNN / cuBLAS may launch more than one kernel for an op, SDPA picks another kernel).

**Half precision on a CPU.** The counter computes half-precision matrix products and convolutions on a CPU in
float32 and rounds the result to the caller's dtype (the CPU kernels accumulate in float32 too): a CPU without
bfloat16 instructions runs a bf16 matmul ~200x slower than a float32 one. The op is counted as called, before it runs.

**Window.** By default one warm-up call of the same size, batch and method runs first and the second call is
counted (the steady state; the first call's syncs are reported too, as ``first_call_syncs``). Only the generation
proper is counted: from the moment ``transformer.encode_condition`` returns (the
text projection is done; the text encoder runs before it) until the pipeline returns the decoded image
(``output_type="pt"``, so the image stays on the device). The counter wraps ``encode_condition`` on the transformer
*instance* for the call (its own ops are reported apart as ``condition``), splits the window into scales with the
pipeline's ``callback_on_step_end`` (ops up to the end of scale ``i`` go to scale ``i``; a pass that runs several
scales at once is counted at the first of them), and the rest after the last scale is ``decode``. ``total`` is the
sum of the scales and the decode. **kernels per dense block**: forward hooks on every block record the kernels of each
call; the figure is the median over the blocks of their last call (for the baseline: each block at the last scale,
dense over every token; block 0 alone launches a few more, per-call work the later blocks reuse).

Usage (``var-accel launches`` runs :func:`main`; so does ``var-accel launches`` in a source checkout)::

    var-accel launches                                  # every method on infinity-2b and hart-0.7b, bf16 autocast
    var-accel launches --models infinity-2b --methods baseline,lazyvar --syncs
    var-accel launches --dtype bfloat16,float32 --json
    var-accel launches --depth 8 --size 512 --hart-scales 12 --methods baseline,fastvar,lazyvar,depthvar,arvar  # ~30 s

Importable API: :class:`LaunchCounter` (a context manager counting anything), :func:`count_generation` (one pipeline
call), :func:`build_launch_pipeline` (the real structures at a tiny width), :func:`count_launches` (a model x method
x dtype grid), :func:`format_table`, :func:`format_syncs`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from diffusers_var_accel.next_scale.capture_check import HOST_COPY_METHODS, SYNC_OPS, UPLOAD_OPS, source_line

#: This file, passed over when a sync's source line is looked for.
_THIS_FILE = frozenset({os.path.abspath(__file__)})

__all__ = [
    "DEFAULT_MODELS",
    "HOST_COPY_METHODS",
    "LaunchConfig",
    "LaunchCounter",
    "NO_KERNEL_OPS",
    "PhaseCounts",
    "SYNC_OPS",
    "UPLOAD_OPS",
    "build_launch_pipeline",
    "count_generation",
    "count_launches",
    "format_block_ops",
    "format_per_scale",
    "format_syncs",
    "format_table",
    "launch_model_names",
    "main",
]

#: ATen ops that launch no kernel (besides views and aliases, found from their schema).
NO_KERNEL_OPS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "empty_permuted",
        "detach",
        "alias",
        "_unsafe_view",
        "set_",
        "resize_",
        "resize_as_",
        "lift",
        "lift_fresh",
        "lift_fresh_copy",
        "_local_scalar_dense",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "is_same_size",
        "_has_compatible_shallow_copy_type",
        "record_stream",
        "nonzero_static",
        "promote_types",
        "result_type",
        "can_cast",  # dtype queries
    }
)

_VIEW_CACHE: Dict[Any, bool] = {}


def _launches_no_kernel(func) -> bool:
    """Views / aliases (a schema return aliasing an input without writing it) and :data:`NO_KERNEL_OPS`."""
    cached = _VIEW_CACHE.get(func)
    if cached is None:
        name = func.overloadpacket.__name__
        view = any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)
        cached = _VIEW_CACHE[func] = view or name in NO_KERNEL_OPS
    return cached


@dataclass
class PhaseCounts:
    """Counts of one phase of a generation (a scale, the decode, ...)."""

    ops: int = 0
    kernels: int = 0
    syncs: int = 0

    def as_dict(self) -> Dict[str, int]:
        return {"ops": self.ops, "kernels": self.kernels, "syncs": self.syncs}


class _DispatchCounter(TorchDispatchMode):
    def __init__(self, owner: "LaunchCounter"):
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        owner = self.owner
        if owner.phase is not None:
            name = func.overloadpacket.__name__
            counts = owner.current_counts()
            counts.ops += 1
            if not _launches_no_kernel(func):
                counts.kernels += 1
                owner.kernel_names[name] += 1
            syncs = SYNC_OPS.get(name, 0)
            if (
                name == "repeat_interleave"
                and kwargs.get("output_size") is None
                and isinstance(args[0] if args else None, torch.Tensor)
                and func._overloadname.startswith("Tensor")
            ):
                syncs = 1
            if name in UPLOAD_OPS:
                owner.record_sync(f"upload ({name})", 1)
            elif syncs:
                owner.record_sync(name, syncs)
        if func.overloadpacket in _WIDENED_OPS and _half_on_cpu(args):
            return _widened(func, args, kwargs)
        return func(*args, **kwargs)


#: The products and convolutions the counter computes in float32 when their half-precision inputs are on a CPU. What
#: is counted is the op as called (one kernel, before this runs); only its arithmetic is widened, as the CPU kernels
#: of these ops accumulate in float32 and round once anyway. Why: a CPU without native bfloat16 instructions (AVX2
#: only) runs a bfloat16 matmul about 200x slower than a float32 one, so counting a bf16 generation would take
#: minutes per call there, for the same count.
_WIDENED_OPS = {
    torch.ops.aten.mm,
    torch.ops.aten.addmm,
    torch.ops.aten.bmm,
    torch.ops.aten.baddbmm,
    torch.ops.aten.convolution,
}
_HALF = (torch.bfloat16, torch.float16)


def _half_on_cpu(args) -> bool:
    return any(isinstance(a, torch.Tensor) and a.dtype in _HALF and a.device.type == "cpu" for a in args)


def _widened(func, args, kwargs):
    dtype = next(a.dtype for a in args if isinstance(a, torch.Tensor) and a.dtype in _HALF)
    wide = [a.float() if isinstance(a, torch.Tensor) and a.dtype in _HALF else a for a in args]
    return func(*wide, **kwargs).to(dtype)


class _FunctionCounter(TorchFunctionMode):
    def __init__(self, owner: "LaunchCounter"):
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.owner.phase is not None and getattr(func, "__name__", None) in HOST_COPY_METHODS:
            self.owner.record_sync(f".{func.__name__}()", 1)
        return func(*args, **(kwargs or {}))


class LaunchCounter:
    """Counts ATen ops, kernel-launching ops and host-device syncs (module docstring: the convention).

    Counting happens only while :attr:`phase` is not ``None``; ``with LaunchCounter() as counter:`` starts in phase
    ``"total"`` (``start_phase=None``: idle until :meth:`set_phase`). Counts are kept per phase
    (:attr:`phases`), syncs per ``(phase, kind, source line)`` (:attr:`sync_sources`). :meth:`mark_block` adds hooks
    recording the kernels of every call of a module.

    Examples:
        ```py
        >>> import torch
        >>> from diffusers_var_accel.lab.bench.launches import LaunchCounter
        >>> with LaunchCounter() as counter:
        ...     x = torch.ones(4)
        ...     y = x.view(2, 2)  # a view: no kernel
        ...     n = (x * 2).sum().item()  # two kernels and one sync
        >>> counter.total().kernels, counter.total().syncs
        (3, 1)
        ```
    """

    def __init__(self, start_phase: Optional[Any] = "total"):
        self.start_phase = start_phase
        self.phase: Optional[Any] = None
        self.phases: Dict[Any, PhaseCounts] = {}
        self.sync_sources: Counter = Counter()  # (phase, kind, where) -> syncs
        self.kernel_names: Counter = Counter()
        self.block_kernels: Dict[str, List[int]] = {}
        self.block_kernel_ops: Dict[str, Dict[str, int]] = {}
        self._modes: Tuple[Any, ...] = ()
        self._hooks: List[Any] = []

    # -- phases ------------------------------------------------------------------------------------------------------
    def set_phase(self, phase: Optional[Any]) -> None:
        """Count what follows into ``phase`` (``None``: stop counting)."""
        self.phase = phase

    def current_counts(self) -> PhaseCounts:
        counts = self.phases.get(self.phase)
        if counts is None:
            counts = self.phases[self.phase] = PhaseCounts()
        return counts

    def record_sync(self, kind: str, n: int) -> None:
        self.current_counts().syncs += n
        self.sync_sources[(self.phase, kind, source_line(_THIS_FILE))] += n

    def total(self, phases: Optional[Sequence[Any]] = None) -> PhaseCounts:
        """The sum over ``phases`` (default: every phase)."""
        out = PhaseCounts()
        for key, counts in self.phases.items():
            if phases is None or key in phases:
                out.ops += counts.ops
                out.kernels += counts.kernels
                out.syncs += counts.syncs
        return out

    def syncs_by_source(self, phases: Optional[Sequence[Any]] = None) -> List[Dict[str, Any]]:
        """``[{"kind", "where", "count"}]`` summed over ``phases`` (default all), most frequent first."""
        merged: Counter = Counter()
        for (phase, kind, where), n in self.sync_sources.items():
            if phases is None or phase in phases:
                merged[(kind, where)] += n
        return [{"kind": kind, "where": where, "count": n} for (kind, where), n in merged.most_common()]

    # -- module hooks ------------------------------------------------------------------------------------------------
    def mark_block(self, module: torch.nn.Module, name: str) -> None:
        """Record the kernels of every call of ``module`` in ``block_kernels[name]``, and the kernel ops (ATen name ->
        count) of its last call in ``block_kernel_ops[name]`` (hooks removed on exit)."""
        starts: List[Tuple[int, Counter]] = []
        calls = self.block_kernels.setdefault(name, [])

        def before(mod, args):
            starts.append((sum(c.kernels for c in self.phases.values()), Counter(self.kernel_names)))

        def after(mod, args, output):
            if starts:
                begin, names = starts.pop()
                if self.phase is not None:
                    calls.append(sum(c.kernels for c in self.phases.values()) - begin)
                    self.block_kernel_ops[name] = dict((self.kernel_names - names).most_common())

        self._hooks += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]

    # -- context -----------------------------------------------------------------------------------------------------
    def __enter__(self) -> "LaunchCounter":
        self._modes = (_FunctionCounter(self), _DispatchCounter(self))
        for mode in self._modes:
            mode.__enter__()
        self.phase = self.start_phase
        return self

    def __exit__(self, *exc) -> None:
        self.phase = None
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        self._modes = ()
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


# ---------------------------------------------------------------------------------------------------------------------
# one generation
# ---------------------------------------------------------------------------------------------------------------------
def count_generation(pipe, acceleration=None, **call_kwargs) -> Dict[str, Any]:
    """Count one ``pipe(...)`` call in the generation window (module docstring), CFG as the call asks.

    Args:
        pipe: an :class:`~diffusers_var_accel.InfinityPipeline` or :class:`~diffusers_var_accel.HARTPipeline`.
        acceleration: a scheduler (``None``: the baseline), passed as ``acceleration=`` for this call only.
        **call_kwargs: the pipeline's arguments (``prompt_embeds``, ``height``, ``generator``, ...);
            ``output_type`` defaults to ``"pt"``; ``callback_on_step_end`` is the counter's own.

    Returns:
        ``{"ops", "kernels", "syncs", "kernels_per_dense_block", "block_kernels_last_call" (per block),
        "dense_block_kernel_ops" (ATen name -> count, in that median block), "per_scale": [{"scale", "ops",
        "kernels", "syncs"}], "decode": {...}, "condition": {...},
        "sync_sources": [{"kind", "where", "count"}], "condition_sync_sources": [...] (``encode_condition``'s,
        outside the window), "kernel_ops": {aten name: count}}``.
    """
    if "callback_on_step_end" in call_kwargs:
        raise ValueError("count_generation sets callback_on_step_end itself (it marks the scales)")
    transformer = pipe.transformer
    num_scales: List[int] = []
    counter = LaunchCounter(start_phase=None)
    encode_condition = transformer.encode_condition

    def counted_encode_condition(*args, **kwargs):
        counter.set_phase("condition")
        out = encode_condition(*args, **kwargs)
        counter.set_phase(0)
        return out

    def on_scale_end(pipeline, scale_index, scale, callback_kwargs):
        num_scales.append(scale_index)
        counter.set_phase(scale_index + 1)
        return {}

    call_kwargs.setdefault("output_type", "pt")
    if hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(disable=True)
    blocks = getattr(transformer, "blocks", None)
    transformer.encode_condition = counted_encode_condition  # instance attribute: this call only
    try:
        with counter:
            for index, block in enumerate(blocks if blocks is not None else ()):
                counter.mark_block(block, f"block{index}")
            with torch.no_grad():
                pipe(acceleration=acceleration, callback_on_step_end=on_scale_end, **call_kwargs)
            counter.set_phase(None)
    finally:
        del transformer.encode_condition
    if "condition" not in counter.phases:
        raise RuntimeError(
            f"{type(pipe).__name__} did not call transformer.encode_condition: the counting window "
            "(which starts when it returns) never opened"
        )
    if not num_scales:
        raise RuntimeError("the pipeline never called callback_on_step_end: no scale was counted")
    n = max(num_scales) + 1
    # the phase opened by the last scale's callback is the decode
    decode = counter.phases.pop(n, PhaseCounts())
    counter.phases["decode"] = decode
    for (phase, kind, where), count in list(counter.sync_sources.items()):
        if phase == n:
            del counter.sync_sources[(phase, kind, where)]
            counter.sync_sources[("decode", kind, where)] += count
    window = list(range(n)) + ["decode"]
    total = counter.total(window)
    last_calls = [calls[-1] for name, calls in counter.block_kernels.items() if calls]
    dense = statistics.median_low(last_calls) if last_calls else None
    dense_block = next((name for name, calls in counter.block_kernels.items() if calls and calls[-1] == dense), None)
    return {
        **total.as_dict(),
        "kernels_per_dense_block": dense,
        "block_kernels_last_call": last_calls,
        "dense_block_kernel_ops": counter.block_kernel_ops.get(dense_block, {}),
        "per_scale": [{"scale": i, **counter.phases.get(i, PhaseCounts()).as_dict()} for i in range(n)],
        "decode": decode.as_dict(),
        "condition": counter.phases.get("condition", PhaseCounts()).as_dict(),
        "sync_sources": counter.syncs_by_source(window),
        "condition_sync_sources": counter.syncs_by_source(["condition"]),
        "kernel_ops": dict(counter.kernel_names.most_common()),
    }


# ---------------------------------------------------------------------------------------------------------------------
# the real structures at a tiny width
# ---------------------------------------------------------------------------------------------------------------------
def _launch_structures() -> Dict[str, Any]:
    """``{model: (family, its launch structures)}`` of every model a registered family builds for the counter."""
    from diffusers_var_accel.lab.families import lab_families

    out: Dict[str, Any] = {}
    for family in lab_families():
        if family.launch_structures:
            structures = family.launch_structure_builder()
            out.update({model: (family, structures) for model in structures.models})
    return out


def _families_structures() -> List[Any]:
    """The registered families' launch structures, in registration order (each once)."""
    from diffusers_var_accel.lab.families import lab_families

    return [family.launch_structure_builder() for family in lab_families() if family.launch_structures]


#: ``--models`` defaults: each family's default real structures (Infinity-2B and HART-0.7B).
DEFAULT_MODELS = tuple(model for structures in _families_structures() for model in structures.default_models)


def launch_model_names() -> List[str]:
    """Every model the counter builds: the defaults first, then the others (``infinity-8b``)."""
    return list(DEFAULT_MODELS) + [m for m in _launch_structures() if m not in DEFAULT_MODELS]


@dataclass(frozen=True)
class LaunchConfig:
    """The structure counted: the real one by default; fewer blocks / a smaller size / fewer HART scales for CI.

    ``width`` (transformer width, ``heads`` heads) and ``vae_channels`` (the decoders' base channels) change no op
    count, only the time the CPU takes. ``depth=None``: the model's real depth. ``size``: Infinity's image side
    (1024: 13 scales; 256: 7). ``hart_scales=None``: HART's 14 scales at 1024x1024; ``k``: its first ``k`` patch
    numbers (the image is 16x the last one); HART's launch structures read and check it (the family's own option,
    ``--hart-scales``, added by its ``add_arguments``).
    """

    depth: Optional[int] = None
    size: int = 1024
    hart_scales: Optional[int] = None
    width: int = 32
    heads: int = 2
    text_channels: int = 32
    text_tokens: int = 32
    vae_channels: int = 32
    batch_size: int = 1
    cfg: bool = True  # False: guidance off (each family's registered no_guidance value)

    def __post_init__(self):
        for name in ("width", "heads", "text_channels", "text_tokens", "batch_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.depth is not None and (not isinstance(self.depth, int) or self.depth < 1):
            raise ValueError(f"depth must be a positive integer or None (the real depth), got {self.depth!r}")
        for structures in _families_structures():  # the families' own options
            structures.check_config(self)
        if self.width % self.heads:
            raise ValueError(f"width {self.width} must be a multiple of heads {self.heads}")
        if self.vae_channels % 32 and self.vae_channels % 24:
            raise ValueError(f"vae_channels must be a multiple of 32 or 24 (GroupNorm), got {self.vae_channels}")


def build_launch_pipeline(model: str, config: LaunchConfig = LaunchConfig(), dtype: torch.dtype = torch.bfloat16):
    """The pipeline of ``model`` (``infinity-2b``, ``hart-0.7b``, ...: :func:`launch_model_names`) at its real
    structure and a tiny width, random weights.

    Everything but the widths comes from the real configuration (the family's launch structures: depth, heads'
    layout, MLP ratio, scale schedule, codebook, text length; HART's 300 context tokens, vocabulary, diffusion head
    depth and steps, tokenizer levels); no text encoder (the counter passes random ``prompt_embeds``). Weights in
    ``dtype`` on the CPU: half precision runs under autocast, as on a GPU.
    """
    from diffusers_var_accel.utils.tiny import randomize_weights_

    structures = _launch_structures()
    if model not in structures:
        raise ValueError(f"unknown model {model!r}; the counter builds {launch_model_names()}")
    family, builder = structures[model]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer, vae = builder.build(model, config)
    generator = torch.Generator().manual_seed(0)
    randomize_weights_(transformer, generator)
    randomize_weights_(vae, generator)
    if dtype != torch.float32:
        from diffusers.utils import logging as diffusers_logging

        verbosity = diffusers_logging.get_verbosity()
        diffusers_logging.set_verbosity_error()  # ModelMixin.to(dtype) warns about an empty list of fp32 modules
        try:
            transformer, vae = transformer.to(dtype), vae.to(dtype)
        finally:
            diffusers_logging.set_verbosity(verbosity)
    return family.pipeline_class()(transformer=transformer.eval(), vae=vae.eval(), text_encoder=None, tokenizer=None)


def real_kv_cache_bytes(pipe, model: str, acceleration, config: LaunchConfig, dtype: torch.dtype) -> int:
    """The bytes the KV cache of one call allocates at ``model``'s real width and depth (``pipe`` is its narrow,
    maybe shallower stand-in: the same schedule and plan), in ``dtype``, for the counted call's size, batch and CFG."""
    _, builder = _launch_structures()[model]
    real = builder.real_config(model)
    per_layer = pipe.kv_cache_bytes(
        acceleration,
        batch_size=config.batch_size,
        cfg=config.cfg,
        kv_channels=int(real["embed_dim"]),
        dtype=dtype,
        **builder.size_options(config),
    ) // len(pipe.transformer.blocks)
    return per_layer * int(real["depth"])


def _call_kwargs(pipe, model: str, config: LaunchConfig) -> Dict[str, Any]:
    from diffusers_var_accel.families import get_model_family

    _, builder = _launch_structures()[model]
    kwargs = builder.call_options(pipe, config, torch.Generator().manual_seed(0))
    if not config.cfg:  # the family's own "no guidance" value; CFG on keeps each pipeline's default scale
        kwargs["guidance_scale"] = get_model_family(pipe.model_family).no_guidance
    kwargs["generator"] = torch.Generator().manual_seed(0)
    return kwargs


def count_launches(
    models: Sequence[str] = DEFAULT_MODELS,
    methods: Optional[Sequence[str]] = None,
    dtypes: Sequence[torch.dtype] = (torch.bfloat16,),
    config: LaunchConfig = LaunchConfig(),
    progress: Optional[Callable[[str], None]] = None,
    warmup: bool = True,
) -> List[Dict[str, Any]]:
    """One record per (model, dtype, method): :func:`count_generation` plus what was counted.

    ``warmup``: count the *second* call of the same size, batch and method (the steady state: what is cached per
    (size, batch, method) — DepthVAR's rank-space depth plans, compiled graphs on a GPU — is built by the first call,
    whose syncs are reported as ``first_call_syncs``); ``False`` counts a single, first call.

    ``methods``: ``baseline`` and the registry's methods by default (:func:`~..schedulers.registry.default_method_specs`),
    each spec loaded with :func:`~..schedulers.specs.load_acceleration` for the model's family (its preset).
    """
    from diffusers_var_accel.schedulers.registry import default_method_specs
    from diffusers_var_accel.schedulers.specs import load_acceleration

    methods = list(methods or default_method_specs())
    records = []
    for model in models:
        for dtype in dtypes:
            pipe = build_launch_pipeline(model, config, dtype)
            family = pipe.model_family
            schedulers = {m: load_acceleration(m, family) for m in methods}  # bad specs fail before any count
            for method in methods:
                first_call_syncs = None
                if progress is not None:
                    progress(
                        f"{model} {str(dtype).replace('torch.', '')} {method}: "
                        + ("warm-up call, then the counted call" if warmup else "the counted call")
                    )
                if warmup:
                    first_call_syncs = count_generation(pipe, schedulers[method], **_call_kwargs(pipe, model, config))[
                        "syncs"
                    ]
                result = count_generation(pipe, schedulers[method], **_call_kwargs(pipe, model, config))
                scales = len(result["per_scale"])
                record = {
                    "model": model,
                    "family": family,
                    "method": method,
                    "dtype": str(dtype).replace("torch.", ""),
                    "depth": len(pipe.transformer.blocks),
                    "num_scales": scales,
                    "batch_size": config.batch_size,
                    "cfg": config.cfg,
                    "width": config.width,
                    "first_call_syncs": first_call_syncs,
                    "kv_cache_bytes": real_kv_cache_bytes(pipe, model, schedulers[method], config, dtype),
                    **result,
                }
                records.append(record)
                if progress is not None:
                    progress(
                        f"{model} {record['dtype']} {method}: {result['kernels']} kernels, {result['syncs']} syncs"
                    )
    return records


# ---------------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------------
def format_table(records: Sequence[Dict[str, Any]]) -> str:
    """A markdown table: one row per (model, dtype, method); ``x fewer`` is the baseline's kernels over the method's."""
    lines = [
        "| model | dtype | method | kernels | x fewer | syncs | syncs (first call) | ATen ops | kernels / dense block "
        "| decode kernels | KV cache GB (real width) |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    base: Dict[Tuple[str, str], int] = {}
    for r in records:
        if r["method"] == "baseline":
            base[(r["model"], r["dtype"])] = r["kernels"]
    for r in records:
        ref = base.get((r["model"], r["dtype"]))
        ratio = f"{ref / r['kernels']:.2f}x" if ref and r["kernels"] else "-"
        block = "-" if r["kernels_per_dense_block"] is None else str(r["kernels_per_dense_block"])
        label = f"{r['model']} ({r['depth']} blocks, {r['num_scales']} scales)"
        first = "-" if r.get("first_call_syncs") is None else f"{r['first_call_syncs']:,}"
        lines.append(
            f"| {label} | {r['dtype']} | {r['method']} | {r['kernels']:,} | {ratio} | {r['syncs']:,} | {first} | {r['ops']:,} | "
            f"{block} | {r['decode']['kernels']:,} | {r['kv_cache_bytes'] / 1e9:.2f} |"
        )
    return "\n".join(lines)


def format_syncs(records: Sequence[Dict[str, Any]]) -> str:
    """Every record's sync sources: count, kind and source line."""
    out = []
    for r in records:
        out.append(f"{r['model']} {r['dtype']} {r['method']}: {r['syncs']} syncs")
        for s in r["sync_sources"]:
            out.append(f"  {s['count']:6d}  {s['kind']:<24} {s['where']}")
        for s in r.get("condition_sync_sources", []):
            out.append(
                f"  ({s['count']:4d}) {s['kind']:<24} {s['where']}   [encode_condition: before the window, not counted]"
            )
    return "\n".join(out)


def format_block_ops(records: Sequence[Dict[str, Any]]) -> str:
    """The kernel ops of every record's dense block (the median block's last call), most frequent first."""
    out = []
    for r in records:
        ops = ", ".join(f"{name} {n}" for name, n in r["dense_block_kernel_ops"].items())
        out.append(
            f"{r['model']} {r['dtype']} {r['method']} ({r['kernels_per_dense_block']} kernels per block): {ops}"
        )
    return "\n".join(out)


def format_per_scale(records: Sequence[Dict[str, Any]]) -> str:
    """Kernels / syncs per scale of every record."""
    out = []
    for r in records:
        cells = " ".join(f"{s['kernels']}/{s['syncs']}" for s in r["per_scale"])
        out.append(
            f"{r['model']} {r['dtype']} {r['method']} (kernels/syncs per scale, then decode): {cells} | "
            f"{r['decode']['kernels']}/{r['decode']['syncs']}"
        )
    return "\n".join(out)


_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def _known_models() -> Tuple[str, ...]:
    """``--models``' allowed names, each family's in registration order (infinity-2b, infinity-8b, hart-0.7b)."""
    return tuple(_launch_structures())


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    """The command line's parser, built without torch (:func:`diffusers_var_accel.lab.counter_parsers.launches_parser`)."""
    from diffusers_var_accel.lab.counter_parsers import launches_parser
    from diffusers_var_accel.lab.families import lab_families

    parser = launches_parser(prog, models=_known_models(), default_models=DEFAULT_MODELS)
    for family in lab_families():  # a family without torch-free options (a plugin's) adds its own here
        if family.launch_structures and family.counter_options is None:
            family.launch_structure_builder().add_arguments(parser)
    return parser


def main(argv: Optional[List[str]] = None, prog: Optional[str] = None) -> int:
    """The command line (``var-accel launches``); bad values: one ``error:`` line on stderr, exit status 2."""
    from diffusers_var_accel.schedulers.registry import default_method_specs
    from diffusers_var_accel.schedulers.specs import split_acceleration_specs

    args = build_parser(prog).parse_args(argv)
    try:
        models = [m.strip() for m in args.models.split(",") if m.strip()]
        known = _known_models()
        bad = [m for m in models if m not in known]
        if bad or not models:
            raise ValueError(f"--models {args.models!r}: unknown {bad or 'empty'}; allowed: {', '.join(known)}")
        dtypes = []
        for name in (d.strip() for d in args.dtype.split(",")):
            if name not in _DTYPES:
                raise ValueError(f"--dtype {name!r}: allowed {', '.join(_DTYPES)}")
            dtypes.append(_DTYPES[name])
        methods = split_acceleration_specs(args.methods) if args.methods else list(default_method_specs())
        if not methods:
            raise ValueError(f"--methods {args.methods!r} names no method")
        family_options = {
            k: v for structures in _families_structures() for k, v in structures.config_options(args).items()
        }
        config = LaunchConfig(
            depth=args.depth, size=args.size, batch_size=args.batch_size, cfg=not args.no_cfg, **family_options
        )
        records = count_launches(
            models,
            methods,
            dtypes,
            config,
            progress=None if args.json else (lambda line: print(line, file=sys.stderr, flush=True)),
            warmup=not args.no_warmup,
        )
    except ValueError as err:
        if args.debug:
            raise
        message = "; ".join(line.strip() for line in str(err).splitlines() if line.strip())
        print(f"error: {message}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"torch": torch.__version__, "config": config.__dict__, "records": records}))
        return 0
    print(
        f"Kernel launches and host syncs per generation (CPU counter, torch {torch.__version__}; batch "
        f"{config.batch_size}, {'no CFG' if args.no_cfg else 'CFG'}, tiny width {config.width}; Infinity "
        f"{config.size}x{config.size})"
    )
    print(format_table(records))
    if args.per_scale:
        print(format_per_scale(records))
    if args.block_ops:
        print(format_block_ops(records))
    if args.syncs:
        print(format_syncs(records))
    return 0


if __name__ == "__main__":  # python -m diffusers_var_accel.lab.bench.launches (the same as var-accel launches)
    sys.exit(main())
