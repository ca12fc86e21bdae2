#!/usr/bin/env python
"""The speed-fidelity frontier of calibrated settings on the held-out shapes prompts (docs/calibration.md).

For every ``calibration.json`` given (``var-accel calibrate`` outputs) and every budget, the setting ``calibrate`` picks
under that counted-FLOPs ratio (:func:`diffusers_var_accel.lab.calibration.choose` on the record's ``tried`` list: the same
search under another budget) is run once on the held-out prompts, with any extra acceleration specs (the papers'
presets, scheduler folders) beside them. Per setting: the scorer's accuracy (mean of categories, as
``scripts/eval_embedded.py``), PSNR and SSIM to the baseline image of the same prompt and seed, the counted FLOPs ratio
(one real call, ``var-accel bench``'s counter) and the measured CPU speed-up (every chunk of prompts runs the baseline
and every setting in turn, so drift hits all alike; total baseline time / total setting time). ``--prompt-set fresh``
measures on calibration prompts the calibrations did not use instead (string-disjoint from the held-out set).
``--settings-from FRONTIER_JSON`` measures again the rows of an earlier run's ``--json`` (their settings as recorded,
nothing chosen again), except the methods whose calibration folders are given, which are chosen again from them.
``scripts/frontier_unseen.py`` measures a run's rows on the string-disjoint test set (this script never reads it).

    python scripts/calibration_frontier.py CAL_DIR [CAL_DIR ...] --budgets 1.5,2,3 [--select ssim,accuracy]
        [--extra infinity-2b/lazyvar ...] [--prompt-set heldout|fresh] [--num-prompts 200] [--json frontier.json] [--plot frontier.png]
        [--settings-from frontier.json] [--threads N]
    python scripts/calibration_frontier.py --plot-from frontier.json --plot frontier.png   # draw an earlier run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def portable_source(folder) -> str:
    """A calibration folder as the record names it: relative to the working directory when inside it, else its last
    two path components (the machine's own prefix means nothing on another machine)."""
    path = Path(folder).resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(Path(*path.parts[-2:]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("calibrations", nargs="*", help="folders written by var-accel calibrate (calibration.json)")
    parser.add_argument("--budgets", default="1.5,2,3", help="counted-FLOPs ratios (default 1.5,2,3)")
    parser.add_argument(
        "--all", action="store_true", help="every setting tried in the calibrations, not only the chosen ones"
    )
    parser.add_argument(
        "--select",
        help="comma-separated fidelities to choose by from each record's tried list (ssim, psnr, accuracy, lpips; "
        "default: the record's own --select); one row per distinct setting, with the selections that chose it",
    )
    parser.add_argument("--extra", nargs="*", default=[], help="more acceleration specs (preset names, folders)")
    parser.add_argument(
        "--prompt-set",
        choices=["heldout", "fresh"],
        default="heldout",
        help="heldout (default): the 200 held-out prompts with their seeds; fresh: calibration prompts beyond the "
        "first --calibration-prompts (string-disjoint from the held-out set, unseen by the calibrations), prompt i "
        "with seed i (a second measurement that neither the calibrations nor the held-out results chose)",
    )
    parser.add_argument(
        "--calibration-prompts",
        type=int,
        default=12,
        help="fresh: how many calibration prompts the calibrations used (skipped; default 12)",
    )
    parser.add_argument(
        "--num-prompts", type=int, default=200, help="the first N prompts of the set (default 200: all held-out ones)"
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--settings-from",
        help="an earlier run's --json: measure its rows' settings again (the methods of the calibration folders given "
        "are chosen again from those folders instead)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch's intra-op CPU threads (default: torch's)")
    parser.add_argument("--json", help="write every number here")
    parser.add_argument("--plot", help="write the frontier plot (held-out SSIM and accuracy against FLOPs ratio) here")
    parser.add_argument(
        "--plot-from",
        help="an earlier run's --json: only draw its rows into --plot (nothing is measured or chosen)",
    )
    args = parser.parse_args(argv)
    if args.plot_from:
        if not args.plot:
            parser.error("--plot-from draws into --plot; give --plot PATH")
        rows = json.loads(Path(args.plot_from).read_text())
        if not isinstance(rows, list) or not rows or rows[0].get("name") != "baseline":
            parser.error(f"{args.plot_from}: expected a --json list of this script whose first row is the baseline")
        plot(rows, args.plot, rows[0].get("prompt_set", "heldout"))
        return 0

    import torch

    from diffusers_var_accel.lab.calibration import SELECT_METRICS, build_candidate, calibration_prompts, choose
    from diffusers_var_accel.lab.data.shapes import heldout_prompts
    from diffusers_var_accel.pipelines.pipeline_loading import load_embedded_pipeline
    from diffusers_var_accel.schedulers.specs import load_acceleration

    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be an integer >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    pipe = load_embedded_pipeline()
    pipe.set_progress_bar_config(disable=True)
    budgets = [float(b) for b in args.budgets.split(",")]
    selects = None if args.select is None else [m.strip() for m in args.select.split(",")]
    for metric in selects or []:
        if metric not in SELECT_METRICS:
            parser.error(f"--select: {metric!r} is not one of {list(SELECT_METRICS)}")
    settings = {"baseline": dict(scheduler=None, source="baseline")}
    records = {folder: json.loads((Path(folder) / "calibration.json").read_text()) for folder in args.calibrations}
    for folder, record in records.items():
        if args.all:
            for t in record["tried"]:
                if "flops_ratio" in t:
                    label = f"{record['method']} {json.dumps(t['settings'], separators=(',', ':'))}"
                    settings[label] = dict(
                        scheduler=build_candidate(record["method"], t["settings"], "infinity"),
                        method=record["method"],
                        settings=t["settings"],
                        budgets=[],
                        selected_by=[],
                        calibration=dict(
                            flops_ratio=t["flops_ratio"],
                            ssim=t["ssim_mean"],
                            psnr=t["psnr_mean"],
                            accuracy=t.get("accuracy"),
                        ),
                        source=portable_source(folder),
                    )
            continue
        grid_max = max((t["flops_ratio"] for t in record["tried"] if "flops_ratio" in t), default=0)
        for budget in budgets:
            if grid_max < budget:
                print(f"{record['method']} at {budget}x: unreachable (grid max {grid_max:.2f}x)", file=sys.stderr)
        for metric in selects or [record.get("select", "ssim")]:
            for budget in budgets:
                chosen = choose(record["tried"], budget, None, metric)
                if chosen is None:
                    continue
                same = [
                    k
                    for k, v in settings.items()
                    if v.get("method") == record["method"] and v.get("settings") == chosen["settings"]
                ]
                if same:
                    settings[same[0]]["budgets"].append(budget)
                    settings[same[0]]["selected_by"].append(f"{metric}@{budget:g}x")
                    continue
                label = f"{record['method']} @{budget:g}x" + (f" ({metric})" if selects and len(selects) > 1 else "")
                settings[label] = dict(
                    scheduler=build_candidate(record["method"], chosen["settings"], "infinity"),
                    method=record["method"],
                    settings=chosen["settings"],
                    budgets=[budget],
                    selected_by=[f"{metric}@{budget:g}x"],
                    calibration=dict(
                        flops_ratio=chosen["flops_ratio"],
                        ssim=chosen["ssim_mean"],
                        psnr=chosen["psnr_mean"],
                        accuracy=chosen.get("accuracy"),
                        prompts=len(record["prompts"]),
                        seeds=record["seeds"],
                    ),
                    source=portable_source(folder),
                )
    if args.settings_from:
        rechosen = {record["method"] for record in records.values()}
        for row in json.loads(Path(args.settings_from).read_text()):
            if row["name"] == "baseline" or row.get("method") in rechosen:
                continue
            if row.get("method") is None:  # an --extra spec of that run
                settings[row["name"]] = dict(
                    scheduler=load_acceleration(row["source"], "infinity"), source=row["source"]
                )
                continue
            settings[row["name"]] = dict(
                scheduler=build_candidate(row["method"], row["settings"], "infinity"),
                **{k: row[k] for k in ("method", "settings", "budgets", "selected_by", "calibration", "source")},
            )
    for spec in args.extra:
        settings[spec] = dict(scheduler=load_acceleration(spec, "infinity"), source=spec)

    if args.prompt_set == "heldout":
        entries = heldout_prompts()[: args.num_prompts]
    else:
        for folder, record in records.items():
            if record["prompts"] != calibration_prompts(args.calibration_prompts):
                parser.error(f"{folder} did not calibrate on calibration_prompts({args.calibration_prompts})")
        fresh = calibration_prompts(args.calibration_prompts + args.num_prompts)[args.calibration_prompts :]
        entries = [dict(prompt=prompt, seed=i) for i, prompt in enumerate(fresh)]
    prefix = "heldout" if args.prompt_set == "heldout" else "fresh"
    rows = measure(pipe, settings, entries, prefix, args.batch_size)
    for row in rows:
        row["prompt_set"] = args.prompt_set
    print(
        f"| setting | chosen by | counted FLOPs ratio | CPU speed-up | {prefix} SSIM | {prefix} PSNR (dB) | "
        f"{prefix} accuracy |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        budget = ", ".join(r["selected_by"]) if r["selected_by"] else "-"
        print(
            f"| {r['name']} | {budget} | {r['flops_ratio']:.2f}x | {r['speedup']:.2f}x | {r[prefix + '_ssim']:.3f} | "
            f"{r[prefix + '_psnr']:.2f} | {r[prefix + '_accuracy']:.1%} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    if args.plot:
        plot(rows, args.plot, prefix)
    return 0


def measure(pipe, settings: dict, entries: list, prefix: str, batch_size: int = 8) -> list:
    """Run the baseline and every setting on ``entries`` (``{"prompt", "seed"}``), interleaved per chunk of prompts,
    and return one row per setting: counted FLOPs ratio, CPU speed-up, and ``<prefix>_accuracy`` (the scorer's, strict
    by default), ``_per_category``, ``_accuracy_images``, ``_psnr`` and ``_ssim`` to the baseline image."""
    import torch

    from diffusers_var_accel.embedded import EMBEDDED_SAMPLING
    from diffusers_var_accel.lab.bench.probe import count_call_flops
    from diffusers_var_accel.lab.data.scorer import score_batch
    from diffusers_var_accel.lab.metrics import psnr, ssim

    first = entries[0]
    for name, entry in settings.items():
        entry["flops"] = count_call_flops(
            pipe,
            first["prompt"],
            generator=torch.Generator().manual_seed(first["seed"]),
            acceleration=entry["scheduler"],
            **EMBEDDED_SAMPLING,
        )
    images = {name: [] for name in settings}
    seconds = {name: 0.0 for name in settings}
    pipe(
        [e["prompt"] for e in entries[:2]],
        generator=[torch.Generator().manual_seed(0)] * 2,
        output_type="pt",
        **EMBEDDED_SAMPLING,
    )  # warm-up
    for start in range(0, len(entries), batch_size):
        chunk = entries[start : start + batch_size]
        for name, entry in settings.items():  # interleaved per chunk
            generators = [torch.Generator().manual_seed(int(e["seed"])) for e in chunk]
            began = time.perf_counter()
            out = pipe(
                [e["prompt"] for e in chunk],
                generator=generators,
                output_type="pt",
                acceleration=entry["scheduler"],
                **EMBEDDED_SAMPLING,
            ).images
            seconds[name] += time.perf_counter() - began
            images[name].append(out)
        print(f"{start + len(chunk)}/{len(entries)} prompts", file=sys.stderr, flush=True)
    texts = [e["prompt"] for e in entries]
    base = torch.cat(images["baseline"])
    rows = []
    for name, entry in settings.items():
        got = torch.cat(images[name])
        report = score_batch(texts, [img.permute(1, 2, 0).clamp(0, 1).numpy() for img in got])
        psnrs = [min(float(psnr(got[i : i + 1], base[i : i + 1])), 60.0) for i in range(len(texts))]
        ssims = [float(ssim(got[i : i + 1], base[i : i + 1])) for i in range(len(texts))]
        rows.append(
            dict(
                name=name,
                source=entry["source"],
                method=entry.get("method"),
                settings=entry.get("settings"),
                budgets=entry.get("budgets"),
                selected_by=entry.get("selected_by"),
                calibration=entry.get("calibration"),
                flops_ratio=settings["baseline"]["flops"] / entry["flops"],
                speedup=seconds["baseline"] / seconds[name],
                seconds_per_image=seconds[name] / len(texts),
                **{
                    f"{prefix}_accuracy": report["overall"],
                    f"{prefix}_per_category": report["per_category"],
                    f"{prefix}_accuracy_images": report["overall_images"],
                    f"{prefix}_n_per_category": report["n_per_category"],
                    f"{prefix}_psnr": sum(psnrs) / len(psnrs),
                    f"{prefix}_ssim": sum(ssims) / len(ssims),
                },
                n=len(texts),
            )
        )
    return rows


def plot(rows, path, prefix: str = "heldout") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    groups = {}
    for r in rows:
        group = r["method"] or ("baseline" if r["name"] == "baseline" else "paper presets")
        metrics = {s.split("@")[0] for s in r.get("selected_by") or []}
        if len(metrics) == 1 and metrics != {"ssim"}:
            group += f" (by {metrics.pop()})"  # only another selection chose it: its own line
        groups.setdefault(group, []).append(r)
    for ax, key, label in (
        (axes[0], f"{prefix}_ssim", f"{prefix} SSIM to the baseline"),
        (axes[1], f"{prefix}_accuracy", f"{prefix} scorer accuracy"),
    ):
        for group, items in groups.items():
            items = sorted(items, key=lambda r: r["flops_ratio"])
            style = "x" if group == "paper presets" else ("s--" if "(by " in group else "o-")
            color = plt.cm.tab20(list(groups).index(group) % 20)  # more groups than the default cycle's 10 colours
            ax.plot([r["flops_ratio"] for r in items], [r[key] for r in items], style, color=color, label=group)
            if group == "paper presets":
                for r in items:
                    ax.annotate(r["name"].split("/")[-1], (r["flops_ratio"], r[key]), fontsize=7)
        ax.set_xlabel("counted FLOPs ratio (baseline / setting)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
