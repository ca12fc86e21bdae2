"""Peak device memory of one Infinity or HART generation, counted at the real structure without any weight.

The models are built on the ``meta`` device from their real configurations (as the FLOP meter builds them) and driven
as the pipeline drives them (:class:`~diffusers_var_accel.lab.bench.flop_meter.GenerationRun`: the text encoder, the
text projection, the next-scale loop with the method's plans and the plan-sized KV cache, the decoder). A
``TorchDispatchMode`` (:class:`MemoryTracker`) follows every storage an op creates until it is freed (a finalizer on
the storage) and keeps, per phase, the most bytes alive at once and what they were at that moment:

* **weights**: the parameters and buffers resident on the device in the phase: every component without offload;
  with ``enable_model_cpu_offload`` those the pipeline's offload sequence keeps there (the one in use, the last of
  the sequence until the call ends, those excluded from offload); with group offload what the pipelines keep on the
  device for the call (the transformers' parameters outside their blocks, the whole tokenizer: every phase) plus the
  largest streamed group of the component in use (a block; a leaf at leaf level), twice when streams prefetch the
  next one; the text encoder as diffusers groups it (``_group_resident``). Quantised linear
  weights count as torchao stores them (int8 weight-only: int8 data, a weight-dtype scale and an int64 zero point
  per output channel; float8 weight-only: float8 data and a float32 scale per output channel), and each quantised
  product counts the transient dequantised weight it reads.
* **kv_cache**: the KV cache buffers the loop allocates (sized from the plan); with ``--kv int8`` its int8 keys and
  values, their scales and slot index (the keys and values read back for each layer's attention are activations).
* **activations**: everything else alive in the text encoding and the loop (text features and their projection,
  ``f_hat``, per-pass tensors).
* **decode_buffers**: what the decoder allocates.

Half precision runs as on a GPU: the loop and the text projection under autocast (the matrix products and
convolutions cast their inputs to the weights' dtype, norms and softmax to float32, both counted as the copies
autocast makes), the text encoder and the decoder in the weights' dtype. Attention is counted as a fused (flash /
memory-efficient) kernel: its output and its float32 log-sum-exp, not the score matrix that the meta device's math
decomposition would build.

**Left out** (add them when sizing a card): the CUDA context (~0.3-0.5 GB), the caching allocator's rounding and
fragmentation, the workspace kernels take for themselves (cuBLAS, cuDNN convolutions), CUDA-graph pools, and host
memory. The sampling step is replaced by teacher tokens (the FLOP meter's convention): its small temporaries
(top-k of the logits) are left out too.

Usage (``var-accel memory``)::

    var-accel memory --model infinity-2b                 # every documented recipe of the model
    var-accel memory --model infinity-2b --accel lazyvar --weights int8 --offload model --tiling
    var-accel memory --model hart-0.7b --batch-size 4 --json rows.json
    var-accel memory --model infinity-8b --accel lazyvar --kv int8   # the int8 KV cache

Each family's part (its models, their structures, offload sequence and low-memory recipe) lives in
``lab/bench/<family>_memory.py``. Importable API: :class:`MemoryTracker` (a context manager counting any code),
:class:`MemorySettings`,
:func:`count_memory` (one setting), :func:`count_recipes`, :data:`RECIPES`, :func:`format_memory_table`.
"""

from __future__ import annotations

import argparse
import json
import sys
import weakref
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from diffusers_var_accel.lab.bench.live_bytes import is_new_storage, storages_alive
from diffusers_var_accel.lab.counter_parsers import KV_FORMS, OFFLOAD_MODES, WEIGHT_FORMS, memory_parser
from diffusers_var_accel.models.group_offload import is_resident

__all__ = [
    "MemorySettings",
    "MemoryTracker",
    "KV_FORMS",
    "OFFLOAD_MODES",
    "PARTS",
    "PHASES",
    "BUDGET_RECIPES",
    "RECIPES",
    "WEIGHT_FORMS",
    "count_memory",
    "profiled_peak_bytes",
    "track_generation",
    "count_recipes",
    "format_memory_table",
    "main",
]


