#!/usr/bin/env python
"""The docs' tables of counted figures, generated from the commands' output (docs/flops.md, "Generated tables").

Each table lives in a page between ``<!-- generated: NAME -->`` and ``<!-- end generated -->``; it is rendered from
records in ``docs/counts/*.json``, each the JSON output of one ``var-accel`` command with the command and the package
version that printed it. One rounding rule for every figure: the command's float, formatted to two decimals
(``f"{x:.2f}"``, as the commands' own tables print it), never a sum or ratio of rounded parts.

    python scripts/docs_tables.py record [NAME ...]   # run the commands again, rewrite their records
    python scripts/docs_tables.py write               # render every generated block from the records
    python scripts/docs_tables.py check               # exit 1 naming every block that differs from its rendering

``record`` is slow where the models are big (Infinity-8B's counts take minutes on 2 cores); ``write`` and ``check``
read only the records. ``tests/lab/test_docs_tables.py`` checks the blocks and recounts the cheap figures.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Sequence

ROOT = Path(__file__).resolve().parents[1]
COUNTS = ROOT / "docs" / "counts"
#: The pages that hold generated blocks (README.md's blocks are pasted by hand; ``write`` fills them once there).
PAGES = ("README.md", "docs/status.md", "docs/index.md", "docs/flops.md", "docs/arvar.md", "docs/depthvar.md",
         "docs/stagevar.md", "docs/benchmarks.md", "docs/fastvar.md", "docs/lazyvar.md", "docs/calibration.md",
         "docs/memory.md")  # fmt: skip

#: StageVAR's paper variant as a scheduler folder (``StageVARScheduler.paper_variant().save_pretrained(...)``), so a
#: command line can name it.
PAPER_VARIANT = "docs/counts/stagevar_paper_variant"


#: record name -> the ``var-accel`` arguments whose ``--json`` output it holds. Each command counts its own baseline
#: (a test checks they agree); the big models' counts are split into a few commands so that they can run side by side.
def _infinity(model: str, accel: str) -> List[str]:
    return ["flops", "--model", model, "--height", "1024", "--width", "1024", "--accel", accel, "--json"]


RECORDS: Dict[str, List[str]] = {
    "flops_hart_0.7b": [
        "flops",
        "--model",
        "hart-0.7b",
        "--accel",
        "fastvar,lazyvar,depthvar,arvar,stagevar",
        "--json",
    ],
    "flops_infinity_2b_fastvar_lazyvar": _infinity("infinity-2b", "fastvar,fastvar:skip_last_scales=false,lazyvar"),
    "flops_infinity_2b_depthvar": _infinity(
        "infinity-2b",
        "depthvar,depthvar:reference_scale=7,depthvar:min_depth=0,depthvar:reference_scale=10,"
        "depthvar:reference_scale=11",
    ),
    "flops_infinity_2b_arvar": _infinity(
        "infinity-2b", "arvar,arvar:branch_halving_scales=[-2,-1],arvar:branch_halving_scales=[]"
    ),
    "flops_infinity_2b_arvar_variants": _infinity(
        "infinity-2b",
        "arvar:pruned_scales=[],arvar:pruned_scales=[-2,-1],arvar:branch_halving_scales=[-3,-2,-1],pruned_scales=[-2,-1]",
    ),
    "flops_infinity_2b_stagevar": _infinity("infinity-2b", f"stagevar,{PAPER_VARIANT}"),
    "flops_infinity_8b_fastvar_lazyvar": _infinity("infinity-8b", "fastvar,fastvar:skip_last_scales=false,lazyvar"),
    "flops_infinity_8b_depthvar": _infinity("infinity-8b", "depthvar,depthvar:reference_scale=7"),
    "flops_infinity_8b_arvar_stagevar": _infinity("infinity-8b", f"arvar,stagevar,{PAPER_VARIANT}"),
    # one generation's full report (per scale, totals, sublayers), as `var-accel flops --model M` prints it
    "report_infinity_2b": ["flops", "--model", "infinity-2b", "--height", "1024", "--width", "1024", "--json"],
    "report_infinity_2b_no_cfg": [
        "flops",
        "--model",
        "infinity-2b",
        "--height",
        "1024",
        "--width",
        "1024",
        "--no-cfg",
        "--json",
    ],  # fmt: skip
    "report_hart_0.7b": ["flops", "--model", "hart-0.7b", "--json"],
    "report_hart_0.7b_no_cfg": ["flops", "--model", "hart-0.7b", "--no-cfg", "--json"],
    # every method under the counting conventions (docs/flops.md, "The papers' numbers and their counting convention")
    "conventions_hart_0.7b": [
        "flops",
        "--model",
        "hart-0.7b",
        "--accel",
        "fastvar,lazyvar,depthvar,arvar,stagevar",
        "--conventions",
        "--json",
    ],
    # Infinity-2B under the counting conventions (docs/flops.md: the gap to the paper, per scale, candidates)
    "conventions_infinity_2b": [
        "flops",
        "--model",
        "infinity-2b",
        "--height",
        "1024",
        "--width",
        "1024",
        "--accel",
        "fastvar,lazyvar",
        "--conventions",
        "--json",
    ],
}

#: The records of one model's table, merged by method spec.
MODEL_RECORDS = {
    "infinity-2b": [n for n in RECORDS if n.startswith("flops_infinity_2b")],
    "infinity-8b": [n for n in RECORDS if n.startswith("flops_infinity_8b")],
    "hart-0.7b": ["flops_hart_0.7b"],
}


# ---------------------------------------------------------------------------------------------------------------------
# records
# ---------------------------------------------------------------------------------------------------------------------
def load_record(name: str) -> dict:
    """The record ``docs/counts/<name>.json``; a missing or corrupted one fails naming the file."""
    path = COUNTS / f"{name}.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a readable count record ({err})") from err
    missing = [k for k in ("command", "package_version", "output") if k not in record]
    if missing:
        raise ValueError(f"{path}: a count record needs {missing}")
    return record


def run_command(args: Sequence[str]) -> dict:
    """The JSON that ``var-accel <args>`` prints (run as ``python -m diffusers_var_accel`` from the repository)."""
    done = subprocess.run(
        [sys.executable, "-m", "diffusers_var_accel", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"var-accel {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def record(name: str) -> None:
    from diffusers_var_accel import __version__

    if name not in RECORDS:
        raise ValueError(f"unknown record {name!r}; records: {sorted(RECORDS)}")
    if PAPER_VARIANT in " ".join(RECORDS[name]):
        from diffusers_var_accel.schedulers import StageVARScheduler

        StageVARScheduler.paper_variant().save_pretrained(str(ROOT / PAPER_VARIANT))
    output = (run_memory_command if RECORDS[name][0] == "memory" else run_command)(RECORDS[name])
    body = {"command": "var-accel " + " ".join(RECORDS[name]), "package_version": __version__, "output": output}
    COUNTS.mkdir(parents=True, exist_ok=True)
    (COUNTS / f"{name}.json").write_text(json.dumps(body, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------------------------------
# rendering: one rounding rule
# ---------------------------------------------------------------------------------------------------------------------
def num(x: float) -> str:
    """Every counted figure of the tables: the command's float to two decimals, as its own table prints it."""
    return f"{x:.2f}"


def times(x: float, sign: str = "×") -> str:
    return f"{num(x)}{sign}"


