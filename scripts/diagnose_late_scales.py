#!/usr/bin/env python
"""How much of what the scorer reads do the last scales of a schedule carry (docs/embedded.md, ninth round)?

An oracle that needs no transformer: unseen scenes of the training world are encoded by the model's tokenizer and
quantised on a schedule (the model's, or another of the same final map, ``--schedule``), and the scorer judges the
decoded sum of codes with the last K scales' codes kept at only a random fraction of their positions (the rest
zero: LazyVAR's and FastVAR's residual of an unkept token). A schedule whose last scales carry detail keeps the
scorer's verdicts when they are thinned out; one whose last scales still draw edges and shapes does not. Each row
prints the scorer accuracy per (K, kept fraction); the first cell (nothing dropped) is the tokenizer's own accuracy.

    python scripts/diagnose_late_scales.py [--model embedded] [--schedule 1,2,3,4,5,6,8,10,12,13,14,15,16]
        [--scenes 24] [--last 1,2,4] [--keep 0.5,0.25,0.1,0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, Sequence, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CATEGORIES = ("single_object", "colors", "counting", "two_objects", "position", "color_attr")


def late_scale_accuracy(
    vae, schedule: Sequence[Tuple[int, int, int]], images, captions, last: Sequence[int], keep: Sequence[float], seed=0
) -> Dict[Tuple[int, float], float]:
    """Scorer accuracy of ``images`` re-decoded from their codes on ``schedule`` with the last K scales' codes kept
    at a random fraction of positions, for every K in ``last`` and fraction in ``keep``; ``(0, 1.0)``: all codes."""
    import numpy as np
    import torch

    from diffusers_var_accel.lab.data.scorer import score

    for k in last:
        if not 1 <= k <= len(schedule):
            raise ValueError(f"--last {k}: expected 1..{len(schedule)} (the schedule's scales)")
    for r in keep:
        if not 0.0 <= r <= 1.0:
            raise ValueError(f"--keep {r}: expected a fraction in [0, 1]")
    with torch.no_grad():
        bits = vae.quantize_multiscale(vae.encode(images), schedule)
        codes = [vae.bits_to_codes(b) for b in bits]
    results = {}
    for k, ratio in [(0, 1.0)] + [(k, r) for k in last for r in keep]:
        generator = torch.Generator().manual_seed(seed)
        f_hat = None
        for si, c in enumerate(codes):
            if si >= len(codes) - k:
                c = c * (torch.rand(c.shape[0], 1, *c.shape[-2:], generator=generator) < ratio).to(c.dtype)
            f_hat = vae.add_scale_codes(f_hat, c, schedule[-1], is_last_scale=si == len(codes) - 1)
        with torch.no_grad():
            pixels = ((vae.decode(f_hat) + 1) * 127.5).round().clamp(0, 255).byte().permute(0, 2, 3, 1).numpy()
        results[(k, ratio)] = float(np.mean([score(t, x)["correct"] for t, x in zip(captions, pixels)]))
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="embedded", help="a pipeline folder or 'embedded' (its tokenizer is used)")
    parser.add_argument("--schedule", default=None, help="square sides, e.g. 1,2,4,8,16 (default: the model's)")
    parser.add_argument("--scenes", type=int, default=24, help="unseen scenes per category (default 24)")
    parser.add_argument("--last", default="1,2,4", help="numbers K of last scales thinned out")
    parser.add_argument("--keep", default="0.5,0.25,0.1,0", help="fractions of their positions kept")
    args = parser.parse_args(argv)
    if args.scenes < 1:
        raise SystemExit(f"--scenes {args.scenes}: expected at least 1")

    import numpy as np
    import torch

    from diagnose_embedded_scales import CAPTION_DECIDED_WORLD
    from diffusers_var_accel import InfinityPipeline
    from diffusers_var_accel.lab.data.shapes import make_dataset

    pipe = InfinityPipeline.from_pretrained(args.model)
    model_schedule = [tuple(int(v) for v in s) for s in pipe.transformer.config.scale_schedule]
    if args.schedule is None:
        schedule = model_schedule
    else:
        schedule = [(1, int(p), int(p)) for p in args.schedule.split(",")]
        if schedule[-1] != model_schedule[-1]:
            raise SystemExit(
                f"--schedule must end at the tokenizer's final map {model_schedule[-1][1:]}, got {schedule[-1][1:]}"
            )
    scenes = []
    for i, category in enumerate(CATEGORIES):
        scenes += make_dataset(
            args.scenes,
            seed=500 + i,
            size=pipe.default_size[0],
            category_weights={category: 1},
            **CAPTION_DECIDED_WORLD,
        )
    images = torch.from_numpy(np.stack([np.asarray(img.convert("RGB")) for img, _, _ in scenes]))
    images = images.permute(0, 3, 1, 2).float() / 127.5 - 1
    last = [int(v) for v in args.last.split(",")]
    keep = [float(v) for v in args.keep.split(",")]
    try:
        results = late_scale_accuracy(pipe.vae.eval(), schedule, images, [c for _, c, _ in scenes], last, keep)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    sides = ",".join(str(h) for _, h, _ in schedule)
    print(f"schedule {sides}: all codes {results[(0, 1.0)]:.3f}", flush=True)
    for k in last:
        cells = ", ".join(f"keep {r:g}: {results[(k, r)]:.3f}" for r in keep)
        print(f"  last {k} thinned: {cells}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