#: The phases of a generation, in order.
PHASES = ("text_encoding", "next_scale_loop", "decode")
#: The parts each phase's peak is split into.
PARTS = ("weights", "kv_cache", "activations", "decode_buffers")
#: ``--weights`` and ``--offload`` choices live with the torch-free parser (lab/counter_parsers.py).

_GIB = 1024**3
_CPU = torch.autograd.DeviceType.CPU
_ATEN = torch.ops.aten
#: Ops autocast runs in the lower precision (CUDA's list, as they reach ATen: ``linear`` / ``matmul`` decompose).
_AUTOCAST_LOW = {_ATEN.mm, _ATEN.addmm, _ATEN.bmm, _ATEN.baddbmm, _ATEN.convolution, _ATEN._convolution}
#: Ops autocast runs in float32 (CUDA's list, the ones these models reach).
_AUTOCAST_FP32 = {
    _ATEN.native_layer_norm,
    _ATEN.native_group_norm,
    _ATEN._softmax,
    _ATEN._log_softmax,
    _ATEN.pow,
    _ATEN.rsqrt,
    _ATEN.exp,
    _ATEN.log,
    _ATEN.reciprocal,
    _ATEN.cumsum,
}


# ---------------------------------------------------------------------------------------------------------------------
# the tracker
# ---------------------------------------------------------------------------------------------------------------------
class _FusedAttention(TorchFunctionMode):
    """Counts ``scaled_dot_product_attention`` on meta tensors as a fused kernel (output + float32 log-sum-exp)."""

    def __init__(self, tracker: "MemoryTracker"):
        super().__init__()
        self.tracker = tracker

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            q, k, v = (*args, *(kwargs.get(n) for n in ("query", "key", "value")[len(args) :]))[:3]
        if func is torch.nn.functional.scaled_dot_product_attention and q.is_meta:
            dtype = self.tracker.autocast_dtype
            if dtype is not None and q.dtype != dtype:
                q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)  # autocast's copies, alive during the kernel
            lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
            out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
            del lse, q, k, v
            return out
        return func(*args, **kwargs)


