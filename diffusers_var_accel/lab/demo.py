"""``var-accel demo``: the embedded model, its baseline and every acceleration preset, side by side, on the CPU.

For a handful of shapes prompts (one seed each), every method generates every prompt; the demo reports per method
the median time per image, its spread and its speed-up over the baseline (interleaved, after one untimed call per
method, in the same run; a note when a method's times spread widely), the
FLOPs of one generation (counted with ``torch.utils.flop_counter`` on the real call of the first prompt and seed, text
encoder and decoder included, with the counter of ``var-accel bench`` (:func:`~.bench.probe.make_flop_counter`,
which also counts PyTorch's CPU attention kernel), so both commands give the same FLOPs for the same model, method,
prompt and size), PSNR and SSIM against the baseline image of the same prompt and seed, and the shapes scorer's
accuracy. It writes ``report.json`` (strict JSON: an infinite PSNR, identical images, is the string ``"inf"``),
``grid.png`` (one row per method, one column per prompt, captioned) and prints a table; progress goes to stderr.
"""

from __future__ import annotations

import json
import statistics
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

from diffusers_var_accel.schedulers.registry import default_method_specs

#: The baseline and every registered method (read at import; ``run_demo(methods=None)`` reads the registry at the call).
DEFAULT_METHODS = default_method_specs()


def default_prompts(n: int) -> List[str]:
    """The first ``n`` held-out shapes prompts (categories interleaved)."""
    from diffusers_var_accel.lab.data.shapes import heldout_prompts

    return [p["prompt"] for p in heldout_prompts()[:n]]


#: Height of one text line in the grid's captions (PIL's default bitmap font), in pixels.
_LINE = 12


