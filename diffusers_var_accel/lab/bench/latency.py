"""Latency of the baseline and acceleration presets, measured side by side in one run.

Every method runs the same prompts and seeds; the repeats are interleaved (baseline, method A, method B, baseline, ...)
so that machine drift cancels, warm-up runs are excluded, and CUDA is synchronised around each timing. The speed-up of
a method is the baseline's median latency divided by the method's, both from this run.

Usage::

    python -m diffusers_var_accel.lab.bench.latency                                    # tiny random-weight Infinity on the CPU
    python -m diffusers_var_accel.lab.bench.latency --accel baseline,fastvar,lazyvar --repeats 5 --height 1024 --width 1024
    python -m diffusers_var_accel.lab.bench.latency --model infinity-2b --device cuda --dtype bfloat16 --height 1024 --width 1024
    python -m diffusers_var_accel.lab.bench.latency --model tiny-hart --accel baseline,fastvar,lazyvar,depthvar,arvar
    python -m diffusers_var_accel.lab.bench.latency --model hart-0.7b --device cuda --dtype float16 --accel baseline,fastvar,lazyvar

Infinity: ``--model tiny`` (default) builds the real architecture at a tiny size with random weights (CPU, seconds);
``--model infinity-2b`` builds the real 2B configuration with random weights (for a GPU: no download needed).
HART: ``--model tiny-hart`` is a tiny random-weight HART (width 64, ``--tiny-depth`` blocks) on the real 14-scale
schedule of HART-0.7B; ``--model hart-0.7b`` the real 0.7B configuration (transformer, diffusion head, tokenizer)
with random weights. HART generates one size (``pipe.default_size``), so ``--height``/``--width`` may be omitted.
``--model <folder>`` loads an official HART folder (``llm/`` + ``tokenizer/``, through
``load_original_hart_pipeline``) or a converted (diffusers-format) Infinity or HART pipeline. Methods:
``baseline``, a preset name (``fastvar``, ``lazyvar``, ``depthvar``, ``arvar``; the model family's preset),
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

import torch

from diffusers_var_accel.schedulers.specs import load_acceleration, split_acceleration_specs


#: ``--model`` values that are not folders.
BUILT_IN_MODELS = ("tiny", "infinity-2b", "tiny-hart", "hart-0.7b")


def build_pipeline(
    model: str, device: str, dtype: torch.dtype, tiny_depth: int = 8, seed_device: str = "cpu", tiny_width: int = 64
):
    """A pipeline for timing: tiny random weights, a real config with random weights, or a folder.

    ``tiny`` / ``infinity-2b`` (Infinity), ``tiny-hart`` / ``hart-0.7b`` (HART), or a folder: an official HART
    folder (``llm/config.json``) or a diffusers-format pipeline (its ``model_index.json`` names the class). The random
    weights of a real configuration are drawn by a generator on ``seed_device`` (the GPU runner: on the GPU, with no
    host draw and pageable copy of gigabytes; the seed gives other values there than on the CPU). The tiny models
    have ``tiny_depth`` blocks of width ``tiny_width``.
    """
    from diffusers_var_accel.utils.tiny import randomize_weights_

    if model == "tiny":
        from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

        pipe = build_tiny_infinity_pipeline(seed=0, depth=tiny_depth, embed_dim=tiny_width, with_text_encoder=False)
        pipe = pipe.to(device)
        return pipe if dtype == torch.float32 else pipe.to(dtype=dtype)
    if model == "tiny-hart":
        from diffusers_var_accel.models.transformer_hart import HART_CONFIGS
        from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline

        pipe = build_tiny_hart_pipeline(
            seed=0,
            depth=tiny_depth,
            embed_dim=tiny_width,
            patch_nums=HART_CONFIGS["hart-0.7b"]["patch_nums"],
            with_text_encoder=False,
        ).to(device)
        return pipe if dtype == torch.float32 else pipe.to(dtype=dtype)
    if model == "hart-0.7b":
        from diffusers_var_accel import HARTHybridTokenizer, HARTPipeline, HARTTransformer
        from diffusers_var_accel.models.transformer_hart import HART_CONFIGS

        with torch.device(device):
            transformer = HARTTransformer(**HART_CONFIGS[model]).to(dtype)
            vae = HARTHybridTokenizer(
                vocab_size=4096,
                z_channels=32,
                ch=160,
                ch_mult=(1, 1, 2, 2, 4),
                v_patch_nums=HART_CONFIGS[model]["patch_nums"],
            ).to(dtype)
        generator = torch.Generator(seed_device).manual_seed(0)
        randomize_weights_(transformer, generator)
        randomize_weights_(vae, generator)
        return HARTPipeline(transformer=transformer.eval(), vae=vae.eval(), text_encoder=None, tokenizer=None)

    from diffusers_var_accel import InfinityBSQVAE, InfinityPipeline, InfinityTransformer
    from diffusers_var_accel.models.autoencoder_bsq import INFINITY_VAE_D32_CONFIG
    from diffusers_var_accel.models.transformer_infinity import INFINITY_CONFIGS

    if model in INFINITY_CONFIGS:
        with torch.device(device):
            transformer = InfinityTransformer(**INFINITY_CONFIGS[model]).to(dtype)
            vae = InfinityBSQVAE(**INFINITY_VAE_D32_CONFIG).to(dtype)
        generator = torch.Generator(seed_device).manual_seed(0)
        randomize_weights_(transformer, generator)
        randomize_weights_(vae, generator)
        return InfinityPipeline(transformer=transformer.eval(), vae=vae.eval(), text_encoder=None, tokenizer=None)
    folder = Path(model)
    if not folder.is_dir():
        raise ValueError(f"--model {model!r} is neither one of {list(BUILT_IN_MODELS)} nor a folder")
    official_hart = (folder / "llm" / "config.json").is_file() or (
        (folder / "config.json").is_file() and not (folder / "model_index.json").is_file()
    )  # the root or its llm/
    if official_hart:
        from diffusers_var_accel.pipelines.hart.convert import load_original_hart_pipeline

        return load_original_hart_pipeline(folder, torch_dtype=dtype).to(device)
    index = folder / "model_index.json"
    class_name = json.loads(index.read_text()).get("_class_name", "") if index.is_file() else ""
    if class_name == "HARTPipeline":
        from diffusers_var_accel import HARTPipeline

        return HARTPipeline.from_pretrained(folder, dtype=dtype).to(device)
    return InfinityPipeline.from_pretrained(folder, dtype=dtype).to(device)


def pipeline_inputs(
    pipe, batch_size: int, height: Optional[int], width: Optional[int], device: str, text_tokens: int = 32
) -> Dict[str, Any]:
    """The keyword arguments of every timed call: random text features (seed 0) of the model's shape and the size.

    Infinity: ``(B, text_tokens, text_channels)`` T5-like features at ``height x width`` (default 1024 x 1024).
    HART: ``(B, context_tokens, context_dim)`` Qwen2-like features at the model's one size ``pipe.default_size``
    (a different ``height``/``width`` is refused by the pipeline).
    """
    config = pipe.transformer.config
    g = torch.Generator("cpu").manual_seed(0)
    if pipe.model_family == "hart":
        size = pipe.default_size
        shape = (batch_size, config.context_tokens, config.context_dim)
        height, width = height or size, width or height or size
    else:
        shape = (batch_size, text_tokens, config.text_channels)
        height = height or 1024
        width = width or height
    embeds = torch.randn(*shape, generator=g).to(device=device, dtype=torch.float32)
    return {"prompt_embeds": embeds, "height": height, "width": width}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(
    pipe,
    methods: List[str],
    height: Optional[int],
    width: Optional[int],
    batch_size: int,
    repeats: int,
    warmup: int,
    device: str,
    text_tokens: int = 32,
) -> List[Dict[str, Any]]:
    """Time every method ``repeats`` times, interleaved; returns one record per method.

    ``height``/``width`` ``None``: 1024 x 1024 for Infinity, the model's one size for HART.
    """
    family = pipe.model_family
    schedulers = {m: load_acceleration(m, family) for m in methods}
    inputs = pipeline_inputs(pipe, batch_size, height, width, device, text_tokens)
    pipe.set_progress_bar_config(disable=True)

    def run(method: str) -> float:
        # the sampling RNG lives on the timed device, as in the official code (a CPU one moves HART's sampling there)
        generators = [torch.Generator(device).manual_seed(i) for i in range(batch_size)]
        _sync(device)
        start = time.perf_counter()
        pipe(**inputs, generator=generators, acceleration=schedulers[method], output_type="latent")
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
        lines.append(
            f"{r['method']:<34} {r['min_s']:>9.4f} {r['median_s']:>9.4f} {r['max_s']:>9.4f} {r['speedup_vs_first']:>8.2f}x {peak:>9}"
        )
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        default="tiny",
        help="tiny | infinity-2b | tiny-hart | hart-0.7b | an official HART folder | a converted pipeline folder",
    )
    parser.add_argument(
        "--tiny-depth",
        type=int,
        default=8,
        help="blocks of the tiny models (default 8: FastVAR's Infinity preset prunes layers 3..27, so >= 4)",
    )
    parser.add_argument("--accel", default="baseline", help="comma-separated methods; the first is the reference")
    parser.add_argument("--height", type=int, default=None, help="Infinity: default 1024; HART: its one size")
    parser.add_argument("--width", type=int, default=None, help="default: the height (HART: its one size)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    methods = split_acceleration_specs(args.accel)
    dtype = getattr(torch, args.dtype)
    try:
        pipe = build_pipeline(args.model, args.device, dtype, args.tiny_depth)
        size = pipeline_inputs(pipe, args.batch_size, args.height, args.width, "cpu")
        height, width = size["height"], size["width"]
        records = measure(pipe, methods, height, width, args.batch_size, args.repeats, args.warmup, args.device)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    device_name = (
        torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU ({torch.get_num_threads()} threads)"
    )
    info = {
        "model": args.model,
        "family": pipe.model_family,
        "height": height,
        "width": width,
        "batch_size": args.batch_size,
        "device": device_name,
        "dtype": args.dtype,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "results": records,
    }
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(
            format_table(
                records,
                f"{args.model} {height}x{width} batch {args.batch_size} on {device_name}, {args.dtype}, "
                f"{args.repeats} interleaved repeats after {args.warmup} warm-up",
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
