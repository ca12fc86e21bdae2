"""Per-call instruments of the benchmark: a per-scale clock / FLOP meter and a per-call peak-memory meter.

:class:`CallProbe` marks, during one pipeline call, the start and end of every text-encoder forward (module hooks on
``pipe.text_encoder``) and the end of every scale (the pipeline's ``callback_on_step_end``), with the time
(CUDA-synchronised) and, when a ``FlopCounterMode`` is running, its FLOP total. :meth:`CallProbe.breakdown` turns
the marks into segments: ``text_encoder``, ``scales`` (one value per scale index: from the previous mark to that
scale's end, so scale 0 includes the transformer's condition encoding, a grouped pass is charged to the first scale
of its group and a skipped scale costs ~0), ``decode`` (last scale to the end of the call: VAE / tokenizer decode and
post-processing) and ``other`` (input checks before the text encoder).

:class:`PeakMemory` measures one call's peak memory: ``torch.cuda.max_memory_allocated`` on CUDA (reset before the
call); on a Linux CPU the process's peak resident set size (``VmHWM``) after resetting it with
``/proc/self/clear_refs`` (Linux >= 4.0), so the value belongs to that call, not to the process's lifetime.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

_PROC_STATUS = Path("/proc/self/status")
_PROC_CLEAR_REFS = Path("/proc/self/clear_refs")


def synchronize(device: torch.device) -> None:
    """Wait for queued CUDA work (a no-op elsewhere), so a clock reading covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_flop_counter():
    """A silent ``FlopCounterMode`` that also counts PyTorch's CPU flash attention (which has no formula in torch),
    like the CUDA attention kernels: QK^T and PV, 2 FLOPs per multiply-accumulate."""
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    def cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query_shape, key_shape, value_shape)

    mapping = {}
    if hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu] = cpu_sdpa_flops
    return FlopCounterMode(display=False, custom_mapping=mapping)


class CallProbe:
    """Marks of one pipeline call (see the module docstring). Use as a context manager around the call::

    with CallProbe(pipe, device) as probe:
        pipe(prompt, callback_on_step_end=probe.on_scale_end, ...)
    parts = probe.breakdown()
    """

    def __init__(self, pipe, device: torch.device, counter=None):
        self.pipe, self.device, self.counter = pipe, device, counter
        self.marks: List[Tuple[str, Optional[int], float, int]] = []
        self.scale_shapes: Dict[int, Tuple[int, ...]] = {}
        self._handles: List[Any] = []

    def mark(self, kind: str, scale_index: Optional[int] = None) -> None:
        synchronize(self.device)
        flops = int(self.counter.get_total_flops()) if self.counter is not None else 0
        self.marks.append((kind, scale_index, time.perf_counter(), flops))

    def on_scale_end(self, pipe, scale_index: int, scale, callback_kwargs: Dict[str, Any]) -> Dict[str, Any]:
        """The pipeline's ``callback_on_step_end``: marks the end of scale ``scale_index``; changes nothing."""
        self.scale_shapes[int(scale_index)] = tuple(int(s) for s in scale)
        self.mark("scale", int(scale_index))
        return {}

    def __enter__(self) -> "CallProbe":
        encoder = getattr(self.pipe, "text_encoder", None)
        if isinstance(encoder, torch.nn.Module):
            self._handles.append(encoder.register_forward_pre_hook(lambda module, args: self.mark("text_start")))
            self._handles.append(encoder.register_forward_hook(lambda module, args, output: self.mark("text_end")))
        self.mark("start")
        return self

    def __exit__(self, *exc) -> None:
        self.mark("end")
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def breakdown(self) -> Dict[str, Any]:
        """Seconds and FLOPs per segment: ``text_encoder``, ``scales`` (lists by scale index), ``decode``, ``other``."""
        num_scales = max(self.scale_shapes) + 1 if self.scale_shapes else 0
        seconds = {"text_encoder": 0.0, "decode": 0.0, "other": 0.0, "scales": [0.0] * num_scales}
        flops = {"text_encoder": 0, "decode": 0, "other": 0, "scales": [0] * num_scales}
        for (_, _, t0, f0), (kind, si, t1, f1) in zip(self.marks, self.marks[1:]):
            if kind == "scale":
                seconds["scales"][si] += t1 - t0
                flops["scales"][si] += f1 - f0
            else:
                key = {"text_end": "text_encoder", "end": "decode"}.get(kind, "other")
                seconds[key] += t1 - t0
                flops[key] += f1 - f0
        return {
            "seconds": seconds,
            "flops": flops,
            "scale_shapes": [list(self.scale_shapes[i]) for i in sorted(self.scale_shapes)],
        }


def _status_kib(field: str) -> int:
    for line in _PROC_STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


class PeakMemory:
    """Peak memory of single calls (see the module docstring); ``kind`` is ``"cuda_max_memory_allocated"``,
    ``"peak_rss"`` or ``None`` (then ``unavailable`` says why and :meth:`stop` returns ``(None, None)``)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.kind: Optional[str] = None
        self.unavailable: Optional[str] = None
        self._base = 0
        if device.type == "cuda":
            self.kind = "cuda_max_memory_allocated"
        elif device.type == "cpu":
            try:
                _PROC_CLEAR_REFS.write_text("5")
                _status_kib("VmHWM")
                self.kind = "peak_rss"
            except (OSError, KeyError) as err:
                self.unavailable = (
                    f"per-call peak RSS needs Linux's /proc/self/clear_refs and VmHWM ({err}); the process's "
                    "lifetime maximum would not belong to one method, so no value is reported"
                )
        else:
            self.unavailable = f"no peak-memory reading for device type {device.type!r}"

    def start(self) -> None:
        if self.kind == "cuda_max_memory_allocated":
            synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        elif self.kind == "peak_rss":
            _PROC_CLEAR_REFS.write_text("5")  # resets VmHWM to the current RSS
            self._base = _status_kib("VmRSS") * 1024

    def stop(self) -> Tuple[Optional[int], Optional[int]]:
        """``(peak bytes during the call, peak minus the memory in use when the call started)``."""
        if self.kind == "cuda_max_memory_allocated":
            synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        elif self.kind == "peak_rss":
            peak = _status_kib("VmHWM") * 1024
        else:
            return None, None
        return int(peak), int(max(peak - self._base, 0))


def count_call_flops(pipe, prompt: str, **kwargs) -> int:
    """FLOPs (2 x multiply-accumulates) of one real pipeline call, counted by ``torch.utils.flop_counter`` with the
    counter ``var-accel bench`` uses (:func:`make_flop_counter`: PyTorch's CPU attention kernel, which
    has no formula in torch, is counted like the CUDA ones)."""
    counter = make_flop_counter()
    with counter:
        pipe(prompt, output_type="pt", **kwargs)
    return int(counter.get_total_flops())
