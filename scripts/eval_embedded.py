#!/usr/bin/env python
"""Scorer accuracy of the embedded model on the 200 fixed held-out shapes prompts, per category (docs/embedded.md).

python scripts/eval_embedded.py [--model embedded] [--accel lazyvar] [--prompts heldout|unseen] [--json results.json]

``--prompts unseen``: the string-disjoint test set (``lab/data/unseen.py``: 200 prompts, colour attribution and
position, whose strings the packaged model never saw) instead of the held-out set (held out by seed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="embedded", help="a pipeline folder or 'embedded'")
    parser.add_argument(
        "--accel", default="baseline", help="baseline, a preset name, name:key=value or a scheduler folder"
    )
    parser.add_argument(
        "--prompts",
        choices=("heldout", "unseen"),
        default="heldout",
        help="heldout: the 200 held-out prompts (held out by seed); unseen: the string-disjoint test set",
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--json", default=None, help="write the full report here")
    parser.add_argument(
        "--save-images",
        default=None,
        help="write the images here (an .npz of uint8 arrays, with the prompts and seeds)",
    )
    args = parser.parse_args(argv)

    from diffusers_var_accel import InfinityPipeline
    from diffusers_var_accel.lab.evaluation import evaluate_shapes
    from diffusers_var_accel.schedulers.specs import load_acceleration

    prompts = None
    if args.prompts == "unseen":
        from diffusers_var_accel.lab.data.unseen import unseen_prompts

        prompts = unseen_prompts()
    pipe = InfinityPipeline.from_pretrained(args.model)
    report = evaluate_shapes(
        pipe,
        prompts=prompts,
        acceleration=load_acceleration(args.accel, "infinity"),
        batch_size=args.batch_size,
        keep_images=args.save_images is not None,
    )
    if args.save_images:
        import numpy as np

        images = report.pop("images")
        np.savez_compressed(
            args.save_images,
            images=np.stack([np.round(np.asarray(im) * 255).clip(0, 255).astype(np.uint8) for im in images]),
            prompts=np.array([r["prompt"] for r in report["results"]]),
            seeds=np.array([r["seed"] for r in report["results"]]),
        )
    print(f"| category | accuracy ({args.accel}, {args.prompts}) | prompts |\n| --- | ---: | ---: |")
    for category, accuracy in report["per_category"].items():
        print(f"| {category} | {accuracy:.1%} | {report['n_per_category'][category]} |")
    print(f"| **overall** (mean of categories) | **{report['overall']:.1%}** | {report['n']} |")
    print(f"| all images | {report['overall_images']:.1%} | {report['n']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
