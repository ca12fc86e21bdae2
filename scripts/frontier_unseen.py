#!/usr/bin/env python
"""The frontier's settings measured on the string-disjoint test set (docs/calibration.md).

Reads the rows of a ``scripts/calibration_frontier.py --json`` run (every setting already chosen there, on the
calibration prompts) and measures each of them, with the baseline, on ``unseen_prompts()``: the 200 prompts whose
strings the packaged model never saw. Nothing is chosen here; the rows keep their names, settings and selections.
Per setting: the strict scorer's accuracy (mean of categories and over images), SSIM and PSNR to the baseline image
of the same prompt and seed, the counted FLOPs ratio and the CPU speed-up (as calibration_frontier.py measures them).

    python scripts/frontier_unseen.py frontier.json [--rows NAME ...] [--num-prompts 200] [--threads 1]
        [--json frontier_unseen.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("frontier", help="the --json of a calibration_frontier.py run")
    parser.add_argument("--num-prompts", type=int, default=200, help="the first N prompts of the set (default 200)")
    parser.add_argument(
        "--rows",
        nargs="*",
        default=None,
        help="measure only these rows (their names in the JSON; the baseline always)",
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch's intra-op CPU threads (default: torch's)")
    parser.add_argument("--json", help="write every number here")
    args = parser.parse_args(argv)

    import torch

    from calibration_frontier import measure

    from diffusers_var_accel.lab.calibration import build_candidate
    from diffusers_var_accel.lab.data.unseen import unseen_prompts
    from diffusers_var_accel.pipelines.pipeline_loading import load_embedded_pipeline
    from diffusers_var_accel.schedulers.specs import load_acceleration

    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be an integer >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    rows = json.loads(Path(args.frontier).read_text())
    if not isinstance(rows, list) or not rows or rows[0].get("name") != "baseline":
        parser.error(
            f"{args.frontier}: expected a calibration_frontier.py --json list whose first row is the baseline"
        )
    names = [row["name"] for row in rows]
    unknown = [name for name in args.rows or [] if name not in names]
    if unknown:
        parser.error(f"--rows: {unknown} are not rows of {args.frontier}; its rows are {names}")
    settings = {}
    for row in rows:
        if args.rows is not None and row["name"] != "baseline" and row["name"] not in args.rows:
            continue
        if row["name"] == "baseline":
            scheduler = None
        elif row.get("method") is None:  # an --extra spec (a preset name or folder)
            scheduler = load_acceleration(row["source"], "infinity")
        else:
            scheduler = build_candidate(row["method"], row["settings"], "infinity")
        settings[row["name"]] = dict(
            scheduler=scheduler,
            **{k: row.get(k) for k in ("method", "settings", "budgets", "selected_by", "calibration", "source")},
        )
    pipe = load_embedded_pipeline()
    pipe.set_progress_bar_config(disable=True)
    entries = unseen_prompts()[: args.num_prompts]
    measured = measure(pipe, settings, entries, "unseen", args.batch_size)
    for row in measured:
        row["prompt_set"] = "unseen"
    print("| setting | chosen by | counted FLOPs ratio | unseen SSIM | unseen accuracy | over images |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for r in measured:
        chosen = ", ".join(r["selected_by"]) if r["selected_by"] else "-"
        print(
            f"| {r['name']} | {chosen} | {r['flops_ratio']:.2f}x | {r['unseen_ssim']:.3f} | "
            f"{r['unseen_accuracy']:.1%} | {r['unseen_accuracy_images']:.1%} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(measured, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
