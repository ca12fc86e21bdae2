"""Speed-ups from paired timings: each method against the baseline on the same item, back to back, and the median
of the per-pair ratios (what ``var-accel bench``, ``var-accel demo`` and the web page report)."""

from __future__ import annotations

import math
import statistics
from typing import Sequence, Tuple


def paired_speedup(baseline_seconds: Sequence[float], method_seconds: Sequence[float]) -> Tuple[float, float]:
    """The median of the per-pair ratios ``baseline / method`` (a pair: the same round, the same prompt, run back to
    back) and their spread, ``(max - min) / median`` of the ratios. A load change during the run moves both calls
    of a pair alike, and hits only the pairs it falls inside, which the median leaves out; a ratio of two medians
    taken over the whole run does not (a baseline slow in the first half and a method fast in the second)."""
    if len(baseline_seconds) != len(method_seconds) or not baseline_seconds:
        raise ValueError(
            f"paired timings need as many baseline as method calls, got {len(baseline_seconds)} and "
            f"{len(method_seconds)}"
        )
    ratios = [b / m if m > 0 else float("inf") for b, m in zip(baseline_seconds, method_seconds)]
    finite = [r for r in ratios if math.isfinite(r)]
    median = statistics.median(ratios)
    spread = (max(finite) - min(finite)) / median if finite and median > 0 and math.isfinite(median) else 0.0
    return median, spread


#: A row whose per-pair speed-ups spread by more than this (``(max - min) / median``) is marked unsteady.
UNSTEADY_SPREAD = 0.3