class MemoryTracker(TorchDispatchMode):
    """The live bytes of the storages the ops inside the block create, per phase, at their peak, by tag.

    Every storage an op returns that existed neither before the block nor earlier in it is counted under the current
    :attr:`tag` until it is freed (a finalizer on the storage, whose Python object lives as long as it). In-place ops
    and views add nothing. :meth:`retag` moves a tensor's bytes to another tag (the KV cache's buffers).
    ``autocast_dtype`` (set it for the spans the pipeline runs under autocast) casts the inputs of the matrix products
    and convolutions to that dtype and those of norms and softmax to float32, as CUDA autocast does, on meta tensors.

    Attributes:
        live (`int`): bytes alive now.
        peak (`int`): the most alive at once.
        phase_peaks (`dict`): per phase, ``{"bytes": peak, "by_tag": {tag: bytes at that moment}}``.

    Examples:
        ```py
        >>> import torch
        >>> from diffusers_var_accel.lab.bench.memory import MemoryTracker
        >>> with MemoryTracker() as tracker:
        ...     x = torch.empty(1024, device="meta")  # 4 KiB
        ...     y = x * 2  # 4 KiB more
        ...     del y
        >>> tracker.peak, tracker.live
        (8192, 4096)
        ```
    """

    def __init__(self, phase: str = "total"):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.phase = phase
        self.tag = phase
        self.autocast_dtype: Optional[torch.dtype] = None
        self.dequantized: Dict[int, int] = {}  # storage id of a quantised weight -> bytes of its dequantised copy
        self.phase_peaks: Dict[str, Dict[str, Any]] = {}
        self._by_tag: Dict[str, int] = defaultdict(int)
        self._seen: Dict[int, Tuple[weakref.finalize, int, str]] = {}
        self._before: Dict[int, weakref.ref] = {}
        self._function_mode = _FusedAttention(self)

    # -- phases and tags ---------------------------------------------------------------------------------------------
    def set_phase(self, phase: str, tag: Optional[str] = None) -> None:
        """Count what follows into ``phase`` (new storages tagged ``tag``, default the phase)."""
        self.phase, self.tag = phase, tag or phase
        self._note_peak()

    def retag(self, tensor: torch.Tensor, tag: str) -> None:
        """Count ``tensor``'s storage (if counted) under ``tag`` from now on."""
        key = id(tensor.untyped_storage())
        entry = self._seen.get(key)
        if entry is not None:
            finalizer, nbytes, old = entry
            self._by_tag[old] -= nbytes
            self._by_tag[tag] += nbytes
            self._seen[key] = (finalizer, nbytes, tag)

    def _note_peak(self) -> None:
        self.peak = max(self.peak, self.live)
        record = self.phase_peaks.get(self.phase)
        if record is None or self.live > record["bytes"]:
            self.phase_peaks[self.phase] = {"bytes": self.live, "by_tag": {k: v for k, v in self._by_tag.items() if v}}

    # -- counting ----------------------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        temporaries = []
        packet = func.overloadpacket
        if self.autocast_dtype is not None and (packet in _AUTOCAST_LOW or packet in _AUTOCAST_FP32):
            dtype = self.autocast_dtype if packet in _AUTOCAST_LOW else torch.float32
            cast = [isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != dtype for a in args]
            args = tuple(a.to(dtype) if c else a for a, c in zip(args, cast))
            temporaries += [a for a, c in zip(args, cast) if c]  # autocast's copies, alive during the op
        if self.dequantized and packet in _AUTOCAST_LOW:
            for a in args:  # a weight-only quantised product reads its weight dequantised
                extra = self.dequantized.get(id(a.untyped_storage())) if isinstance(a, torch.Tensor) else None
                if extra:
                    temporaries.append(torch.empty(extra, dtype=torch.uint8, device=a.device))
        for t in temporaries:  # made inside this handler, where the mode does not see them
            self._count(t)
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._count(t)
        del temporaries, args
        return out

    def _count(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        if not is_new_storage(storage, self._seen, self._before):
            return
        key = id(storage)
        nbytes = storage.nbytes()
        self.live += nbytes
        self._by_tag[self.tag] += nbytes
        self._seen[key] = (weakref.finalize(storage, self._free, key), nbytes, self.tag)
        self._note_peak()

    def _free(self, key: int) -> None:
        entry = self._seen.pop(key, None)
        if entry is not None:
            self.live -= entry[1]
            self._by_tag[entry[2]] -= entry[1]

    def __enter__(self) -> "MemoryTracker":
        self._before = storages_alive(include_meta=True)  # meta storages count here: the meter's structure
        self._function_mode.__enter__()
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self._function_mode.__exit__(*exc)
        for finalizer, _, _ in list(self._seen.values()):
            finalizer.detach()
        self._seen.clear()
        self._before = {}


# ---------------------------------------------------------------------------------------------------------------------
# settings and the models
# ---------------------------------------------------------------------------------------------------------------------
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class MemorySettings:
    """One setting of the meter (a row of its table).

    Args:
        model: ``infinity-2b``, ``infinity-8b`` or ``hart-0.7b``.
        accel: an acceleration spec (``None``: the baseline), as ``pipe.enable_acceleration`` takes it.
        height: the image height (HART: 1024 only).
        width: the image width (HART: 1024 only).
        batch_size: images per call.
        cfg: classifier-free guidance (the unconditional rows run too).
        dtype: the weights' dtype (``bfloat16``, ``float16``, ``float32``).
        weights: linear weights of the transformer and text encoder as stored (:data:`WEIGHT_FORMS`).
        offload: one of :data:`OFFLOAD_MODES`.
        streams: group offload prefetches the next group (one more group resident).
        tiling: ``pipe.vae.enable_tiling()``.
        kv: the KV cache's storage (:data:`KV_FORMS`): ``"none"`` (the attention's dtype) or ``"int8"``.
        text_tokens: tokens per prompt through the text encoder (default: the model's; Infinity 32, HART 450).
    """

    model: str
    accel: Optional[str] = None
    height: int = 1024
    width: int = 1024
    batch_size: int = 1
    cfg: bool = True
    dtype: str = "bfloat16"
    weights: str = "none"
    offload: str = "none"
    streams: bool = False
    tiling: bool = False
    text_tokens: Optional[int] = None
    kv: str = "none"

    @property
    def kv_cache_dtype(self) -> Optional[str]:
        """``kv`` as the loop's ``kv_cache_dtype`` (``None``: the attention's dtype)."""
        return None if self.kv == "none" else self.kv

    def check(self) -> None:
        models = _family_memory()
        if self.model not in models:
            raise ValueError(f"unknown model {self.model!r}; the memory meter knows {', '.join(models)}")
        for name, value, allowed in (
            ("dtype", self.dtype, tuple(_DTYPES)),
            ("weights", self.weights, WEIGHT_FORMS),
            ("offload", self.offload, OFFLOAD_MODES),
            ("kv", self.kv, KV_FORMS),
        ):
            if value not in allowed:
                raise ValueError(f"{name} {value!r} is not one of {', '.join(allowed)}")
        for name in ("batch_size", "height", "width") + (("text_tokens",) if self.text_tokens is not None else ()):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.streams and not self.offload.startswith("group"):
            raise ValueError(f"streams=True applies to group offload only, not offload={self.offload!r}")

    def label(self) -> str:
        """A short name of the setting (the table's first column)."""
        parts = [self.accel or "baseline", self.dtype]
        if self.weights != "none":
            parts.append(f"{self.weights} weights")
        if self.offload != "none":
            parts.append(f"{self.offload} offload" + (" +streams" if self.streams else ""))
        if self.tiling:
            parts.append("tiled decode")
        if self.kv != "none":
            parts.append(f"{self.kv} KV")
        return ", ".join(parts)


@dataclass
class _Components:
    text_encoder: torch.nn.Module
    text_input: Callable[[int], Dict[str, torch.Tensor]]  # batch -> encoder kwargs
    transformer: torch.nn.Module
    vae: torch.nn.Module
    run: Callable[..., Any]  # (transformer, vae, settings, scheduler) -> GenerationRun
    default_text_tokens: int
    #: per phase, the components on the device under the pipeline's model offload (``model_cpu_offload_seq``: the
    #: one in use, the last of the sequence until the call ends, and those excluded from offload)
    offloaded_resident: Dict[str, Tuple[str, ...]]


def _family_memory() -> Dict[str, Tuple[str, Any]]:
    """``{model: (family name, its memory module)}``: each registered family's ``lab/bench/<family>_memory.py``
    (``MODELS``, ``memory_parts(model)``, ``BUDGET_RECIPES``), in registration order."""
    import importlib

    from diffusers_var_accel.lab.families import lab_families

    out: Dict[str, Tuple[str, Any]] = {}
    for family in lab_families():
        try:
            module = importlib.import_module(f"diffusers_var_accel.lab.bench.{family.name}_memory")
        except ModuleNotFoundError:
            continue
        out.update({model: (family.name, module) for model in module.MODELS})
    return out


# ---------------------------------------------------------------------------------------------------------------------
# weights resident
# ---------------------------------------------------------------------------------------------------------------------
def _linear_weight_bytes(linear: torch.nn.Linear, form: str, dtype: torch.dtype) -> int:
    """Bytes of a linear weight as torchao stores it (see the module docstring)."""
    out_features, numel = linear.weight.shape[0], linear.weight.numel()
    if form == "int8":
        return numel + out_features * (torch.empty((), dtype=dtype).element_size() + 8)
    if form == "float8":
        return numel + out_features * 4
    return numel * torch.empty((), dtype=dtype).element_size()


def _module_bytes(module: torch.nn.Module, form: str, dtype: torch.dtype, recurse: bool = True) -> int:
    """Parameters and buffers of ``module`` (``recurse=False``: its own only), linear weights in ``form``."""
    total = 0
    modules = module.modules() if recurse else [module]
    for m in modules:
        for name, p in list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False)):
            if p is None:
                continue
            if isinstance(m, torch.nn.Linear) and name == "weight":
                total += _linear_weight_bytes(m, form, dtype)
            else:
                total += p.numel() * p.element_size()
    return total


