"""One-GPU runner: Infinity-2B and HART-0.7B with random weights at their real configurations, baseline against every
preset at 1024x1024, batch 1 and 4, with speed-up, counted TFLOPs and peak memory. Nothing is downloaded.

It reuses ``latency.py`` (``build_pipeline`` builds each model from its real config with seeded random weights;
``measure`` times the methods interleaved after a warm-up, CUDA-synchronised, with ``torch.cuda.max_memory_allocated``
per call) and ``flops.py`` (the FLOPs of one generation counted on meta tensors, per method). The timed call is the
next-scale loop as in ``latency.py``: random text features of the model's shape, ``output_type="latent"``, so text
encoder and decoder are excluded (they cost the same for every method). Random weights make the token choices
meaningless but keep every shape, so the times and FLOPs are those of the real architectures. The TFLOPs are those
of the whole generation with CFG (transformer and decoder, text encoder excluded; ``flops.md``), per image; the
table shows them per call (x batch size).

Usage (an estimated 3-5 minutes on one H200, not measured yet; the runner stops starting new blocks after
``--max-seconds``, default 450, and ``gpu.sh`` kills it at 8 minutes)::

    bash benchmarks/gpu.sh                         # = python benchmarks/gpu.py --json gpu_results.json
    python benchmarks/gpu.py --models infinity-2b --batch-sizes 1 --methods baseline,lazyvar
    python benchmarks/gpu.py --models tiny,tiny-hart --device cpu --size 256 --repeats 1 --warmup 0   # CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.latency import build_pipeline, measure
from diffusers_var_accel.schedulers.scheduling_var_base import split_acceleration_specs

DEFAULT_MODELS = ("infinity-2b", "hart-0.7b")
DEFAULT_METHODS = "baseline,fastvar,lazyvar,depthvar,arvar"
#: Weights dtype per model family, as the official inference (Infinity bf16, HART fp16).
FAMILY_DTYPES = {"infinity": torch.bfloat16, "hart": torch.float16}


def count_tflops_per_image(model: str, family: str, methods: List[str], height: int, width: int) -> Dict[str, Optional[float]]:
    """TFLOPs of one image per method (``flops.py`` on meta tensors, CFG on); ``None`` for models it does not know."""
    from benchmarks import flops

    out: Dict[str, Optional[float]] = {}
    for method in methods:
        accel = None if method == "baseline" else method
        if family == "infinity" and model in flops.MODEL_SPECS:
            out[method] = flops.count_infinity_flops(model, height, width, accel=accel)["total_tflops"]
        elif family == "hart" and model in flops.HART_TOKENIZER_CONFIGS:
            out[method] = flops.count_hart_flops(model, accel=accel)["total_tflops"]
        else:
            out[method] = None
    return out


def format_block(model: str, device_name: str, dtype: str, height: int, width: int, batch: int, repeats: int, warmup: int,
                 records: List[Dict[str, Any]], tflops: Dict[str, Optional[float]]) -> str:
    """One table per (model, batch size)."""
    lines = [f"{model} {height}x{width} batch {batch} on {device_name}, {dtype}, {repeats} interleaved repeats after {warmup} warm-up",
             f"{'method':<34} {'median s':>9} {'s/image':>9} {'speed-up':>9} {'TFLOPs':>9} {'FLOPs ratio':>11} {'peak GiB':>9}"]
    base_tflops = tflops.get(records[0]["method"])
    for r in records:
        t = tflops.get(r["method"])
        call_tflops = f"{t * batch:.2f}" if t is not None else "-"
        ratio = f"{base_tflops / t:.2f}x" if t and base_tflops else "-"
        peak = f"{r['peak_gib']:.2f}" if r["peak_gib"] is not None else "-"
        lines.append(f"{r['method']:<34} {r['median_s']:>9.4f} {r['median_s'] / batch:>9.4f} {r['speedup_vs_first']:>8.2f}x "
                     f"{call_tflops:>9} {ratio:>11} {peak:>9}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help="comma-separated latency.py models (default infinity-2b,hart-0.7b; tiny, tiny-hart for a smoke run)")
    parser.add_argument("--methods", default=DEFAULT_METHODS, help=f"comma-separated methods, baseline first (default {DEFAULT_METHODS})")
    parser.add_argument("--batch-sizes", default="1,4", help="comma-separated batch sizes (default 1,4)")
    parser.add_argument("--size", type=int, default=1024, help="Infinity image side (default 1024; HART makes its one size)")
    parser.add_argument("--repeats", type=int, default=3, help="timed interleaved rounds per block (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds of every method first (default 1)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="default: cuda if available, else cpu (only the tiny models are practical on a CPU)")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                        help="auto: bfloat16 for Infinity and float16 for HART on CUDA, float32 on the CPU")
    parser.add_argument("--max-seconds", type=float, default=450.0,
                        help="do not start a new (model, batch size) block after this many seconds (default 450)")
    parser.add_argument("--no-flops", action="store_true", help="skip the FLOP counts")
    parser.add_argument("--json", help="also write every record to this JSON file")
    args = parser.parse_args(argv)
    methods = split_acceleration_specs(args.methods)
    if not methods or methods[0] != "baseline":
        print(f"error: --methods must start with baseline (the speed-up reference), got {methods}", file=sys.stderr)
        return 2
    try:
        batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        print(f"error: --batch-sizes {args.batch_sizes!r}: expected comma-separated integers such as 1,4", file=sys.stderr)
        return 2
    start = time.perf_counter()
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU ({torch.get_num_threads()} threads)"
    print(f"GPU runner on {device_name}, torch {torch.__version__}: random weights, real configurations, no download", flush=True)
    blocks: List[Dict[str, Any]] = []
    skipped: List[str] = []
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        if time.perf_counter() - start > args.max_seconds:
            skipped.append(f"{model}: time budget spent")
            continue
        built = time.perf_counter()
        try:
            pipe = build_pipeline(model, args.device, torch.float32)
            family = pipe.model_family
            dtype = FAMILY_DTYPES[family] if args.dtype == "auto" and args.device.startswith("cuda") else (
                torch.float32 if args.dtype == "auto" else getattr(torch, args.dtype))
            if dtype != torch.float32:
                pipe = pipe.to(dtype=dtype)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        height = width = pipe.default_size if family == "hart" else args.size
        print(f"built {model} ({family}, {sum(p.numel() for p in pipe.transformer.parameters()) / 1e6:.0f}M transformer "
              f"parameters, {str(dtype).replace('torch.', '')}) in {time.perf_counter() - built:.1f} s", flush=True)
        tflops = {m: None for m in methods} if args.no_flops else count_tflops_per_image(model, family, methods, height, width)
        for batch in batch_sizes:
            if time.perf_counter() - start > args.max_seconds:
                skipped.append(f"{model} batch {batch}: time budget spent")
                continue
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
            records = measure(pipe, methods, height, width, batch, args.repeats, args.warmup, args.device)
            print(format_block(model, device_name, str(dtype).replace("torch.", ""), height, width, batch, args.repeats,
                               args.warmup, records, tflops), flush=True)
            blocks.append({"model": model, "family": family, "height": height, "width": width, "batch_size": batch,
                           "dtype": str(dtype).replace("torch.", ""), "records": records,
                           "tflops_per_image": tflops})
        del pipe
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    total = time.perf_counter() - start
    for line in skipped:
        print(f"skipped {line}")
    print(f"total {total:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device_name, "torch": torch.__version__, "repeats": args.repeats,
                                               "warmup": args.warmup, "total_seconds": total, "skipped": skipped,
                                               "blocks": blocks}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
