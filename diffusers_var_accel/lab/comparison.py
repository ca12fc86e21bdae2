"""The baseline and acceleration methods on one prompt and seed, side by side: images, time, FLOPs, fidelity.

What ``var-accel serve`` shows per request (and what :func:`compare_methods` returns to any caller). Time is
measured as ``var-accel bench`` measures it: every method runs once untimed first (its first-call work: allocations,
per-size plans, lazy imports), then ``repeats`` rounds in which every method runs once, interleaved, so that a slow
drift of the machine hits every method alike; the median and the spread (``(max - min) / median``) of each method's
times are reported, with a note when the spread is large. The untimed call is the FLOP count: one real call under
``var-accel bench``'s counter (:func:`~.bench.probe.count_call_flops`, text encoder and decoder included). Every call of a
method uses the same seed, so its image is the same in every round; PSNR and SSIM are against the baseline image.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from diffusers_var_accel.lab.bench.pairs import UNSTEADY_SPREAD, paired_speedup  # noqa: F401  (used here, and from here)

#: A spread ``(max - min) / median`` of a method's timed calls above this gets a note: its speed-up is noisy.
LARGE_SPREAD = 0.25


@dataclass
class MethodResult:
    """One method's image and numbers (:func:`compare_methods`)."""

    spec: str
    image: torch.Tensor  # (1, 3, H, W) in [0, 1]
    seconds: List[float]
    flops: int
    speedup: float = 1.0  # the median of the per-round ratios baseline / method (:func:`paired_speedup`)
    speedup_spread: float = 0.0  # their (max - min) / median
    flops_ratio: float = 1.0
    psnr: float = float("inf")
    ssim: float = 1.0
    # ``pipe.acceleration_summary()`` read right after the method's last timed call: what its passes computed
    summary: Optional[Dict[str, Any]] = None

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds)

    @property
    def unsteady(self) -> bool:
        """Whether the per-round speed-ups spread by more than :data:`UNSTEADY_SPREAD`."""
        return self.speedup_spread > UNSTEADY_SPREAD

    @property
    def spread(self) -> float:
        """``(max - min) / median`` of the timed calls (0 with one call)."""
        return time_spread(self.seconds)


def time_spread(seconds: Sequence[float]) -> float:
    """``(max - min) / median`` of timed calls (0 when the median is 0)."""
    median = statistics.median(seconds)
    return (max(seconds) - min(seconds)) / median if median > 0 else 0.0


def time_interleaved(
    generate: Callable[[str, int], Any],
    methods: Sequence[str],
    num_items: int,
    repeats: int = 1,
    clock: Optional[Callable[[], float]] = None,
    on_call: Optional[Callable[[], None]] = None,
) -> Tuple[Dict[str, List[float]], Dict[str, List[Any]]]:
    """Time ``generate(method, item)`` in rounds: per (item, repeat), every method once, back to back on the same
    item, the baseline (``methods[0]``) first; ``clock`` defaults to ``time.perf_counter``. Returns each method's seconds per round (in round order, so that
    ``seconds[m][k]`` and ``seconds[methods[0]][k]`` are a pair) and the last output per (method, item)."""
    clock = clock if clock is not None else time.perf_counter  # looked up at the call (tests replace it)
    seconds: Dict[str, List[float]] = {m: [] for m in methods}
    outputs: Dict[str, List[Any]] = {m: [None] * num_items for m in methods}
    for item in range(num_items):
        for _ in range(repeats):
            for m in methods:
                start = clock()
                outputs[m][item] = generate(m, item)
                seconds[m].append(clock() - start)
                if on_call is not None:
                    on_call()
    return seconds, outputs


def spread_note(name: str, spread: float, advice: str) -> str:
    """The note on a method whose timed calls spread by more than :data:`LARGE_SPREAD` of their median."""
    return (
        f"{name}: its times spread by {spread:.0%} of the median: the speed-up is noisy (a busy machine, or one call "
        f"doing first-call work for a new shape); {advice}"
    )


@dataclass
class Comparison:
    """What :func:`compare_methods` returns: the baseline first, then each method in the order asked."""

    prompt: str
    seed: int
    repeats: int
    results: List[MethodResult] = field(default_factory=list)

    def notes(self) -> List[str]:
        """How the numbers were measured, and a warning per method whose times spread widely."""
        rounds = "1 timed round" if self.repeats == 1 else f"{self.repeats} interleaved timed rounds"
        notes = [
            f"time: median of {rounds} after one untimed call per method (the FLOP count); speed-up: the median of "
            "the per-round ratios baseline / method (each round runs the baseline and every method back to back), "
            f"marked unsteady when they spread by more than {UNSTEADY_SPREAD:.0%}",
            "the FLOPs ratio counts the arithmetic of matrix products, attention and convolutions; on the 64x64 "
            "embedded model on a CPU that is about 60% of a call, the rest (element-wise operations, Python in the "
            "loop) is the same whatever a method skips, so the wall-clock speed-up stays below the FLOPs ratio",
        ]
        for r in self.results:
            if len(r.seconds) > 1 and r.spread > LARGE_SPREAD:
                notes.append(spread_note(r.spec, r.spread, "more repeats give a steadier figure"))
        if self.repeats == 1:
            notes.append("one timed round: no spread is measured; more repeats give a steadier figure")
        return notes


