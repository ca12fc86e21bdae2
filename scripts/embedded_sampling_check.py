#!/usr/bin/env python
"""The embedded model's sampling settings scored on calibration prompts, never on the held-out set (docs/calibration.md).

``EMBEDDED_SAMPLING`` was chosen on 120 validation draws of the shapes grammar (``heldout_prompts(120, seed=1)``), whose
strings are not disjoint from the 200 held-out prompts. This re-scores the same nine (guidance, tau) settings on
``calibration_prompts(N)`` (string-disjoint from the held-out set): prompt ``i`` is drawn with seed ``i``, top-k and
top-p off, as in ``EMBEDDED_SAMPLING``.

    python scripts/embedded_sampling_check.py [--num-prompts 96]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diffusers_var_accel.lab.selection import decides  # noqa: E402

#: The nine (guidance, tau) settings of the original validation (docs/embedded.md, fifth round).
SETTINGS = [
    (2.0, 1.0),
    (2.0, 0.5),
    (1.0, 0.5),
    (1.5, 0.5),
    (2.0, 0.25),
    (2.0, 0.1),
    (3.0, 0.5),
    (3.0, 1.0),
    (4.0, 0.5),
]


@decides("the sampling check")
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=96, help="calibration prompts (default 96)")
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args(argv)

    import torch

    from diffusers_var_accel.lab.calibration import calibration_prompts
    from diffusers_var_accel.lab.data.scorer import score_batch
    from diffusers_var_accel.lab.data.shapes import parse_prompt
    from diffusers_var_accel.pipelines.pipeline_loading import load_embedded_pipeline

    torch.set_num_threads(1)
    prompts = calibration_prompts(args.num_prompts)
    categories = collections.Counter(parse_prompt(p)["category"] for p in prompts)
    print(f"{len(prompts)} calibration prompts: {dict(categories)}")
    pipe = load_embedded_pipeline()
    pipe.set_progress_bar_config(disable=True)
    print("| guidance | tau | accuracy over images | mean of categories | per category |")
    print("| ---: | ---: | ---: | ---: | --- |")
    for guidance, tau in SETTINGS:
        images = []
        for start in range(0, len(prompts), args.batch_size):
            chunk = prompts[start : start + args.batch_size]
            generators = [torch.Generator().manual_seed(start + j) for j in range(len(chunk))]
            out = pipe(
                chunk, generator=generators, output_type="pt", guidance_scale=guidance, tau=tau, top_k=0, top_p=None
            )
            images += list(out.images)
        scores = score_batch(prompts, images)
        per_category = ", ".join(f"{k} {100 * v:.1f} %" for k, v in scores["per_category"].items())
        print(
            f"| {guidance:g} | {tau:g} | {100 * scores['overall_images']:.1f} % | {100 * scores['overall']:.1f} % | "
            f"{per_category} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