def _group_resident(
    module: torch.nn.Module, form: str, dtype: torch.dtype, level: str, streams: bool, in_use: bool
) -> int:
    """The most bytes of ``module`` on the device at once under diffusers' group offload as the pipelines apply it
    (``models/group_offload.py``), one block per group at block level.

    A model that declares its streamed modules (``_group_offload_streamed_modules``: the transformers' blocks, none
    for the tokenizers) keeps every other tensor on the device for the whole call, in every phase; in the phases that
    use it, one streamed group more (a block, or the largest streamed leaf at leaf level). Any other model (the text
    encoders) is grouped as diffusers does it: its direct ``ModuleList`` / ``Sequential`` children stream block by
    block and the rest is one group onloaded for its forward (block level), or one leaf at a time (leaf level); none
    of it stays outside the phases that use it. Streams prefetch one more streamed group."""
    groups = 2 if streams else 1
    streamed = getattr(module, "_group_offload_streamed_modules", None)
    declared = streamed is not None
    if not declared:
        lists = (torch.nn.ModuleList, torch.nn.Sequential)
        streamed = tuple(name for name, child in module.named_children() if isinstance(child, lists))
    # a streamed block moves whole at block level; at leaf level the tensors it reads outside their layer stay
    kept = getattr(module, "_group_offload_resident_in_streamed", ()) if declared and level == "leaf" else ()

    def tensor_bytes(owner: torch.nn.Module, name: str, tensor: torch.Tensor) -> int:
        if isinstance(owner, torch.nn.Linear) and name == "weight":
            return _linear_weight_bytes(owner, form, dtype)
        return tensor.numel() * tensor.element_size()

    resident, streamed_leaves = 0, []
    for prefix, owner in module.named_modules():
        own = [
            (f"{prefix}.{n}" if prefix else n, tensor_bytes(owner, n, p))
            for n, p in (*owner.named_parameters(recurse=False), *owner.named_buffers(recurse=False))
            if p is not None
        ]
        resident += sum(b for n, b in own if is_resident(n, streamed, kept))
        streamed_leaves.append(sum(b for n, b in own if not is_resident(n, streamed, kept)))
    if level == "leaf":
        largest = max(streamed_leaves, default=0)
        if not declared:  # every leaf moves on its own: the largest one, resident or streamed, is what is on
            leaves = [_module_bytes(m, form, dtype, recurse=False) for m in module.modules()]
            return groups * max(leaves, default=0) if in_use else 0
    else:
        blocks = [child for name in streamed for child in module.get_submodule(name).children()]
        largest = max((_module_bytes(b, form, dtype) for b in blocks), default=0)
    if not declared:
        return resident + groups * largest if in_use else 0
    return resident + (groups * largest if in_use else 0)