def _wrap(text: str, width_px: int) -> List[str]:
    return textwrap.wrap(text, width=max(4, width_px // 6), break_long_words=True) or [""]


def caption_grid(rows: List[List[Any]], row_labels: Sequence[str], column_labels: Sequence[str], cell: int):
    """The images as a grid: one row per ``row_labels`` entry (the method, on the left), one column per
    ``column_labels`` entry (the prompt, wrapped above its column)."""
    from PIL import Image, ImageDraw

    label_w = max(80, min(220, 6 * max(len(label) for label in row_labels) + 10))
    header_h = 8 + _LINE * max(len(_wrap(label, cell - 6)) for label in column_labels)
    columns = max(len(r) for r in rows)
    grid = Image.new("RGB", (label_w + cell * columns, header_h + cell * len(rows)), "white")
    draw = ImageDraw.Draw(grid)
    for j, label in enumerate(column_labels):
        for k, line in enumerate(_wrap(label, cell - 6)):
            draw.text((label_w + j * cell + 3, 4 + k * _LINE), line, fill="black")
    for i, (row, label) in enumerate(zip(rows, row_labels)):
        lines = _wrap(label, label_w - 8)
        top = header_h + i * cell + (cell - _LINE * len(lines)) // 2
        for k, line in enumerate(lines):
            draw.text((4, top + k * _LINE), line, fill="black")
        for j, image in enumerate(row):
            grid.paste(image.resize((cell, cell)), (label_w + j * cell, header_h + i * cell))
    return grid


def run_demo(
    prompts: Optional[Sequence[str]] = None,
    num_prompts: int = 6,
    methods: Optional[Sequence[str]] = None,
    seed: int = 0,
    repeats: int = 1,
    output_dir: str = "demo_outputs",
    pipe=None,
    progress: bool = True,
    overwrite: bool = False,
) -> Dict[str, Any]:
    """Run the demo and write its files; returns the report (also in ``report.json``).

    Args:
        prompts: shapes prompts (default: the first ``num_prompts`` held-out prompts).
        methods: ``"baseline"`` and acceleration specs (``load_acceleration``: preset names, ``name:key=value``,
            scheduler folders).
        seed: prompt ``i`` uses ``seed + i`` for every method.
        repeats: timed generations per (method, prompt); the median is reported.
        output_dir: where ``report.json`` and ``grid.png`` go.
        pipe: a pipeline (default: the embedded model).
        overwrite: replace the ``report.json`` and ``grid.png`` of an earlier demo in ``output_dir`` (without it,
            their presence is an error, before anything runs).

    Time is measured as ``var-accel bench`` measures it: one untimed call per method first (first-call work), then
    every (prompt, repeat) runs every method once, interleaved; each method's median and spread
    (``(max - min) / median`` of its timed calls) are reported, with a note when the spread is large.
    """
    from tqdm.auto import tqdm

    from diffusers_var_accel.lab.bench.probe import count_call_flops
    from diffusers_var_accel.lab.comparison import (
        UNSTEADY_SPREAD,
        paired_speedup,
        time_interleaved,
        time_spread,
        to_pil,
    )
    from diffusers_var_accel.lab.data.scorer import score
    from diffusers_var_accel.embedded import EMBEDDED_SAMPLING
    from diffusers_var_accel.pipelines.pipeline_loading import load_embedded_pipeline
    from diffusers_var_accel.lab.metrics import psnr, ssim
    from diffusers_var_accel.schedulers.specs import load_acceleration

    def stage(message: str) -> None:
        if progress:
            print(f"demo: {message}", file=sys.stderr, flush=True)

    out = Path(output_dir)
    earlier = [name for name in ("report.json", "grid.png") if (out / name).exists()]
    if earlier and not overwrite:
        raise FileExistsError(
            f"{out} holds an earlier demo's {' and '.join(earlier)}: pass --overwrite (overwrite=True) "
            "to replace them, or -o another folder"
        )
    if pipe is None:
        stage("loading the embedded model")
        pipe = load_embedded_pipeline()
    pipe.set_progress_bar_config(disable=True)
    prompts = list(prompts) if prompts else default_prompts(num_prompts)
    methods = list(default_method_specs() if methods is None else methods)
    if "baseline" not in methods:
        methods.insert(0, "baseline")
    # a method name stands for the pipeline's own preset (the embedded model's calibrated embedded/<method>)
    schedulers = {
        m: load_acceleration(m, pipe.model_family, preset_model=getattr(pipe, "preset_model", None)) for m in methods
    }
    kwargs = dict(EMBEDDED_SAMPLING)

    def generate(method: str, i: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed + i)
        return pipe(
            prompts[i], generator=generator, output_type="pt", acceleration=schedulers[method], **kwargs
        ).images

    stage(f"{len(methods)} methods x {len(prompts)} prompts x {repeats} repeats, after one untimed call per method")
    for m in methods:  # warm-up per method: first-call allocations, per-size plans, lazy imports
        generate(m, 0)
    bar = tqdm(total=len(prompts) * len(methods) * repeats, desc="demo", disable=not progress)
    # in rounds: per prompt and repeat, the baseline then every method, back to back (the speed-ups are per pair)
    times, images = time_interleaved(generate, methods, len(prompts), repeats, on_call=bar.update)
    bar.close()

    flops = {}
    for m in tqdm(methods, desc="counting FLOPs", disable=not progress):  # one call per method, under the counter
        flops[m] = count_call_flops(
            pipe, prompts[0], generator=torch.Generator().manual_seed(seed), acceleration=schedulers[m], **kwargs
        )
    rows, report_methods = [], {}
    for m in methods:
        fidelity_psnr = [float(psnr(images[m][i], images["baseline"][i])) for i in range(len(prompts))]
        fidelity_ssim = [float(ssim(images[m][i], images["baseline"][i])) for i in range(len(prompts))]
        correct = [
            bool(score(prompts[i], images[m][i][0].permute(1, 2, 0).numpy())["correct"]) for i in range(len(prompts))
        ]
        median = statistics.median(times[m])
        speedup, pair_spread = paired_speedup(times["baseline"], times[m])
        finite = [v for v in fidelity_psnr if v != float("inf")]
        report_methods[m] = dict(
            seconds_per_image_median=median,
            seconds_per_image=times[m],
            speedup=speedup,
            speedup_spread=pair_spread,
            unsteady=pair_spread > UNSTEADY_SPREAD,
            spread=time_spread(times[m]),
            gflops=flops[m] / 1e9,
            flops_ratio=flops["baseline"] / flops[m],
            psnr=fidelity_psnr,
            psnr_mean=(sum(finite) / len(finite)) if finite else float("inf"),
            ssim=fidelity_ssim,
            ssim_mean=sum(fidelity_ssim) / len(fidelity_ssim),
            scorer_correct=correct,
            scorer_accuracy=sum(correct) / len(correct),
        )
    out.mkdir(parents=True, exist_ok=True)
    rows = [[to_pil(images[m][i]) for i in range(len(prompts))] for m in methods]
    from diffusers_var_accel.files import atomic_file, remove_stale_temporaries, write_text_atomic

    remove_stale_temporaries(out)  # what a killed earlier run was writing

    with atomic_file(out / "grid.png") as tmp:
        caption_grid(rows, methods, prompts, cell=128).save(tmp)
    from diffusers_var_accel.lab.calibration import model_name

    report = dict(
        model=model_name(pipe),
        prompts=prompts,
        seeds=[seed + i for i in range(len(prompts))],
        sampling=kwargs,
        repeats=repeats,
        threads=torch.get_num_threads(),
        methods=report_methods,
        spread_notes=spread_notes(report_methods),
        notes="time: median s/image, interleaved, after one untimed call per method; spread: (max - min) / "
        "median of a method's timed calls; speed-up: the median of the per-pair ratios baseline / method (a pair: "
        "the baseline and the method on the same prompt, back to back), with their spread; unsteady: pairs that "
        f"spread by more than {UNSTEADY_SPREAD:.0%}; FLOPs: one real call (prompt 0, seed "
        "--seed) counted by torch.utils.flop_counter incl. text encoder and decoder, with var-accel bench's "
        "counter (the same FLOPs as bench for the same prompt, seed and size); PSNR/SSIM vs the baseline image "
        'of the same seed ("inf": identical images)',
    )
    from diffusers_var_accel.lab.bench.runner import json_safe

    write_text_atomic(out / "report.json", json.dumps(json_safe(report), indent=2, allow_nan=False))
    print(format_table(report))
    print(f"wrote {out / 'report.json'} and {out / 'grid.png'}")
    return report


def spread_notes(methods: Dict[str, Dict[str, Any]]) -> List[str]:
    """A note per method whose timed calls spread by more than
    :data:`~diffusers_var_accel.lab.comparison.LARGE_SPREAD` of their median (its speed-up is noisy)."""
    from diffusers_var_accel.lab.comparison import LARGE_SPREAD, spread_note

    return [
        spread_note(
            m,
            r["spread"],
            "the warm-up call uses the first prompt only; --repeats 3 or var-accel bench give a steadier figure",
        )
        for m, r in methods.items()
        if len(r["seconds_per_image"]) > 1 and r["spread"] > LARGE_SPREAD
    ]


def format_table(report: Dict[str, Any]) -> str:
    """The demo's Markdown table, then its notes on noisy times."""
    from diffusers_var_accel.lab.comparison import UNSTEADY_SPREAD

    lines = [
        "| method | s / image | spread | speed-up (per pair) | GFLOPs | FLOPs ratio | PSNR vs baseline (dB) | SSIM vs baseline | scorer accuracy |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for m, r in report["methods"].items():
        psnr_text = "inf" if r["psnr_mean"] == float("inf") else f"{r['psnr_mean']:.2f}"
        spread = f"{r['spread']:.0%}" if len(r["seconds_per_image"]) > 1 else "-"
        speedup = f"{r['speedup']:.2f}x"
        if m != "baseline" and len(r["seconds_per_image"]) > 1:
            speedup += f" ±{r['speedup_spread'] / 2:.0%}" + (" **unsteady**" if r["unsteady"] else "")
        lines.append(
            f"| {m} | {r['seconds_per_image_median']:.3f} | {spread} | {speedup} | {r['gflops']:.3f} | "
            f"{r['flops_ratio']:.2f}x | {psnr_text} | {r['ssim_mean']:.3f} | {r['scorer_accuracy']:.0%} |"
        )
    if report.get("threads"):
        lines += ["", f"timed with {report['threads']} torch CPU thread(s) (var-accel demo --threads N)"]
    lines += [
        "",
        "speed-up: median of the per-pair ratios (the baseline and the method on the same prompt, back to back); "
        f"unsteady: its pairs spread by more than {UNSTEADY_SPREAD:.0%}. The FLOPs ratio counts the arithmetic of "
        "matrix products, attention and convolutions; on this 64x64 model on a CPU that is about 60% of a call, the "
        "rest (element-wise operations, Python in the loop) is the same whatever a method skips, so the wall-clock "
        "speed-up stays below the FLOPs ratio (docs/benchmarks.md, Where the time goes).",
    ]
    notes = report.get("spread_notes") or []
    if notes:
        lines += [""] + [f"note: {n}" for n in notes]
    return "\n".join(lines)
