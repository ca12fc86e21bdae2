"""Latency of the baseline and acceleration presets, measured side by side in one run.

Every method runs the same prompts and seeds; the repeats are interleaved (baseline, method A, method B, baseline, ...)
so that machine drift cancels, warm-up runs are excluded, and CUDA is synchronised around each timing. The speed-up of
a method is the baseline's median latency divided by the method's, both from this run.

Usage::

    python benchmarks/latency.py                                    # tiny random-weight Infinity on the CPU
    python benchmarks/latency.py --accel baseline,fastvar,lazyvar --repeats 5 --height 1024 --width 1024
    python benchmarks/latency.py --model infinity-2b --device cuda --dtype bfloat16 --height 1024 --width 1024

``--model tiny`` (default) builds the real architecture at a tiny size with random weights (CPU, seconds);
``--model infinity-2b`` builds the real 2B configuration with random weights (for a GPU: no download needed);
``--model <folder>`` loads a converted pipeline. Methods: ``baseline``, a preset name (``fastvar``, ``lazyvar``, ...),
``name:key=value,...`` for overrides, or a scheduler config folder / JSON file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from diffusers_var_accel.schedulers.scheduling_var_base import load_acceleration, split_acceleration_specs


def build_pipeline(model: str, device: str, dtype: torch.dtype, tiny_depth: int = 8):
    """A pipeline for timing: tiny random weights, the real 2B config with random weights, or a converted folder."""
    from diffusers_var_accel import InfinityBSQVAE, InfinityPipeline, InfinityTransformer
    from diffusers_var_accel.models.autoencoder_bsq import INFINITY_VAE_D32_CONFIG
    from diffusers_var_accel.models.transformer_infinity import INFINITY_CONFIGS

    if model == "tiny":
        from diffusers_var_accel.utils.tiny import build_tiny_infinity_pipeline

        pipe = build_tiny_infinity_pipeline(seed=0, depth=tiny_depth, with_text_encoder=False).to(device)
        return pipe if dtype == torch.float32 else pipe.to(dtype=dtype)
    if model in INFINITY_CONFIGS:
        from diffusers_var_accel.utils.tiny import randomize_weights_

        with torch.device(device):
            transformer = InfinityTransformer(**INFINITY_CONFIGS[model]).to(dtype)
            vae = InfinityBSQVAE(**INFINITY_VAE_D32_CONFIG).to(dtype)
        generator = torch.Generator(device).manual_seed(0)
        randomize_weights_(transformer, generator)
        randomize_weights_(vae, generator)
        return InfinityPipeline(transformer=transformer.eval(), vae=vae.eval())
    return InfinityPipeline.from_pretrained(model, torch_dtype=dtype).to(device)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(pipe, methods: List[str], height: int, width: int, batch_size: int, repeats: int, warmup: int,
            device: str, text_tokens: int = 32) -> List[Dict[str, Any]]:
    """Time every method ``repeats`` times, interleaved; returns one record per method."""
    family = pipe.model_family
    schedulers = {m: load_acceleration(m, family) for m in methods}
    D = pipe.transformer.config.text_channels
    g = torch.Generator("cpu").manual_seed(0)
    embeds = torch.randn(batch_size, text_tokens, D, generator=g).to(device=device, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)

    def run(method: str) -> float:
        generators = [torch.Generator("cpu").manual_seed(i) for i in range(batch_size)]
        _sync(device)
        start = time.perf_counter()
        pipe(prompt_embeds=embeds, height=height, width=width, generator=generators, acceleration=schedulers[method],
             output_type="latent")
        _sync(device)
        return time.perf_counter() - start

    for _ in range(warmup):
        for m in methods:
            run(m)
    times: Dict[str, List[float]] = {m: [] for m in methods}
    peak: Dict[str, Optional[float]] = {m: None for m in methods}
    for _ in range(repeats):
        for m in methods:
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            times[m].append(run(m))
            if device.startswith("cuda"):
                peak[m] = max(peak[m] or 0.0, torch.cuda.max_memory_allocated() / 2**30)
    base = statistics.median(times[methods[0]])
    return [
        {
            "method": m,
            "min_s": min(t),
            "median_s": statistics.median(t),
            "max_s": max(t),
            "speedup_vs_first": base / statistics.median(t),
            "peak_gib": peak[m],
            "repeats": len(t),
        }
        for m, t in times.items()
    ]


def format_table(records: List[Dict[str, Any]], header: str) -> str:
    lines = [header, f"{'method':<34} {'min s':>9} {'median s':>9} {'max s':>9} {'speed-up':>9} {'peak GiB':>9}"]
    for r in records:
        peak = f"{r['peak_gib']:.2f}" if r["peak_gib"] is not None else "-"
        lines.append(f"{r['method']:<34} {r['min_s']:>9.4f} {r['median_s']:>9.4f} {r['max_s']:>9.4f} {r['speedup_vs_first']:>8.2f}x {peak:>9}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny | infinity-2b | a converted pipeline folder")
    parser.add_argument("--tiny-depth", type=int, default=8,
                        help="blocks of the tiny model (default 8: FastVAR's preset prunes layers 3..27, so >= 4)")
    parser.add_argument("--accel", default="baseline", help="comma-separated methods; the first is the reference")
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    methods = split_acceleration_specs(args.accel)
    width = args.width or args.height
    dtype = getattr(torch, args.dtype)
    try:
        pipe = build_pipeline(args.model, args.device, dtype, args.tiny_depth)
        records = measure(pipe, methods, args.height, width, args.batch_size, args.repeats, args.warmup, args.device)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU ({torch.get_num_threads()} threads)"
    info = {"model": args.model, "height": args.height, "width": width, "batch_size": args.batch_size, "device": device_name,
            "dtype": args.dtype, "repeats": args.repeats, "warmup": args.warmup, "results": records}
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(format_table(records, f"{args.model} {args.height}x{width} batch {args.batch_size} on {device_name}, {args.dtype}, "
                                    f"{args.repeats} interleaved repeats after {args.warmup} warm-up"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
