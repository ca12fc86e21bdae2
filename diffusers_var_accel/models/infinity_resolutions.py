"""Infinity's scale schedules: the 15 official aspect-ratio templates and their pixel budgets.

Facts from the official ``infinity/utils/dynamic_resolution.py`` (see ``docs/infinity.md``): each aspect template
(h/w) has a 13-scale schedule for the 1M pixel budget; the smaller budgets take its first 7 / 10 / 12 scales. The
official tables store a video time axis ``t``; for images the official runner replaces every ``t`` by 1, and so do we.
Every schedule is a tuple of ``(1, h, w)`` token-map sizes; the image is 16 pixels per token of the last scale.
"""

from __future__ import annotations

from typing import Dict, Tuple

ScaleSchedule = Tuple[Tuple[int, int, int], ...]

#: (h, w) of each of the 13 scales at the 1M budget, keyed by the aspect template h/w.
# fmt: off
_INFINITY_1M_SCALES: Dict[float, Tuple[Tuple[int, int], ...]] = {
    1.0   : (( 1,  1), ( 2,  2), ( 4,  4), ( 6,  6), ( 8,  8), (12, 12), (16, 16), (20, 20), (24, 24), (32, 32), (40, 40), (48, 48), (64, 64)),
    1.25  : (( 1,  1), ( 2,  2), ( 3,  3), ( 5,  4), (10,  8), (15, 12), (20, 16), (25, 20), (30, 24), (35, 28), (45, 36), (55, 44), (70, 56)),
    0.8   : (( 1,  1), ( 2,  2), ( 3,  3), ( 4,  5), ( 8, 10), (12, 15), (16, 20), (20, 25), (24, 30), (28, 35), (36, 45), (44, 55), (56, 70)),
    1.333 : (( 1,  1), ( 2,  2), ( 4,  3), ( 8,  6), (12,  9), (16, 12), (20, 15), (24, 18), (28, 21), (36, 27), (48, 36), (60, 45), (72, 54)),
    0.75  : (( 1,  1), ( 2,  2), ( 3,  4), ( 6,  8), ( 9, 12), (12, 16), (15, 20), (18, 24), (21, 28), (27, 36), (36, 48), (45, 60), (54, 72)),
    1.5   : (( 1,  1), ( 2,  2), ( 3,  2), ( 6,  4), ( 9,  6), (15, 10), (21, 14), (27, 18), (33, 22), (39, 26), (48, 32), (63, 42), (78, 52)),
    0.666 : (( 1,  1), ( 2,  2), ( 2,  3), ( 4,  6), ( 6,  9), (10, 15), (14, 21), (18, 27), (22, 33), (26, 39), (32, 48), (42, 63), (52, 78)),
    1.75  : (( 1,  1), ( 2,  2), ( 3,  3), ( 7,  4), (11,  6), (14,  8), (21, 12), (28, 16), (35, 20), (42, 24), (56, 32), (70, 40), (84, 48)),
    0.571 : (( 1,  1), ( 2,  2), ( 3,  3), ( 4,  7), ( 6, 11), ( 8, 14), (12, 21), (16, 28), (20, 35), (24, 42), (32, 56), (40, 70), (48, 84)),
    2.0   : (( 1,  1), ( 2,  2), ( 4,  2), ( 6,  3), (10,  5), (16,  8), (22, 11), (30, 15), (38, 19), (46, 23), (60, 30), (74, 37), (90, 45)),
    0.5   : (( 1,  1), ( 2,  2), ( 2,  4), ( 3,  6), ( 5, 10), ( 8, 16), (11, 22), (15, 30), (19, 38), (23, 46), (30, 60), (37, 74), (45, 90)),
    2.5   : (( 1,  1), ( 2,  2), ( 5,  2), (10,  4), (15,  6), (20,  8), (25, 10), (30, 12), (40, 16), (50, 20), (65, 26), (80, 32), (100, 40)),
    0.4   : (( 1,  1), ( 2,  2), ( 2,  5), ( 4, 10), ( 6, 15), ( 8, 20), (10, 25), (12, 30), (16, 40), (20, 50), (26, 65), (32, 80), (40, 100)),
    3.0   : (( 1,  1), ( 2,  2), ( 6,  2), ( 9,  3), (15,  5), (21,  7), (27,  9), (36, 12), (45, 15), (54, 18), (72, 24), (90, 30), (111, 37)),
    0.333 : (( 1,  1), ( 2,  2), ( 2,  6), ( 3,  9), ( 5, 15), ( 7, 21), ( 9, 27), (12, 36), (15, 45), (18, 54), (24, 72), (30, 90), (37, 111)),
}
# fmt: on

#: Number of scales used at each pixel budget ("pn" in the official code).
INFINITY_PIXEL_BUDGETS: Dict[str, int] = {"0.06M": 7, "0.25M": 10, "0.60M": 12, "1M": 13}

#: Pixels per token of the last scale (VAE spatial factor).
INFINITY_PATCH_SIZE = 16

ASPECT_TEMPLATES: Tuple[float, ...] = tuple(_INFINITY_1M_SCALES)


def infinity_scale_schedule(aspect_template: float, pixel_budget: str = "1M") -> ScaleSchedule:
    """The official ``(1, h, w)`` schedule of an aspect template (h/w) and a pixel budget."""
    if aspect_template not in _INFINITY_1M_SCALES:
        raise ValueError(
            f"aspect template {aspect_template!r} is not one of the official templates {list(ASPECT_TEMPLATES)}"
        )
    if pixel_budget not in INFINITY_PIXEL_BUDGETS:
        raise ValueError(f"pixel budget {pixel_budget!r} is not one of {list(INFINITY_PIXEL_BUDGETS)}")
    scales = _INFINITY_1M_SCALES[aspect_template][: INFINITY_PIXEL_BUDGETS[pixel_budget]]
    return tuple((1, h, w) for h, w in scales)


def rope_grid_hw(aspect_template: float) -> Tuple[int, int]:
    """The 1M final-scale grid of a template: RoPE positions of every budget live on it."""
    return _INFINITY_1M_SCALES[aspect_template][-1]


def supported_sizes() -> Dict[Tuple[int, int], Tuple[float, str]]:
    """Every supported ``(height, width)`` in pixels, mapped to its ``(aspect_template, pixel_budget)``."""
    sizes = {}
    for template in ASPECT_TEMPLATES:
        for budget in INFINITY_PIXEL_BUDGETS:
            _, h, w = infinity_scale_schedule(template, budget)[-1]
            sizes[(h * INFINITY_PATCH_SIZE, w * INFINITY_PATCH_SIZE)] = (template, budget)
    return sizes


def schedule_for_size(height: int, width: int) -> Tuple[ScaleSchedule, float]:
    """The schedule and aspect template that produce exactly ``height x width`` pixels.

    Raises:
        ValueError: the size is not in the official tables; the message lists the supported sizes.
    """
    sizes = supported_sizes()
    if (height, width) not in sizes:
        listing = ", ".join(f"{h}x{w}" for h, w in sorted(sizes))
        raise ValueError(
            f"height x width = {height}x{width} is not a supported Infinity resolution. Supported (height x width): {listing}"
        )
    template, budget = sizes[(height, width)]
    return infinity_scale_schedule(template, budget), template