def _resident_weights(components: Dict[str, torch.nn.Module], used: Sequence[str], s: MemorySettings) -> int:
    dtype = _DTYPES[s.dtype]
    form = {name: (s.weights if name in ("transformer", "text_encoder") else "none") for name in components}
    if s.offload == "none":
        return sum(_module_bytes(m, form[n], dtype) for n, m in components.items())
    if s.offload == "model":
        return sum(_module_bytes(components[n], form[n], dtype) for n in used)
    level = s.offload.split("-")[1]
    return sum(_group_resident(m, form[n], dtype, level, s.streams, n in used) for n, m in components.items())


# ---------------------------------------------------------------------------------------------------------------------
# one setting
# ---------------------------------------------------------------------------------------------------------------------
class _AsOnAGPU:
    """For the count only: the KV cache's buffers are tagged ``kv_cache`` (``ScaleKVCache._write`` wrapped), and the
    library's meta-device shortcuts for a FLOP count (which keep an op's own dtype where autocast on a device would
    write q, k and the AdaLN output in the autocast dtype) follow the tracker's emulated autocast instead."""

    def __init__(self, tracker: MemoryTracker):
        self.tracker = tracker
        self._saved: List[Tuple[Any, str, Any]] = []

    def _patch(self, owner, name, value) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def __enter__(self) -> "_AsOnAGPU":
        from diffusers_var_accel.models import attention_processor, transformer_infinity
        from diffusers_var_accel.next_scale.cache import ScaleKVCache
        from diffusers_var_accel.next_scale.quantized_cache import Int8ScaleKVCache

        tracker = self.tracker
        attention_dtype = attention_processor.VARAttnProcessor._attention_dtype

        def tagged(write):
            def tagged_write(cache, key, value, layer_idx, *args, **kwargs):
                out = write(cache, key, value, layer_idx, *args, **kwargs)
                for buffer in cache.layer_buffers(layer_idx):
                    tracker.retag(buffer, "kv_cache")
                return out

            return tagged_write

        def fused_cast_out(shape, result_dtype, dtype, device):
            if dtype is None or dtype == result_dtype:
                return None
            return torch.empty(shape, dtype=dtype, device=device)

        def gpu_attention_dtype(processor, device):
            return tracker.autocast_dtype if device.type == "meta" else attention_dtype(processor, device)

        for cache_cls in (ScaleKVCache, Int8ScaleKVCache):
            self._patch(cache_cls, "_write", tagged(cache_cls._write))
        self._patch(attention_processor.VARAttnProcessor, "_attention_dtype", gpu_attention_dtype)
        for module in (attention_processor, transformer_infinity):
            self._patch(module, "fused_cast_out", fused_cast_out)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, value in reversed(self._saved):
            setattr(owner, name, value)
        self._saved = []