def rows_of(model: str) -> Dict[str, dict]:
    """The summary rows of ``model``'s ``var-accel flops --accel`` records, by method spec (``"baseline"`` too)."""
    return {row["method"]: row for name in MODEL_RECORDS[model] for row in load_record(name)["output"]["summary"]}


def _pair(rows: Dict[str, dict], a: str, b: str, key: str, fmt: Callable[[float], str]) -> str:
    return f"{fmt(rows[a][key])} / {fmt(rows[b][key])}"


def _status_infinity(model: str, with_variant: bool, title: str) -> str:
    r = rows_of(model)
    t, x = (lambda m: num(r[m]["total_tflops"])), (lambda m: times(r[m]["ratio"]))
    pv = PAPER_VARIANT
    lines = [
        f"| {title} | TFLOPs | ratio |",
        "| --- | --- | --- |",
        f"| baseline | {t('baseline')} | {x('baseline')} |",
    ]
    if with_variant:  # the 2B table of docs/status.md
        lines += [
            f"| FastVAR preset (prunes 32/40, skips 48/64) | {t('fastvar')} | {x('fastvar')} |",
            f"| FastVAR without skipping | {t('fastvar:skip_last_scales=false')} | "
            f"{x('fastvar:skip_last_scales=false')} |",
        ]
    elif "8B" in title:
        lines.append(
            f"| FastVAR preset / without skipping | {_pair(r, 'fastvar', 'fastvar:skip_last_scales=false', 'total_tflops', num)} | "
            f"{_pair(r, 'fastvar', 'fastvar:skip_last_scales=false', 'ratio', times)} |"
        )
    else:  # docs/index.md: presets only
        lines.append(f"| FastVAR preset (prunes 32/40, skips 48/64) | {t('fastvar')} | {x('fastvar')} |")
    lazy = "LazyVAR preset (group of the last 4 scales)" if "8B" not in title else "LazyVAR preset"
    lines += [
        f"| {lazy} | {t('lazyvar')} | {x('lazyvar')} |",
        f"| DepthVAR preset (R = 9) / `reference_scale=7` | "
        f"{_pair(r, 'depthvar', 'depthvar:reference_scale=7', 'total_tflops', num)} | "
        f"{_pair(r, 'depthvar', 'depthvar:reference_scale=7', 'ratio', times)} |",
    ]
    arvar = "ARVAR preset (branch halving at 48², 75 % pruned at 64²)" if "8B" not in title else "ARVAR preset"
    lines.append(f"| {arvar} | {t('arvar')} | {x('arvar')} |")
    if "8B" in title:
        lines.append(
            f"| StageVAR preset / paper variant | {_pair(r, 'stagevar', pv, 'total_tflops', num)} | "
            f"{_pair(r, 'stagevar', pv, 'ratio', times)} |"
        )
    elif with_variant:
        lines.append(
            "| StageVAR preset (40-64² unguided, 40² on token mixtures, 48/64 skipped) / paper variant (no skip) | "
            f"{_pair(r, 'stagevar', pv, 'total_tflops', num)} | {_pair(r, 'stagevar', pv, 'ratio', times)} |"
        )
    else:
        lines.append(
            f"| StageVAR preset (40-64² unguided, 40² on token mixtures, 48/64 skipped) | {t('stagevar')} | "
            f"{x('stagevar')} |"
        )
    return "\n".join(lines)


_HART_LABELS = {
    "baseline": "baseline",
    "fastvar": "FastVAR preset (48² at r 0.5, 64² at r 0.75)",
    "lazyvar": "LazyVAR preset (group 48², 64² at 50 / 35 %)",
    "depthvar": "DepthVAR preset (R = 10)",
    "arvar": "ARVAR preset (branch halving at 48², 75 % pruned at 64²)",
    "stagevar": "StageVAR preset (48², 64² unguided, 64² on token mixtures per layer)",
}


def _status_hart(with_paper: bool) -> str:
    r = rows_of("hart-0.7b")
    head = "| HART-0.7B, 1024², CFG (counted) | TFLOPs | ratio |" + (" paper |" if with_paper else "")
    lines = [head, "| --- | --- | --- |" + (" --- |" if with_paper else "")]
    for method, label in _HART_LABELS.items():
        row = r[method]
        paper = (f" {num(row['paper_tflops'])} |" if row.get("paper_tflops") else " – |") if with_paper else ""
        lines.append(f"| {label} | {num(row['total_tflops'])} | {times(row['ratio'])} |{paper}")
    return "\n".join(lines)


