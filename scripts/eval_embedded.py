#!/usr/bin/env python
"""Scorer accuracy of the embedded model on the 200 fixed held-out shapes prompts, per category (docs/embedded.md).

python scripts/eval_embedded.py [--model embedded] [--accel lazyvar] [--json results.json]
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
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--json", default=None, help="write the full report here")
    args = parser.parse_args(argv)

    from diffusers_var_accel import InfinityPipeline
    from diffusers_var_accel.lab.evaluation import evaluate_shapes
    from diffusers_var_accel.schedulers.specs import load_acceleration

    pipe = InfinityPipeline.from_pretrained(args.model)
    report = evaluate_shapes(pipe, acceleration=load_acceleration(args.accel, "infinity"), batch_size=args.batch_size)
    print(f"| category | accuracy ({args.accel}) | prompts |\n| --- | ---: | ---: |")
    for category, accuracy in report["per_category"].items():
        print(f"| {category} | {accuracy:.1%} | {report['n_per_category'][category]} |")
    print(f"| **overall** (mean of categories) | **{report['overall']:.1%}** | {report['n']} |")
    print(f"| all images | {report['overall_images']:.1%} | {report['n']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