@torch.no_grad()
def track_generation(
    run: Any,
    text_encoder: Optional[torch.nn.Module] = None,
    text_inputs: Optional[Dict[str, torch.Tensor]] = None,
    autocast_dtype: Optional[torch.dtype] = None,
    dequantized: Optional[Sequence[Tuple[torch.Tensor, int]]] = None,
) -> MemoryTracker:
    """Run one generation (a :class:`~diffusers_var_accel.lab.bench.flop_meter.GenerationRun`, on meta or real
    tensors) under a :class:`MemoryTracker` and return it: per phase (:data:`PHASES`) the peak of the bytes the
    generation allocated (weights and inputs that existed before are not counted), by tag (``activations``,
    ``kv_cache``, ``decode_buffers``; the text encoder's own under ``text_encoding``, the text projection opens the loop),
    and
    ``kv_cache_bytes`` (the largest the KV cache held).

    ``text_encoder(**text_inputs)`` runs first when given (its ``last_hidden_state`` is kept for the call, as the
    pipeline keeps the prompt embeddings). ``autocast_dtype``: meta tensors only: the text projection and the loop run
    as under autocast in that dtype (the decoder runs outside it, as in the pipelines). ``dequantized``: ``(weight,
    bytes of its dequantised copy)`` of each weight-only quantised weight, allocated for each product that reads it.
    """
    tracker = MemoryTracker(phase="text_encoding")
    storages = [(weight.untyped_storage(), nbytes) for weight, nbytes in dequantized or ()]
    tracker.dequantized = {id(storage): nbytes for storage, nbytes in storages}  # storages held: their ids stay
    tracker.kv_cache_bytes = 0
    with tracker, _AsOnAGPU(tracker):
        features = None if text_encoder is None else text_encoder(**text_inputs).last_hidden_state
        tracker.set_phase("next_scale_loop", tag="activations")  # the transformer's text projection opens it
        tracker.autocast_dtype = autocast_dtype
        condition = run.encode()

        def on_scale_end(si, state):
            tracker.kv_cache_bytes = max(tracker.kv_cache_bytes, state.kv_cache.nbytes)

        state = run.loop(condition, on_scale_end)
        latents = SimpleNamespace(f_hat=state.f_hat)
        del state  # as the pipelines do: the KV cache is freed before the decoder runs
        tracker.autocast_dtype = None
        tracker.set_phase("decode", tag="decode_buffers")
        image = run.decode(latents)
        del image, latents, condition, features
    return tracker