def _flops_8b_vs_2b() -> str:
    big, small = rows_of("infinity-8b"), rows_of("infinity-2b")
    labels = {
        "baseline": "baseline",
        "fastvar": "FastVAR preset (prunes 32/40, skips 48/64)",
        "fastvar:skip_last_scales=false": "FastVAR without skipping",
        "lazyvar": "LazyVAR preset (group of the last 4 scales)",
        "depthvar": "DepthVAR preset (R = 9)",
        "depthvar:reference_scale=7": "DepthVAR `reference_scale=7`",
        "arvar": "ARVAR preset (branch halving at 48², 75 % pruned at 64²)",
        "stagevar": "StageVAR preset (40-64² unguided, 40² on token mixtures in 8 chunks, 48/64 skipped)",
        PAPER_VARIANT: "StageVAR paper variant (40-64² on token mixtures, nothing skipped)",
    }
    lines = [
        "| method (1024², CFG) | 8B total | 8B transformer | 8B ratio | 2B total | 2B ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for method, label in labels.items():
        b, s = big[method], small[method]
        lines.append(
            f"| {label} | {num(b['total_tflops'])} | {num(b['transformer_tflops'])} | {times(b['ratio'], 'x')} | "
            f"{num(s['total_tflops'])} | {times(s['ratio'], 'x')} |"
        )
    return "\n".join(lines)


def _flops_8b_per_scale() -> str:
    """The 8B per-scale table as ``var-accel flops`` prints it (its own three decimals), merged over the records."""
    from diffusers_var_accel.lab.bench.flop_meter import per_scale_lines

    methods = ["baseline", "fastvar", "fastvar:skip_last_scales=false", "lazyvar", "depthvar"]
    methods += ["depthvar:reference_scale=7", "arvar"]
    scales = {}
    for name in MODEL_RECORDS["infinity-8b"]:
        for s in load_record(name)["output"]["per_scale"]:
            scales.setdefault(s["scale_index"], {}).update(s)
    comparison = {"summary": [{"method": m} for m in methods], "per_scale": [scales[i] for i in sorted(scales)]}
    return "\n".join(["```", *per_scale_lines(comparison, hw_width=9), "```"])


def _stagevar() -> str:
    two, eight, hart = rows_of("infinity-2b"), rows_of("infinity-8b"), rows_of("hart-0.7b")

    def cell(r, m, bold=False):
        ratio = times(r[m]["ratio"], "x")
        return f"{num(r[m]['total_tflops'])} ({f'**{ratio}**' if bold else ratio})"

    def line(label, r, baseline, variant=True):
        cells = [baseline, cell(r, "fastvar"), cell(r, "lazyvar"), cell(r, "stagevar", bold=True)]
        cells.append(cell(r, PAPER_VARIANT) if variant else "–")
        return f"| {label} | " + " | ".join(cells) + " |"

    return "\n".join(
        [
            "| model | baseline | FastVAR preset | LazyVAR preset | StageVAR preset | StageVAR paper variant |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
            line("Infinity-2B", two, f"{num(two['baseline']['total_tflops'])} TFLOPs"),
            line("Infinity-8B (`num_chunks=8`: 5 layers each)", eight, num(eight["baseline"]["total_tflops"])),
            line("HART-0.7B", hart, num(hart["baseline"]["total_tflops"]), variant=False),
        ]
    )


def _arvar() -> str:
    r = rows_of("infinity-2b")
    labels = {
        "baseline": "baseline",
        "arvar": "**preset**: BH -2, AR -1 r = 0.75, M = 3, N = 2",
        "arvar:branch_halving_scales=[-2,-1]": "BH -2 and -1, AR -1 (the paper's 1.60x HART point)",
        "arvar:branch_halving_scales=[]": "AR only (`branch_halving_scales=()`)",
        "arvar:pruned_scales=[]": "BH only (`pruned_scales=()`)",
        "arvar:pruned_scales=[-2,-1]": "BH -2, AR -2 and -1",
        "arvar:branch_halving_scales=[-3,-2,-1],pruned_scales=[-2,-1]": "BH -3, -2 and -1, AR -2 and -1",
    }
    lines = ["| setting | total TFLOPs | transformer TFLOPs | vs baseline |", "| --- | --- | --- | --- |"]
    for method, label in labels.items():
        row, bold = r[method], method == "arvar"
        total, ratio = num(row["total_tflops"]), times(row["ratio"], "x")
        if bold:
            total, ratio = f"**{total}**", f"**{ratio}**"
        lines.append(f"| {label} | {total} | {num(row['transformer_tflops'])} | {ratio} |")
    return "\n".join(lines)


def _depthvar() -> str:
    out = load_record("flops_infinity_2b_depthvar")["output"]
    r = rows_of("infinity-2b")
    late = [s for s in out["per_scale"] if s["h"] in (32, 40, 48, 64)]
    sides = lambda m: " / ".join(num(s[m]) for s in late)  # noqa: E731
    early = lambda m: ", ".join(num(s[m]) for s in out["per_scale"] if s["h"] in (20, 24))  # noqa: E731
    lines = [
        "| setting | total TFLOPs | transformer TFLOPs | FLOPs ratio | transformer TFLOPs at sides 32 / 40 / 48 / 64 "
        f"(baseline {sides('baseline')}) | paper latency |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    rows = [
        ("baseline", "baseline", "", "2706 ms"),
        ("depthvar", "`depthvar` (R = 9)", sides("depthvar"), "1622 ms (1.7x)"),
        ("depthvar:reference_scale=7", "`depthvar:reference_scale=7`",
         f"{sides('depthvar:reference_scale=7')} (sides 20, 24: {early('depthvar:reference_scale=7')})",
         "869 ms (3.1x)"),
        ("depthvar:min_depth=0", "`depthvar:min_depth=0` (R = 9)", "", ""),
        ("depthvar:reference_scale=10", "`depthvar:reference_scale=10`", "", ""),
        ("depthvar:reference_scale=11", "`depthvar:reference_scale=11`", "", ""),
    ]  # fmt: skip
    for method, label, per_side, paper in rows:
        row, bold = r[method], method in ("depthvar", "depthvar:reference_scale=7")
        total, ratio = num(row["total_tflops"]), times(row["ratio"], "x")
        if bold:
            total, ratio = f"**{total}**", f"**{ratio}**"
        lines.append(f"| {label} | {total} | {num(row['transformer_tflops'])} | {ratio} | {per_side} | {paper} |")
    return "\n".join(lines)


# the commands' own text output, rendered from their records by the commands' own formatters
def _command_output(name: str, formatter: Callable[[dict], str]) -> str:
    return "\n".join(["```", formatter(load_record(name)["output"]), "```"])


def _infinity_report(name: str) -> str:
    from diffusers_var_accel.lab.bench.infinity_flops import format_report

    return _command_output(name, format_report)


def _hart_report(name: str) -> str:
    from diffusers_var_accel.lab.bench.hart_flops import format_hart_report

    return _command_output(name, format_hart_report)


def _infinity_comparison(name: str) -> str:
    from diffusers_var_accel.lab.bench.infinity_flops import format_comparison

    return _command_output(name, format_comparison)


def _hart_comparison(name: str) -> str:
    from diffusers_var_accel.lab.bench.hart_flops import format_hart_comparison

    return _command_output(name, format_hart_comparison)


def _paper(row: dict) -> List[str]:
    """The paper's TFLOPs and ratio cells of a summary row ("-" where no paper publishes the setting)."""
    if not row.get("paper_tflops"):
        return ["-", "-"]
    return [num(row["paper_tflops"]), times(row["paper_ratio"], "x")]


def _method_table(
    model: str, labels: Dict[str, str], columns: str, bold: Sequence[str] = (), heads: Sequence[str] = ()
) -> str:
    """A markdown table of ``model``'s summary rows: ``columns`` is ``"benchmarks"`` (total, ratio, paper),
    ``"infinity"`` (total, transformer, ratio, paper) or ``"hart"`` (total, transformer, diffusion head, decoder,
    ratio, paper); the rows in ``labels``' order, ``bold`` methods with their total and ratio in bold; ``heads``
    replaces the column heads."""
    r = rows_of(model)
    heads_of_columns = {
        "benchmarks": ["method", "TFLOPs (ours)", "speed-up (ours)", "paper TFLOPs", "paper speed-up"],
        "infinity": ["setting", "total TFLOPs", "transformer TFLOPs", "ratio", "paper TFLOPs", "paper ratio"],
        "hart": ["setting", "total TFLOPs", "transformer", "diffusion head", "decoder", "ratio", "paper TFLOPs",
                 "paper ratio"],
    }[columns]  # fmt: skip
    heads = list(heads) or heads_of_columns
    lines = ["| " + " | ".join(heads) + " |", "| --- |" + " ---: |" * (len(heads) - 1)]
    for method, label in labels.items():
        row = r[method]
        total, ratio = num(row["total_tflops"]), times(row["ratio"], "x")
        if method in bold:
            total, ratio = f"**{total}**", f"**{ratio}**"
        if columns == "benchmarks":
            parts = [total, ratio]
        elif columns == "infinity":
            parts = [total, num(row["transformer_tflops"]), ratio]
        else:
            parts = [
                total,
                num(row["transformer_tflops"]),
                num(row["diffusion_tflops"]),
                num(row["vae_tflops"]),
                ratio,
            ]
        lines.append("| " + " | ".join([label, *parts, *_paper(row)]) + " |")
    return "\n".join(lines)


_BENCHMARKS_2B = {
    "baseline": "baseline",
    "fastvar": "FastVAR (preset: prune 32/40, skip 48/64)",
    "fastvar:skip_last_scales=false": "FastVAR without the skip",
    "lazyvar": "LazyVAR (preset)",
}


#: The conventions of ``var-accel flops --model hart-0.7b --conventions`` as docs/flops.md names them (bold: the real
#: count and the one that reproduces the papers' saving).
_HART_CONVENTIONS = {
    "real count: attention over the KV cache + diffusion head + decoder": (
        "**ours (real count)**: attention over the KV cache + diffusion head + decoder"
    ),
    "transformer only (real attention)": "transformer only (real attention)",
    "transformer + diffusion head (no decoder)": "transformer + diffusion head (no decoder)",
    "self-attention to the context + current pass only": "self-attention to the 300 context keys + the current pass only",
    "self-attention within the current pass only": "self-attention within the current pass only",
    "attention kernels at half weight (1 per MAC)": "attention kernels at half weight (1 per MAC)",
    "no attention kernels (linear + conv): diffusion head + decoder": (
        "**no attention kernels** (linear + conv): diffusion head + decoder"
    ),
    "no attention kernels, no decoder": "no attention kernels, no decoder",
    "no attention kernels, transformer only": "no attention kernels, transformer only",
    "real count in MACs": "real count in MACs",
}


def _hart_conventions() -> str:
    """docs/flops.md's HART convention table: the papers' row (LazyVAR's table, constants of hart_flops), every
    convention of the ``--conventions`` record, and the no-CFG real count of its own record."""
    from diffusers_var_accel.lab.bench.hart_flops import HART_PAPER_TFLOPS

    rows = load_record("conventions_hart_0.7b")["output"]["conventions"]
    methods = [m for m in rows[0]["totals"] if m != "baseline"]
    named = {
        "fastvar": "FastVAR",
        "lazyvar": "LazyVAR",
        "depthvar": "DepthVAR",
        "arvar": "ARVAR",
        "stagevar": "StageVAR",
    }
    compared = ["fastvar", "lazyvar"]  # the methods the papers' table has
    head = ["convention (HART-0.7B, 1024x1024, CFG, 2 FLOPs per MAC unless stated)", "baseline"]
    head += (
        [named[m] for m in methods] + [f"ratio {named[m]}" for m in compared] + [f"saved {named[m]}" for m in compared]
    )
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    paper = HART_PAPER_TFLOPS["hart-0.7b"]
    bold = lambda x: f"**{x}**"  # noqa: E731
    cells = [bold(num(paper["baseline"]))] + [bold(num(paper[m])) if paper.get(m) else "-" for m in methods]
    cells += [bold(times(paper["baseline"] / paper[m], "x")) for m in compared]
    cells += [bold(num(paper["baseline"] - paper[m])) for m in compared]
    lines.append("| " + " | ".join(["**papers** (LazyVAR's table)", *cells]) + " |")
    for row in rows:
        label = _HART_CONVENTIONS[row["convention"]]
        saved = [num(row["saved"][m]) for m in compared]
        if label.startswith("**no attention"):
            saved = [bold(x) for x in saved]
        cells = [num(row["totals"]["baseline"])] + [num(row["totals"][m]) for m in methods]
        cells += [times(row["ratios"][m], "x") for m in compared] + saved
        lines.append("| " + " | ".join([label, *cells]) + " |")
    no_cfg = num(load_record("report_hart_0.7b_no_cfg")["output"]["total_tflops"])
    lines.append("| no CFG (1 row), real count | " + no_cfg + " |" + " |" * (len(head) - 2))
    return "\n".join(lines)


# the embedded model's calibrated frontier (docs/calibration.md): rendered from the JSON that
# scripts/calibration_frontier.py and scripts/frontier_unseen.py write (each names its command in that page)
FRONTIER = ROOT / "benchmarks" / "calibration"
#: file -> what it holds: the lenient scorer's quiet run (its CPU speed-ups), the strict scorer on the held-out-by-seed
#: prompts (every row), and the string-disjoint test set (every row but DepthVAR's; DepthVAR's rows in the second).
FRONTIER_FILES = {
    "lenient": "embedded_frontier_heldout.json",
    "strict": "embedded_frontier_heldout_strict.json",
    "unseen": "embedded_frontier_unseen.json",
    "unseen_depthvar": "embedded_frontier_unseen_depthvar.json",
}
_METHOD_ORDER = ["lazyvar", "fastvar", "depthvar", "arvar", "lazyvar+arvar", "fastvar+arvar", "depthvar+arvar",
                 "lazyvar+depthvar", "stagevar"]  # fmt: skip


def frontier_rows(kind: str) -> List[dict]:
    """The rows of one frontier JSON; a missing or corrupted file fails naming it."""
    path = FRONTIER / FRONTIER_FILES[kind]
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a readable frontier record ({err})") from err
    if not isinstance(rows, list) or not rows or rows[0].get("name") != "baseline":
        raise ValueError(f"{path}: expected a list of rows whose first is the baseline")
    return rows


def _scales(values: Sequence[int]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def describe_setting(method: str, settings: dict) -> str:
    """A calibrated setting in the frontier table's words (one method; a composition joins its members')."""
    if "+" in method:
        return "; ".join(f"{m}: {describe_setting(m, settings[m])}" for m in method.split("+"))
    if method == "lazyvar":
        mode = "one pass" if settings["parallel_decoding"] else "scale by scale"
        return f"group {_scales(settings['group_scales'])}, keep {_scales(settings['keep_ratios'])}, {mode}"
    if method == "fastvar":
        ratio = settings["prune_ratios"][0]
        layers = settings["pruned_layers"]
        layers = "all" if layers is None else f"{layers[0]}..{layers[1] - 1}"
        skip = ", skip last" if settings["skip_last_scales"] else ""
        return f"prune {_scales(settings['prune_scales'])} r={ratio:g}, layers {layers}{skip}"
    if method == "depthvar":
        start = f" from scale {settings['start_scale']}" if settings.get("start_scale") is not None else ""
        blending = "on" if settings["code_blending"] else "off"
        return f"R={settings['reference_scale']}{start}, rotation {settings['rotation_step']:g}, blending {blending}"
    if method == "arvar":
        text = f"halve {_scales(settings['branch_halving_scales'])}"
        if settings["pruned_scales"]:
            text += f", prune {_scales(settings['pruned_scales'])} at {settings['prune_ratios'][0]:g}"
        return text
    if method == "stagevar":
        projection = "no projection" if not settings["projected_scales"] else f"project {settings['projected_scales']}"
        return (
            f"unguided {_scales(settings['unconditional_scales'])}, skip {_scales(settings['skipped_scales'])}, "
            f"{projection}"
        )
    raise ValueError(f"no description for method {method!r}")


def _chosen_by(row: dict) -> str:
    """``ssim@1.5x`` -> ``SSIM 1.5×``, every selection that picked the setting."""
    if not row.get("selected_by"):
        return "–"
    words = []
    for selection in row["selected_by"]:
        metric, budget = selection.split("@")
        words.append(f"{'SSIM' if metric == 'ssim' else metric} {budget.rstrip('x')}×")
    return ", ".join(words)


def _key(row: dict) -> tuple:
    return (row.get("method"), json.dumps(row.get("settings"), sort_keys=True), row.get("source"))


def _percent(x) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


#: Paper presets whose setting changed after the lenient run: DepthVAR's default rotation step went 0 -> 0.25, and
#: the preset takes the default, so that run's speed-up and accuracy are not this setting's.
_CHANGED_SINCE_LENIENT_RUN = {"infinity-2b/depthvar"}


def _frontier() -> str:
    """docs/calibration.md's frontier table: every setting, with both scorers on the held-out-by-seed prompts and
    the strict one on the string-disjoint test set."""
    lenient = {_key(r): r for r in frontier_rows("lenient")}
    unseen = {_key(r): r for kind in ("unseen", "unseen_depthvar") for r in frontier_rows(kind)}
    strict = frontier_rows("strict")
    order = {m: i for i, m in enumerate(_METHOD_ORDER)}
    calibrated = sorted(
        (r for r in strict if r.get("method")),
        key=lambda r: (order[r["method"]], r["flops_ratio"]),
    )
    rows = [strict[0], *calibrated, *(r for r in strict[1:] if not r.get("method"))]
    head = ["method", "chosen by (budget)", "setting", "counted FLOPs ratio", "CPU speed-up (quiet run)",
            "held-out SSIM", "held-out accuracy, strict", "held-out accuracy, lenient",
            "string-disjoint accuracy, strict", "string-disjoint SSIM"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "| --- | --- | --- |" + " ---: |" * (len(head) - 3)]
    for row in rows:
        old, new = lenient.get(_key(row)), unseen.get(_key(row))
        if row.get("source") in _CHANGED_SINCE_LENIENT_RUN:
            old = None
        if row["name"] == "baseline":
            method, setting = "baseline", "–"
        elif row.get("method"):
            method, setting = row["method"], describe_setting(row["method"], row["settings"])
        else:
            method, setting = f"`{row['source']}` (paper preset)", "–"
        cells = [
            method,
            _chosen_by(row),
            setting,
            times(row["flops_ratio"]),
            "–" if old is None else times(old["speedup"]),
            "1.000" if row["name"] == "baseline" else f"{row['heldout_ssim']:.3f}",
            _percent(row["heldout_accuracy"]),
            "–" if old is None else _percent(old["heldout_accuracy"]),
            "–" if new is None else _percent(new["unseen_accuracy"]),
            "–" if new is None else ("1.000" if row["name"] == "baseline" else f"{new['unseen_ssim']:.3f}"),
        ]
        if row["name"] == "baseline":
            cells[6], cells[8] = f"**{cells[6]}**", f"**{cells[8]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# memory: docs/memory.md's counted peaks, recipes and int8 KV figures, from ``var-accel memory --json FILE``
# ---------------------------------------------------------------------------------------------------------------------
#: ``var-accel memory`` writes its rows to a file, not to stdout: a memory record's command names it ``FILE`` (the
#: record's ``output`` is that file's JSON, ``{"torch", "rows"}``); :func:`run_memory_command` passes a temporary one.
MEMORY_FILE = "FILE"
MEMORY_MODELS = {"infinity-2b": "Infinity-2B", "infinity-8b": "Infinity-8B", "hart-0.7b": "HART-0.7B"}
#: Each model's low-memory recipe as ``var-accel memory`` flags (the families' ``BUDGET_RECIPES``) and its target.
MEMORY_RECIPES = {
    "infinity-2b": (["--accel", "lazyvar", "--offload", "model", "--tiling"], "8 GB"),
    "infinity-8b": (["--accel", "lazyvar", "--weights", "int8", "--offload", "model", "--tiling"], "16 GB"),
    "hart-0.7b": (["--accel", "lazyvar", "--offload", "model", "--tiling"], "6 GB"),
}


def _memory(model: str, *flags: str) -> List[str]:
    return ["memory", "--model", model, *flags, "--json", MEMORY_FILE]


def _memory_records(model: str) -> Dict[str, List[str]]:
    """One command per row of the table, except the first: without recipe flags the command counts every documented
    recipe of the model (12 rows); ``--dtype bfloat16`` (the default) asks for the baseline alone."""
    key, recipe = "memory_" + model.replace("-", "_"), MEMORY_RECIPES[model][0]
    return {
        f"{key}_recipes": _memory(model),
        f"{key}_group_block": _memory(model, "--accel", "lazyvar", "--offload", "group-block"),
        f"{key}_group_leaf": _memory(model, "--accel", "lazyvar", "--offload", "group-leaf"),
        f"{key}_kv_int8": _memory(model, "--kv", "int8"),
        f"{key}_lazyvar_kv_int8": _memory(model, "--accel", "lazyvar", "--kv", "int8"),
        f"{key}_batch4": _memory(model, "--dtype", "bfloat16", "--batch-size", "4"),
        f"{key}_recipe_batch4": _memory(model, *recipe, "--batch-size", "4"),
        f"{key}_recipe_kv_int8": _memory(model, *recipe, "--kv", "int8"),
    }


MEMORY_RECORDS: Dict[str, List[str]] = {
    name: args for model in MEMORY_MODELS for name, args in _memory_records(model).items()
}


def run_memory_command(args: Sequence[str]) -> dict:
    """The JSON that ``var-accel <args>`` writes to its ``--json`` file (``FILE`` in ``args``, a temporary file here)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "rows.json")
        done = subprocess.run(
            [sys.executable, "-m", "diffusers_var_accel", *(path if a == MEMORY_FILE else a for a in args)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"var-accel {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
        return json.loads(Path(path).read_text())


def memory_rows() -> Dict[tuple, dict]:
    """Every recorded ``var-accel memory`` row, by ``(model, label, batch_size)`` (the table's first three columns)."""
    rows, source = {}, {}
    for name in MEMORY_RECORDS:
        for row in load_record(name)["output"]["rows"]:
            key = (row["model"], row["label"], row["batch_size"])
            if key in rows and rows[key] != row:  # two commands counted one setting: they must agree
                raise ValueError(f"records {source[key]} and {name} disagree on {key}")
            rows[key], source[key] = row, name
    return rows


def _recipe_label(model: str) -> str:
    """The label ``var-accel memory`` gives ``model``'s low-memory recipe (:data:`MEMORY_RECIPES`)."""
    weights = ", int8 weights" if "--weights" in MEMORY_RECIPES[model][0] else ""
    return f"lazyvar, bfloat16{weights}, model offload, tiled decode"


def _memory_order(model: str) -> List[tuple]:
    """The rows of the counted-peaks table of ``model``, in the page's order."""
    recipe, lazy = _recipe_label(model), "lazyvar, bfloat16"
    batch1 = ["baseline, bfloat16", recipe, lazy, f"{lazy}, int8 weights", f"{lazy}, float8 weights"]
    batch1 += [f"{lazy}, model offload", f"{lazy}, group-block offload +streams", f"{lazy}, group-block offload"]
    batch1 += [
        f"{lazy}, group-leaf offload",
        *(f"{m}, bfloat16" for m in ("fastvar", "depthvar", "arvar", "stagevar")),
    ]
    batch1 += [f"{lazy}, tiled decode", "baseline, bfloat16, int8 KV", f"{lazy}, int8 KV"]
    return [(model, label, 1) for label in batch1] + [(model, "baseline, bfloat16", 4), (model, recipe, 4)]


def _memory_peaks() -> str:
    """docs/memory.md "Counted peaks at 1024x1024": the rows as ``var-accel memory`` itself prints them."""
    from diffusers_var_accel.lab.bench.memory import format_memory_table

    rows = memory_rows()
    return format_memory_table([rows[key] for model in MEMORY_MODELS for key in _memory_order(model)])


def gib(nbytes: int) -> str:
    """A counted byte figure in GiB (2^30), to two decimals as ``var-accel memory`` prints it."""
    return num(nbytes / 1024**3)


def _memory_recipes() -> str:
    rows = memory_rows()
    lines = ["| model | recipe | counted peak | target | bf16 baseline |", "| --- | --- | ---: | ---: | ---: |"]
    for model in ("infinity-2b", "hart-0.7b", "infinity-8b"):
        recipe = rows[(model, _recipe_label(model), 1)]
        parts = ["LazyVAR", "int8 weights" if recipe["weights"] == "int8" else None, "model offload", "tiled decode"]
        lines.append(
            f"| {MEMORY_MODELS[model]} | {' + '.join(p for p in parts if p)} | {gib(recipe['peak_bytes'])} GiB | "
            f"{MEMORY_RECIPES[model][1]} | {gib(rows[(model, 'baseline, bfloat16', 1)]['peak_bytes'])} GiB |"
        )
    return "\n".join(lines)


def _kv_pair(rows: Dict[tuple, dict], model: str, setting: str) -> tuple:
    """The bf16-KV row and the int8-KV row of ``setting`` (``baseline`` or ``lazyvar``) at batch 1."""
    label = f"{setting}, bfloat16"
    return rows[(model, label, 1)], rows[(model, f"{label}, int8 KV", 1)]


def _memory_kv_int8() -> str:
    rows = memory_rows()
    lines = [
        "| model | setting | KV cache GiB, bf16 → int8 | peak GiB, bf16 KV → int8 KV | at (int8 KV) |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for model in MEMORY_MODELS:
        for setting in ("baseline", "lazyvar"):
            bf16, int8 = _kv_pair(rows, model, setting)
            peak = f"{gib(bf16['peak_bytes'])} → {gib(int8['peak_bytes'])}"
            if int8["peak_phase"] != "next_scale_loop":  # the loop, where the cache is, as well
                loop = lambda r: gib(r["phases"]["next_scale_loop"]["peak_bytes"])  # noqa: E731
                peak += f" (loop {loop(bf16)} → {loop(int8)})"
            kv = f"{gib(bf16['kv_cache_bytes'])} → {gib(int8['kv_cache_bytes'])}"
            lines.append(f"| {model} | {setting} | {kv} | {peak} | {int8['peak_phase']} |")
    return "\n".join(lines)


def _memory_kv_int8_bytes() -> str:
    """The int8 KV cache's share of the bf16 one, and its counted bytes (a sentence of docs/memory.md)."""
    rows = memory_rows()
    pairs = {(m, s): _kv_pair(rows, m, s) for m in MEMORY_MODELS for s in ("baseline", "lazyvar")}
    shares = [int8["kv_cache_bytes"] / bf16["kv_cache_bytes"] for bf16, int8 in pairs.values()]
    counted = lambda m: " and ".join(f"{pairs[(m, s)][1]['kv_cache_bytes']:,}" for s in ("baseline", "lazyvar"))  # noqa: E731
    return _paragraph(
        f"The int8 cache is {num(100 * min(shares))} to {num(100 * max(shares))} % of the bf16 one (counted bytes of "
        f"the int8 cache, baseline and LazyVAR: Infinity-2B {counted('infinity-2b')}; Infinity-8B "
        f"{counted('infinity-8b')}; HART-0.7B {counted('hart-0.7b')})."
    )


def _paragraph(text: str) -> str:
    """A generated sentence wrapped as the pages wrap their prose (lines of at most 118 characters)."""
    import textwrap

    return textwrap.fill(text, width=118, break_long_words=False, break_on_hyphens=False)


def _memory_recipes_kv_int8() -> str:
    """Each recipe's peak without and with ``--kv int8`` added to its flags (a sentence of docs/memory.md)."""
    rows = memory_rows()
    parts = []
    for model in ("infinity-2b", "infinity-8b", "hart-0.7b"):
        bf16, int8 = rows[(model, _recipe_label(model), 1)], rows[(model, _recipe_label(model) + ", int8 KV", 1)]
        part = f"{MEMORY_MODELS[model]} {gib(bf16['peak_bytes'])} → {gib(int8['peak_bytes'])} GiB"
        if int8["peak_phase"] == "next_scale_loop":
            part += " (the loop's peak, where the cache is)"
        else:
            loop = lambda r: gib(r["phases"]["next_scale_loop"]["peak_bytes"])  # noqa: E731
            owner = {"text_encoding": "the text encoder's", "decode": "the decoder's"}[int8["peak_phase"]]
            part += f" (its peak is {owner}; the loop falls {loop(bf16)} → {loop(int8)})"
        parts.append(part)
    return _paragraph(f"Counted with `--kv int8` added to each recipe's flags: {', '.join(parts)}.")


def _memory_readme() -> str:
    """README.md's memory paragraph: the Infinity-2B recipe's peak against the bf16 baseline's."""
    rows = memory_rows()
    recipe, baseline = (
        rows[("infinity-2b", _recipe_label("infinity-2b"), 1)],
        rows[("infinity-2b", "baseline, bfloat16", 1)],
    )
    return (
        "**Infinity-2B within 8 GB** (counted, not yet measured on a GPU: `var-accel memory --model infinity-2b` counts\n"
        f"{gib(recipe['peak_bytes'])} GiB at 1024x1024 against the bf16 baseline's {gib(baseline['peak_bytes'])} GiB; "
        "HART-0.7B and Infinity-8B recipes in\n[docs/memory.md](docs/memory.md)):"
    )


#: docs/benchmarks.md "KV cache memory (counted from the plan)": each row's ``kv_cache_bytes`` (the plan-sized cache
#: at the real width and depth, what ``pipe.kv_cache_bytes`` counts). ``var-accel launches`` prints the same figure
#: but runs every preset only at the real depth (FastVAR prunes Infinity's layer 28), which takes many minutes here;
#: the memory records count it in seconds. The Infinity rows reuse the recipes records (bf16); HART's are fp16.
KV_METHODS = ("baseline", "fastvar", "lazyvar", "depthvar", "arvar", "lazyvar+depthvar")
KV_DTYPES = {"infinity-2b": "bfloat16", "infinity-8b": "bfloat16", "hart-0.7b": "float16"}
MEMORY_RECORDS.update(
    {
        "memory_infinity_2b_lazyvar_depthvar": _memory("infinity-2b", "--accel", "lazyvar+depthvar"),
        "memory_infinity_8b_lazyvar_depthvar": _memory("infinity-8b", "--accel", "lazyvar+depthvar"),
        **{
            f"memory_hart_0.7b_fp16_{m.replace('+', '_')}": _memory(
                "hart-0.7b", "--dtype", "float16", *(() if m == "baseline" else ("--accel", m))
            )
            for m in KV_METHODS
        },
    }
)
RECORDS.update(MEMORY_RECORDS)
#: The "before" column is historic, typed and not recounted: every method allocated the whole schedule's cache at
#: commit 0fca8e4 (``var-accel launches``' KV cache GB there).
KV_BEFORE = {"infinity-2b": "5.52 GB", "infinity-8b": "12.07 GB", "hart-0.7b": "2.88 GB"}
#: The cells with a target in the paragraph below the table, in bold.
KV_TARGETS = {
    ("infinity-2b", "baseline"),
    ("infinity-2b", "fastvar"),
    ("infinity-2b", "lazyvar"),
    ("hart-0.7b", "baseline"),
}


def _kv_cache() -> str:
    rows = memory_rows()
    lines = [
        "| model, dtype | before (every method) | baseline | FastVAR | LazyVAR | DepthVAR | ARVAR | LazyVAR+DepthVAR |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for model, dtype in KV_DTYPES.items():
        cells = []
        for method in KV_METHODS:
            cell = num(rows[(model, f"{method}, {dtype}", 1)]["kv_cache_bytes"] / 1e9)  # GB, as launches prints it
            cells.append(f"**{cell}**" if (model, method) in KV_TARGETS else cell)
        short = {"bfloat16": "bf16", "float16": "fp16"}[dtype]
        lines.append(f"| {MEMORY_MODELS[model]}, {short} | {KV_BEFORE[model]} | {' | '.join(cells)} |")
    return "\n".join(lines)


MEMORY_TABLES: Dict[str, Callable[[], str]] = {
    "memory_peaks": _memory_peaks,
    "memory_recipes": _memory_recipes,
    "memory_kv_int8": _memory_kv_int8,
    "memory_kv_int8_bytes": _memory_kv_int8_bytes,
    "memory_recipes_kv_int8": _memory_recipes_kv_int8,
    "memory_readme": _memory_readme,
    "kv_cache": _kv_cache,
}


# ---------------------------------------------------------------------------------------------------------------------
# Infinity conventions: docs/flops.md's three Infinity-2B convention tables, from the record of
# `var-accel flops --model infinity-2b --accel fastvar,lazyvar --conventions --json`
# ---------------------------------------------------------------------------------------------------------------------
_INFINITY_CONVENTIONS = "conventions_infinity_2b"
_INFINITY_CONVENTION_METHODS = {"baseline": "baseline", "fastvar": "FastVAR", "lazyvar": "LazyVAR"}

#: docs/flops.md's wording of the command's gap rows (by row key), the real count in bold.
_INFINITY_GAP = {
    "real": "**ours**: CFG (2 rows), 32 text tokens, transformer + VAE decode + text, FLOPs = 2 MAC",
    "macs": "same, counted in MACs",
    "no_cfg": "without CFG (1 row)",
    "transformer": "transformer only (no VAE decode, no text)",
    "padded": "cross-attention over 512 text tokens (if the T5 padding were kept; the official code drops it)",
    "t5": "+ T5 encoder on 512 padded tokens (what the official runner feeds T5)",
    "kv": "cross-attention text K/V recomputed in every pass (the official code) instead of once per call",
    "a'": "attention matmuls not counted (linear + conv only, for example a counter blind to fused SDPA)",
    "attention_macs": "attention matmuls counted as MACs (1 per MAC), everything else 2 per MAC",
    "a": "self-attention only within the current scale (the cached prefix not counted)",
    "a_transformer": "same, transformer only",
}

#: The candidate conventions whose docs/flops.md label is not the command's (bold: the real count, the closest).
_INFINITY_CONVENTION_LABELS = {
    "real": "**ours (real count)**: attention over the KV cache, VAE decode, 32 text tokens",
    "a'+kv+padded+t5x2": "**(a') + per-pass text K/V + 512 text tokens + (c) T5, 2 rows** (closest)",
}


def _bold(text: str) -> str:
    return f"**{text}**"


def _infinity_gap() -> str:
    """ "Gap to the paper's 101.58 TFLOPs": the baseline with one assumption changed per row, and its ratio to the
    paper's total (three decimals, as the command prints it)."""
    out = load_record(_INFINITY_CONVENTIONS)["output"]
    paper = out["paper"]["baseline"]
    lines = [
        "| variant (Infinity-2B, 1024x1024, batch 1) | TFLOPs | / 101.58 |",
        "| --- | ---: | ---: |",
    ]
    for row in out["gap"]:
        cells = [num(row["tflops"]), f"{row['tflops'] / paper:.3f}"]
        if row["key"] == "real":
            cells = [_bold(c) for c in cells]
        lines.append("| " + " | ".join([_INFINITY_GAP[row["key"]], *cells]) + " |")
    return "\n".join(lines)


def _infinity_per_scale_conventions() -> str:
    """ "Per scale, under three conventions": transformer TFLOPs per scale to three decimals (a skipped scale is 0),
    the totals in bold to two."""
    out = load_record(_INFINITY_CONVENTIONS)["output"]
    kinds = (("real", "real"), ("current_pass", "(a)"), ("no_attention", "(a')"))
    methods = _INFINITY_CONVENTION_METHODS
    head = ["scale", "h x w", "tokens"] + [f"{label} {kind}" for label in methods.values() for _, kind in kinds]
    lines = ["| " + " | ".join(head) + " |", "|" + " ---: |" * len(head)]
    for s in out["per_scale"]:
        cells = [str(s["scale_index"]), f"{s['h']}x{s['w']}", str(s["tokens"])]
        cells += ["0" if s[key][m] == 0 else f"{s[key][m]:.3f}" for m in methods for key, _ in kinds]
        lines.append("| " + " | ".join(cells) + " |")
    totals = [_bold(num(out["transformer"][key][m])) for m in methods for key, _ in kinds]
    lines.append(f"| {_bold('transformer')} | | | " + " | ".join(totals) + " |")
    return "\n".join(lines)


def _infinity_candidate_conventions() -> str:
    """ "Candidate conventions": every convention's totals, ratios, savings and error against the papers' totals
    (LazyVAR's table), the papers' row first."""
    out = load_record(_INFINITY_CONVENTIONS)["output"]
    paper = out["paper"]
    methods, compared = list(_INFINITY_CONVENTION_METHODS), ["fastvar", "lazyvar"]
    lines = [
        "| convention (Infinity-2B, 1024x1024, FLOPs = 2 MAC, CFG unless stated) | baseline | FastVAR | LazyVAR | "
        "ratio FastVAR | ratio LazyVAR | saved by FastVAR | saved by LazyVAR | error vs paper (B / F / L) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    cells = [num(paper[m]) for m in methods] + [times(paper["baseline"] / paper[m], "x") for m in compared]
    cells += [num(paper["baseline"] - paper[m]) for m in compared]
    lines.append("| " + " | ".join(["**papers** (LazyVAR's table)", *map(_bold, cells)]) + " | |")  # no error
    for row in out["conventions"]:
        totals = [num(row["totals"][m]) for m in methods]
        ratios = [times(row["ratios"][m], "x") for m in compared]
        saved = [num(row["saved"][m]) for m in compared]
        error = " / ".join(f"{100 * (row['totals'][m] / paper[m] - 1):+.1f}%" for m in methods)
        if row["key"] == "a'+kv+padded+t5x2":  # the closest: its totals, ratios and errors in bold
            totals, ratios, error = [_bold(c) for c in totals], [_bold(c) for c in ratios], _bold(error)
        label = _INFINITY_CONVENTION_LABELS.get(row["key"], row["convention"])
        lines.append("| " + " | ".join([label, *totals, *ratios, *saved, error]) + " |")
    return "\n".join(lines)


def _infinity_savings() -> str:
    """docs/flops.md, "What the numbers say" point 1: what FastVAR and LazyVAR save under each convention, against the
    papers' savings. Attention at half weight saves the mean of the real count's and (a')'s savings (the same linear
    work, half the attention kernels); MACs and no CFG save the same to two decimals (the record's rows)."""
    out = load_record("conventions_infinity_2b")["output"]
    rows = {r["key"]: r["saved"] for r in out["conventions"]}
    paper = {m: out["paper"]["baseline"] - out["paper"][m] for m in ("fastvar", "lazyvar")}
    half = {m: (rows["real"][m] + rows["a'"][m]) / 2 for m in paper}

    def vs_paper(saved: dict) -> str:
        cells = []
        for m in paper:
            change = 100 * (saved[m] / paper[m] - 1)
            cells.append(f"{change:+.1f}%" if abs(change) < 10 else f"{change:+.0f}%")
        return " / ".join(cells)

    labels = [
        ("real count", rows["real"]),
        ("(a) attention within the current pass", rows["a"]),
        ("attention kernels at half weight (1 per MAC)", half),
        ("(a') no attention kernels (any text length)", rows["a'"]),
        ("(a') with the official code's per-pass text K/V", rows["a'+kv"]),
        ("(a') with per-pass text K/V and 512 text tokens", rows["a'+kv+padded+t5"]),
    ]
    lines = ["| convention | FastVAR saves | LazyVAR saves | vs paper |", "| --- | ---: | ---: | --- |"]
    lines += [f"| {label} | {num(v['fastvar'])} | {num(v['lazyvar'])} | {vs_paper(v)} |" for label, v in labels]
    macs = rows["macs"]
    lines.append(f"| MACs, or no CFG | {num(macs['fastvar'])} | {num(macs['lazyvar'])} | half |")
    return "\n".join(lines)


#: block name -> its rendering (the records it reads are named inside).
TABLES: Dict[str, Callable[[], str]] = {
    "status_infinity_2b": lambda: _status_infinity(
        "infinity-2b", True, "Infinity-2B, 1024², CFG (counted, `var-accel flops`)"
    ),
    "status_infinity_8b": lambda: _status_infinity(
        "infinity-8b", False, "Infinity-8B, 1024², CFG (counted; the same presets)"
    ),
    "status_hart": lambda: _status_hart(with_paper=True),
    "index_infinity_2b": lambda: _status_infinity(
        "infinity-2b", False, "Infinity-2B, 1024², CFG (counted, `var-accel flops`)"
    ),
    "index_hart": lambda: _status_hart(with_paper=False),
    "flops_8b_vs_2b": _flops_8b_vs_2b,
    "flops_8b_per_scale": _flops_8b_per_scale,
    "stagevar_flops": _stagevar,
    "arvar_flops": _arvar,
    "depthvar_flops": _depthvar,
    "flops_infinity_2b_report": lambda: _infinity_report("report_infinity_2b"),
    "flops_infinity_2b_no_cfg_report": lambda: _infinity_report("report_infinity_2b_no_cfg"),
    "flops_infinity_2b_presets": lambda: _infinity_comparison("flops_infinity_2b_fastvar_lazyvar"),
    "flops_hart_report": lambda: _hart_report("report_hart_0.7b"),
    "flops_hart_presets": lambda: _hart_comparison("flops_hart_0.7b"),
    "flops_hart_conventions": _hart_conventions,
    "calibration_frontier": _frontier,
    "flops_infinity_2b_savings": _infinity_savings,
    "benchmarks_infinity_2b": lambda: _method_table("infinity-2b", _BENCHMARKS_2B, "benchmarks"),
    "benchmarks_hart": lambda: _method_table(
        "hart-0.7b",
        _HART_LABELS,
        "hart",
        heads=[
            "method",
            "TFLOPs (ours)",
            "transformer",
            "diffusion head",
            "decoder",
            "speed-up (ours)",
            "paper TFLOPs",
            "paper speed-up",
        ],
    ),  # fmt: skip
    "fastvar_infinity_2b": lambda: _method_table(
        "infinity-2b",
        {
            "baseline": "baseline",
            "fastvar": "`fastvar` (preset: prune 32/40, skip 48/64)",
            "fastvar:skip_last_scales=false": "`fastvar:skip_last_scales=false` (prune only)",
        },
        "infinity",
        bold=["fastvar"],
        heads=[
            "setting",
            "total TFLOPs",
            "transformer TFLOPs",
            "ratio",
            "paper TFLOPs (LazyVAR's table)",
            "paper ratio",
        ],
    ),
    "fastvar_hart": lambda: _method_table(
        "hart-0.7b", {"baseline": "baseline", "fastvar": "`fastvar` (preset)"}, "hart", bold=["fastvar"]
    ),
    "lazyvar_infinity_2b": lambda: _method_table(
        "infinity-2b", {"baseline": "baseline", "lazyvar": "`lazyvar` (preset)"}, "infinity", bold=["lazyvar"]
    ),
    "lazyvar_hart": lambda: _method_table(
        "hart-0.7b", {"baseline": "baseline", "lazyvar": "`lazyvar` (preset)"}, "hart", bold=["lazyvar"]
    ),
    **MEMORY_TABLES,
    # Infinity conventions
    "flops_infinity_2b_gap": _infinity_gap,
    "flops_infinity_2b_conventions_per_scale": _infinity_per_scale_conventions,
    "flops_infinity_2b_conventions": _infinity_candidate_conventions,
}

#: A generated block; inside a list item its markers and lines carry the item's indent.
BLOCK = re.compile(
    r"^(?P<indent>[ ]*)<!-- generated: (?P<name>[\w.-]+) -->\n(?P<body>.*?)^(?P=indent)<!-- end generated -->",
    re.S | re.M,
)


def _indented(text: str, indent: str) -> str:
    return "\n".join(indent + line if line else line for line in text.split("\n"))


def blocks(text: str) -> List[re.Match]:
    return list(BLOCK.finditer(text))


def render_page(text: str, page: str) -> str:
    """``text`` with every generated block replaced by its rendering; an unknown block name fails naming the page."""

    def fill(match: re.Match) -> str:
        name = match["name"]
        if name not in TABLES:
            raise ValueError(f"{page}: unknown generated block {name!r}; blocks: {sorted(TABLES)}")
        indent = match["indent"]
        return (
            f"{indent}<!-- generated: {name} -->\n{_indented(TABLES[name](), indent)}\n{indent}<!-- end generated -->"
        )

    return BLOCK.sub(fill, text)


def stale_blocks() -> List[str]:
    """``page: block`` for every generated block whose text is not the rendering of its records."""
    stale = []
    for page in PAGES:
        path = ROOT / page
        if not path.exists():
            continue
        text = path.read_text()
        for match in blocks(text):
            if (
                match["name"] not in TABLES
                or match["body"] != _indented(TABLES[match["name"]](), match["indent"]) + "\n"
            ):
                stale.append(f"{page}: {match['name']}")
    return stale


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("record", "write", "check"))
    parser.add_argument("names", nargs="*", help="record: the records to make again (default: all)")
    args = parser.parse_args(argv)
    if args.action == "record":
        for name in args.names or list(RECORDS):
            record(name)
            print(f"recorded docs/counts/{name}.json", file=sys.stderr)
        return 0
    if args.action == "write":
        for page in PAGES:
            path = ROOT / page
            if path.exists():
                text = path.read_text()
                new = render_page(text, page)
                if new != text:
                    path.write_text(new)
                    print(f"wrote {page}", file=sys.stderr)
        return 0
    stale = stale_blocks()
    for item in stale:
        print(f"stale: {item} (python scripts/docs_tables.py write)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
