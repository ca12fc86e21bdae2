"""Output files of the benchmark: the Markdown table, the plots (PNG) and the image grid."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np


def _fmt(value: Optional[float], spec: str, missing: str = "–") -> str:
    if value is None:
        return missing
    if isinstance(value, str):  # "inf"
        return value
    return format(value, spec)


def format_table(results: Dict[str, Any]) -> str:
    """One Markdown row per method: time, speed-up, FLOPs, memory, fidelity to the baseline, scorer accuracy."""
    memory_kind = results["run"].get("peak_memory_kind")
    mem_head = {"cuda_max_memory_allocated": "peak GPU GiB", "peak_rss": "peak RSS GiB"}.get(
        memory_kind, "peak memory"
    )
    has_scorer = any(r["scorer"]["accuracy"] is not None for r in results["methods"].values())
    head = [
        "method",
        "s / image (median)",
        "min – max s",
        "speed-up",
        "transformer GFLOPs",
        "VAE GFLOPs",
        "FLOPs ratio",
        mem_head,
        "KV cache MB",
        "PSNR dB",
        "SSIM",
        "LPIPS",
        "FID*",
    ] + (["scorer acc."] if has_scorer else [])
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for name, r in results["methods"].items():
        t, f, fid = r["seconds_per_image"], r["flops"], r["fidelity"]
        row = [
            name,
            _fmt(t["median"], ".4f"),
            f"{_fmt(t['min'], '.4f')} – {_fmt(t['max'], '.4f')}",
            _fmt(r["speedup"], ".2f") + "x" + (" unsteady" if r.get("unsteady") else ""),
            _fmt(f["transformer_gflops"], ".3f"),
            _fmt(f["vae_gflops"], ".3f"),
            _fmt(f["ratio"], ".2f") + ("x" if f["ratio"] is not None else ""),
            _fmt(r["peak_memory"]["peak_gib"], ".3f"),
            _fmt(None if r.get("kv_cache_bytes") is None else r["kv_cache_bytes"] / 1e6, ".2f"),
            _fmt(fid["psnr_mean"], ".2f"),
            _fmt(fid["ssim_mean"], ".4f"),
            _fmt(fid["lpips_mean"], ".4f"),
            _fmt(fid["fid_star"], ".3f"),
        ]
        if has_scorer:
            acc = r["scorer"]["accuracy"]
            row.append("–" if acc is None else f"{acc:.0%}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def format_markdown(results: Dict[str, Any]) -> str:
    """``results.md``: the run's settings, the table, the skipped metrics and the notes."""
    run = results["run"]
    out = [
        "# VAR acceleration benchmark",
        "",
        f"Model `{run['model']}` ({run['family']}, {run['height']}x{run['width']}) on {run['device_name']}, {run['dtype']}; "
        f"prompts: {run['prompt_source']} ({run['num_prompts']} of {run['prompts_in_source']}), seeds {run['seeds']}, "
        f"{run['num_items']} images per method; batch {run['batch_size']}, {run['warmup']} warm-up round(s), "
        f"{run['repeats']} interleaved repeats; {run['num_processes']} process(es).",
        "",
        f"Sampling: `{run['sampling']}`.",
        "",
        format_table(results),
        "",
    ]
    if results["skipped"]:
        out += ["Skipped:", ""] + [f"* **{k}**: {v}" for k, v in results["skipped"].items()] + [""]
    out += ["Notes:", ""] + [f"* {n}" for n in results["notes"]]
    return "\n".join(out) + "\n"


def require_matplotlib():
    """``matplotlib`` (the plots' one dependency, in the ``lab`` extra), or an ImportError saying how to install it."""
    try:
        import matplotlib
    except ImportError as err:
        raise ImportError(
            "the plots need matplotlib, which the library does not install: pip install 'diffusers-var-accel[lab]'"
        ) from err
    return matplotlib