@torch.no_grad()
def count_memory(settings: MemorySettings) -> Dict[str, Any]:
    """The counted peak of one generation with ``settings`` (module docstring: what is counted and left out).

    Returns:
        ``dict``: the settings, ``label``, ``peak_bytes`` (the largest phase peak), ``peak_phase``, ``phases``:
        ``{phase: {"peak_bytes", "weights", "kv_cache", "activations", "decode_buffers"}}`` (bytes at that phase's
        peak), and ``kv_cache_bytes`` (the cache the plan sizes).
    """
    from diffusers_var_accel.schedulers.specs import load_acceleration

    settings.check()
    dtype = _DTYPES[settings.dtype]
    family, module = _family_memory()[settings.model]
    parts = module.memory_parts(settings.model)
    from diffusers.utils import logging as diffusers_logging

    verbosity = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()  # ModelMixin.to(dtype) warns about an empty list of fp32 modules
    try:
        transformer, vae, text_encoder = (m.to(dtype) for m in (parts.transformer, parts.vae, parts.text_encoder))
    finally:
        diffusers_logging.set_verbosity(verbosity)
    if settings.tiling:
        vae.enable_tiling()
    components = {"text_encoder": text_encoder, "transformer": transformer, "vae": vae}
    scheduler = load_acceleration(settings.accel, family)
    run = parts.run(transformer, vae, settings, scheduler)
    tokens = settings.text_tokens or parts.default_text_tokens
    dequantized = []
    if settings.weights != "none":
        low = torch.empty((), dtype=dtype).element_size()
        for module in (transformer, text_encoder):
            for m in module.modules():
                if isinstance(m, torch.nn.Linear):
                    dequantized.append((m.weight, m.weight.numel() * low))
    tracker = track_generation(
        run,
        text_encoder,
        parts.text_input(tokens, settings.batch_size),
        autocast_dtype=dtype if dtype != torch.float32 else None,
        dequantized=dequantized,
    )
    used = parts.offloaded_resident
    phases = {}
    for phase in PHASES:
        record = tracker.phase_peaks.get(phase, {"bytes": 0, "by_tag": {}})
        by_tag = record["by_tag"]
        weights = _resident_weights(components, used[phase], settings)
        row = {
            "weights": weights,
            "kv_cache": by_tag.get("kv_cache", 0),
            "decode_buffers": by_tag.get("decode_buffers", 0),
        }
        row["activations"] = record["bytes"] - row["kv_cache"] - row["decode_buffers"]
        row["peak_bytes"] = weights + record["bytes"]
        phases[phase] = row
    peak_phase = max(PHASES, key=lambda p: phases[p]["peak_bytes"])
    return {
        **asdict(settings),
        "label": settings.label(),
        "peak_bytes": phases[peak_phase]["peak_bytes"],
        "peak_phase": peak_phase,
        "kv_cache_bytes": tracker.kv_cache_bytes,
        "phases": phases,
    }