def compare_methods(
    pipe: Any,
    prompt: str,
    schedulers: Dict[str, Any],
    *,
    seed: int = 0,
    repeats: int = 2,
    sampling: Optional[Dict[str, Any]] = None,
    height: Optional[int] = None,
    width: Optional[int] = None,
    progress: Optional[Callable[[float, str], None]] = None,
    lock: Optional[threading.Lock] = None,
) -> Comparison:
    """Generate ``prompt`` with the baseline and every scheduler of ``schedulers`` (``{spec: scheduler}``; the
    baseline is added first when absent, as ``"baseline": None``), all with ``seed``.

    Args:
        pipe: an Infinity or HART pipeline.
        schedulers: the methods, in order (``None`` is the baseline).
        repeats: timed rounds (at least 1).
        sampling: the pipeline's sampling arguments (``guidance_scale``, ``tau``, ``top_k``, ``top_p``).
        height: the image height (``None``: the pipeline's own).
        width: the image width (``None``: the pipeline's own).
        progress: called as ``progress(fraction, message)`` before each call.
        lock: held around every pipeline call (a pipeline shared between threads runs one call at a time).
    """
    from diffusers_var_accel.lab.bench.probe import count_call_flops
    from diffusers_var_accel.lab.metrics import psnr, ssim

    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("the prompt is empty: type what the image should show")
    methods = dict(schedulers)
    if "baseline" not in methods:
        methods = {"baseline": None, **methods}
    kwargs: Dict[str, Any] = dict(sampling or {})
    if height is not None:
        kwargs["height"] = height
    if width is not None:
        kwargs["width"] = width
    lock = lock if lock is not None else threading.Lock()
    total = len(methods) * (repeats + 1)
    done = 0

    def report(message: str) -> None:
        if progress is not None:
            progress(done / total, message)

    flops: Dict[str, int] = {}
    for spec, scheduler in methods.items():  # untimed first call per method, under the FLOP counter
        report(f"{spec}: first call (FLOP count)")
        with lock:
            flops[spec] = count_call_flops(
                pipe, prompt, generator=torch.Generator().manual_seed(seed), acceleration=scheduler, **kwargs
            )
        done += 1
    seconds: Dict[str, List[float]] = {spec: [] for spec in methods}
    images: Dict[str, torch.Tensor] = {}
    summaries: Dict[str, Dict[str, Any]] = {}
    for round_index in range(repeats):
        for spec, scheduler in methods.items():  # interleaved
            report(f"{spec}: timed round {round_index + 1} of {repeats}")
            with lock:
                generator = torch.Generator().manual_seed(seed)
                start = time.perf_counter()
                images[spec] = pipe(
                    prompt, generator=generator, output_type="pt", acceleration=scheduler, **kwargs
                ).images
                seconds[spec].append(time.perf_counter() - start)
                if round_index == repeats - 1:
                    summaries[spec] = pipe.acceleration_summary()
            done += 1
    report("done")
    base = "baseline"
    comparison = Comparison(prompt=prompt, seed=seed, repeats=repeats)
    for spec in methods:
        result = MethodResult(
            spec=spec, image=images[spec], seconds=seconds[spec], flops=flops[spec], summary=summaries[spec]
        )
        result.speedup, result.speedup_spread = paired_speedup(seconds[base], seconds[spec])
        result.flops_ratio = flops[base] / flops[spec] if flops[spec] else float("inf")
        result.psnr = float(psnr(images[spec], images[base]))
        result.ssim = float(ssim(images[spec], images[base]))
        comparison.results.append(result)
    return comparison


def to_pil(image: torch.Tensor):
    """A ``(1, 3, H, W)`` image in ``[0, 1]`` as a PIL image."""
    from PIL import Image

    return Image.fromarray(image[0].permute(1, 2, 0).clamp(0, 1).mul(255).round().byte().numpy())


def table_rows(comparison: Comparison) -> List[List[Any]]:
    """One row per method: spec, median seconds, spread, speed-up, GFLOPs, FLOPs ratio, PSNR, SSIM."""
    rows = []
    for r in comparison.results:
        rows.append(
            [
                r.spec,
                round(r.median_seconds, 4),
                f"{r.spread:.0%}" if len(r.seconds) > 1 else "-",
                f"{r.speedup:.2f}x" + (" unsteady" if r.unsteady else ""),
                round(r.flops / 1e9, 4),
                f"{r.flops_ratio:.2f}x",
                "inf" if r.psnr == float("inf") else f"{r.psnr:.2f}",
                f"{r.ssim:.3f}",
            ]
        )
    return rows


#: The column names of :func:`table_rows`.
TABLE_HEADERS = [
    "method",
    "s / image (median)",
    "spread",
    "speed-up",
    "GFLOPs",
    "FLOPs ratio",
    "PSNR vs baseline (dB)",
    "SSIM vs baseline",
]


def caption(result: MethodResult) -> str:
    """A short caption of one image: method, time, speed-up, FLOPs ratio, SSIM."""
    if result.spec == "baseline":
        return f"baseline · {result.median_seconds:.3f} s"
    return (
        f"{result.spec} · {result.median_seconds:.3f} s · {result.speedup:.2f}x time · "
        f"{result.flops_ratio:.2f}x FLOPs · SSIM {result.ssim:.3f}"
    )


def summary_markdown(comparison: Comparison) -> str:
    """Every method's acceleration summary (:func:`~.summary.format_acceleration_summary`, with its counted FLOPs
    against the baseline's), in the images' order: a heading and a text table each."""
    from .summary import format_acceleration_summary

    baseline_flops = next((r.flops for r in comparison.results if r.spec == "baseline"), None)
    blocks = []
    for r in comparison.results:
        if r.summary is None:
            continue
        table = format_acceleration_summary(r.summary, r.flops, baseline_flops)
        blocks.append(f"**{r.spec}**: what its passes computed\n\n```text\n{table}\n```")
    return "\n\n".join(blocks)