def _figure(width: float, height: float):
    require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def plot_speedup_vs_fidelity(results: Dict[str, Any], path: Path) -> None:
    """Speed-up (x) against PSNR, SSIM and, when measured, LPIPS and FID* (y), one point per method."""
    methods = results["methods"]
    panels = [
        ("psnr_mean", "PSNR vs baseline (dB, higher = closer)"),
        ("ssim_mean", "SSIM vs baseline (higher = closer)"),
    ]
    for key, label in (
        ("lpips_mean", "LPIPS vs baseline (lower = closer)"),
        ("fid_star", "FID* vs baseline (lower = closer)"),
    ):
        if any(m["fidelity"][key] is not None for m in methods.values()):
            panels.append((key, label))
    fig = _figure(4.2 * len(panels), 3.8)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (key, label) in zip(axes, panels):
        for name, r in methods.items():
            y = r["fidelity"][key]
            if y is None or isinstance(y, str) or r["speedup"] is None:
                continue  # the baseline's PSNR is infinite
            ax.scatter([r["speedup"]], [y], s=36)
            ax.annotate(name, (r["speedup"], y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("speed-up over the baseline (median s / image)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    run = results["run"]
    fig.suptitle(
        f"{run['model']} on {run['device_name']}: speed-up vs fidelity ({run['num_items']} images per method)",
        fontsize=10,
    )
    fig.savefig(path)


def plot_scale_breakdown(results: Dict[str, Any], path: Path) -> None:
    """Stacked bars: median seconds of one image per segment (text encoder, each scale, decode) per method."""
    require_matplotlib()
    from matplotlib import colormaps

    methods = results["methods"]
    names = [n for n, r in methods.items() if r["per_scale"] is not None]
    if not names:
        return
    num_scales = max(len(methods[n]["per_scale"]["seconds"]) for n in names)
    cmap = colormaps["viridis"]
    fig = _figure(9.0, 0.6 * len(names) + 2.2)
    ax = fig.subplots()
    shapes: List[Any] = methods[names[0]]["per_scale"]["scale_shapes"]

    def scale_label(i: int) -> str:
        return f"scale {i} ({'x'.join(str(v) for v in shapes[i][-2:])})" if i < len(shapes) else f"scale {i}"

    for row, name in enumerate(names):
        p = methods[name]["per_scale"]
        left = 0.0
        parts = [("text encoder", p["text_encoder_seconds"], "#999999")]
        parts += [(scale_label(i), s, cmap(i / max(num_scales - 1, 1))) for i, s in enumerate(p["seconds"])]
        parts += [("decode", p["decode_seconds"], "#333333"), ("other", p["other_seconds"], "#dddddd")]
        for label, seconds, color in parts:
            ax.barh(
                row,
                seconds,
                left=left,
                color=color,
                edgecolor="white",
                linewidth=0.3,
                label=label if row == 0 else None,
            )
            left += seconds
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per image (median of the profiled calls)")
    ax.legend(fontsize=7, ncol=2, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title(
        "time per scale of one image (grouped scales are charged to their first scale; skipped scales ~0)", fontsize=9
    )
    fig.savefig(path)


def save_grid(rows: Dict[str, Sequence[np.ndarray]], path: Path, cell: int = 128) -> None:
    """One row per method, one column per image (uint8 HWC arrays), method names on the left."""
    from PIL import Image, ImageDraw

    if not rows or not any(len(r) for r in rows.values()):
        return
    label_w = 120
    cols = max(len(r) for r in rows.values())
    grid = Image.new("RGB", (label_w + cell * cols, cell * len(rows)), "white")
    draw = ImageDraw.Draw(grid)
    for i, (name, images) in enumerate(rows.items()):
        draw.text((4, i * cell + cell // 2 - 6), name[:18], fill="black")
        for j, image in enumerate(images):
            grid.paste(Image.fromarray(image).resize((cell, cell)), (label_w + j * cell, i * cell))
    grid.save(path)