def profiled_peak_bytes(fn: Callable[[], Any]) -> int:
    """The peak of the CPU bytes ``fn()`` allocates on top of what existed, from the profiler's memory events
    (``torch.profiler`` with ``profile_memory=True``): what the meter is checked against."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.device_type() == _CPU]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):  # a stable sort: equal times keep the recorded order
        live += event.nbytes()
        peak = max(peak, live)
    return peak


# ---------------------------------------------------------------------------------------------------------------------
# recipes
# ---------------------------------------------------------------------------------------------------------------------
def _recipes() -> Dict[str, List[MemorySettings]]:
    methods = ("fastvar", "lazyvar", "depthvar", "arvar", "stagevar")
    out = {}
    for model, budget in _budget_recipes().items():
        base = MemorySettings(model)
        out[model] = [
            base,
            *(replace(base, accel=m) for m in methods),
            replace(base, accel="lazyvar", weights="int8"),
            replace(base, accel="lazyvar", weights="float8"),
            replace(base, accel="lazyvar", offload="model"),
            replace(base, accel="lazyvar", offload="group-block", streams=True),
            replace(base, accel="lazyvar", tiling=True),
            budget,
        ]
    return out


def _budget_recipes() -> Dict[str, MemorySettings]:
    return {
        model: MemorySettings(model, **module.BUDGET_RECIPES[model]) for model, (_, module) in _family_memory().items()
    }


#: The low-memory recipe of each model (docs/memory.md, from the families' ``BUDGET_RECIPES``): Infinity-2B within
#: 8 GB and HART-0.7B within 6 GB with LazyVAR, model offload and tiled decoding; Infinity-8B within 16 GB needs int8
#: weights on top.
BUDGET_RECIPES: Dict[str, MemorySettings] = _budget_recipes()

#: Every documented recipe per model (the rows ``var-accel memory --model M`` prints without recipe flags): the bf16
#: baseline, each method's preset, LazyVAR with int8 / float8 weights, model offload, group offload (block level,
#: streams) and tiled decode, and the model's low-memory recipe (:data:`BUDGET_RECIPES`).
RECIPES: Dict[str, List[MemorySettings]] = _recipes()


def count_recipes(model: str, batch_size: int = 1, progress: Optional[Callable[[str], None]] = None) -> List[Dict]:
    """:func:`count_memory` of every row of :data:`RECIPES` for ``model`` at ``batch_size``."""
    if model not in RECIPES:
        raise ValueError(f"unknown model {model!r}; the memory meter knows {', '.join(RECIPES)}")
    out = []
    for s in RECIPES[model]:
        s = replace(s, batch_size=batch_size)
        if progress is not None:
            progress(f"{model}: {s.label()}")
        out.append(count_memory(s))
    return out


def format_memory_table(rows: Sequence[Dict[str, Any]]) -> str:
    """A markdown table, one row per setting: the peak (GiB) and its phase, then each phase's peak split by part."""
    head = "| model | setting | batch | peak GiB | at | text enc. | loop: weights + KV + act. | decode: weights + act. + buffers |"
    lines = [head, "| --- | --- | ---: | ---: | --- | ---: | --- | --- |"]
    g = lambda b: f"{b / _GIB:.2f}"  # noqa: E731
    for r in rows:
        t, l, d = (r["phases"][p] for p in PHASES)
        lines.append(
            f"| {r['model']} | {r['label']} | {r['batch_size']} | {g(r['peak_bytes'])} | {r['peak_phase']} | "
            f"{g(t['peak_bytes'])} | {g(l['peak_bytes'])} = {g(l['weights'])} + {g(l['kv_cache'])} + "
            f"{g(l['activations'])} | {g(d['peak_bytes'])} = {g(d['weights'])} + {g(d['activations'] + d['kv_cache'])}"
            f" + {g(d['decode_buffers'])} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------------------------------
_RECIPE_FLAGS = ("accel", "weights", "offload", "streams", "tiling", "dtype", "kv")


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    """The command line's parser, built without torch (:func:`diffusers_var_accel.lab.counter_parsers.memory_parser`)."""
    return memory_parser(prog, models=tuple(_family_memory()))


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """``var-accel memory``: one setting's row, or (no recipe flag) every documented recipe of ``--model``."""
    args = build_parser(prog).parse_args(argv)
    try:
        if all(getattr(args, f) is None for f in _RECIPE_FLAGS):
            rows = count_recipes(args.model, args.batch_size, progress=lambda m: print(m, file=sys.stderr))
        else:
            settings = MemorySettings(
                args.model,
                accel=args.accel,
                height=args.height,
                width=args.width,
                batch_size=args.batch_size,
                cfg=not args.no_cfg,
                dtype=args.dtype or "bfloat16",
                weights=args.weights or "none",
                offload=args.offload or "none",
                streams=bool(args.streams),
                tiling=bool(args.tiling),
                text_tokens=args.text_tokens,
                kv=args.kv or "none",
            )
            rows = [count_memory(settings)]
    except ValueError as err:
        if args.debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        f"Counted peak device memory of one generation ({torch.__version__}, meta device; left out: CUDA context, "
        "allocator fragmentation, kernel workspaces)"
    )
    print(format_memory_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":  # python -m diffusers_var_accel.lab.bench.memory
    sys.exit(main())
