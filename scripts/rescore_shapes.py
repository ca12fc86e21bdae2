#!/usr/bin/env python
"""Score saved images with the strict and the lenient scorer, per category, and list the verdicts that moved.

python scripts/eval_embedded.py --prompts heldout --save-images baseline.npz   # the images, once
python scripts/rescore_shapes.py baseline.npz [lazyvar.npz ...] [--moved-dir DIR]

The strict scorer (the default since 2026-12-06) also judges shape: a circle or a square must not be elongated and
must show its corners (none, four; a triangle three); the lenient one is the template fit alone
(``score(..., strict=False)``). ``--moved-dir`` writes each moved image as a PNG, named by its index, for a look.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("images", nargs="+", help=".npz files of eval_embedded.py --save-images")
    parser.add_argument("--moved-dir", default=None, help="write the images whose verdict moved here (PNG)")
    args = parser.parse_args(argv)

    import numpy as np
    from PIL import Image

    from diffusers_var_accel.lab.data.scorer import score, score_batch

    for path in args.images:
        data = np.load(path)
        prompts, images = [str(p) for p in data["prompts"]], list(data["images"])
        strict, lenient = score_batch(prompts, images), score_batch(prompts, images, strict=False)
        print(f"\n{path}: {len(prompts)} images")
        print("| category | lenient | strict | prompts |\n| --- | ---: | ---: | ---: |")
        for category, n in strict["n_per_category"].items():
            print(
                f"| {category} | {lenient['per_category'][category]:.1%} | {strict['per_category'][category]:.1%} | {n} |"
            )
        print(
            f"| **overall** (mean of categories) | **{lenient['overall']:.1%}** | **{strict['overall']:.1%}** | {len(prompts)} |"
        )
        moved = [i for i, (a, b) in enumerate(zip(lenient["correct"], strict["correct"])) if a != b]
        print(f"{len(moved)} verdicts moved:")
        for i in moved:
            result = score(prompts[i], images[i])
            rejected = [
                f"{o['color']} {o['features']['template_shape']}: {o['features']['rejected']}"
                for o in _objects(images[i])
                if "rejected" in o["features"]
            ]
            print(
                f"  {i}: {prompts[i]!r} (seed {int(data['seeds'][i])}) lenient {lenient['correct'][i]} -> strict "
                f"{strict['correct'][i]}: {result['details']['reason']}; rejected: {'; '.join(rejected) or 'none'}"
            )
            if args.moved_dir:
                out = Path(args.moved_dir) / Path(path).stem
                out.mkdir(parents=True, exist_ok=True)
                Image.fromarray(images[i]).resize((256, 256), Image.NEAREST).save(out / f"{i:03d}.png")
    return 0


def _objects(image):
    from diffusers_var_accel.lab.data.scorer import detect_objects

    return detect_objects(image)


if __name__ == "__main__":
    sys.exit(main())
