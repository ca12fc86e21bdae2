#!/usr/bin/env python
"""Fidelity of the int8 KV cache on the embedded model (docs/memory.md, "The int8 KV cache").

For the baseline and every embedded preset, each of the first ``--prompts`` held-out shapes prompts (``heldout_prompts``,
each with its own seed) is generated twice with the embedded sampling settings: with the KV cache in the attention's
dtype (float32 on the CPU) and with ``pipe.enable_kv_cache_quantization("int8")``. Prints, per method, PSNR and SSIM
of the int8 image against the float one (mean; ``inf``: identical), the shapes scorer's accuracy of both, and the KV
cache's bytes of both (``acceleration_summary()["kv_bytes"]``).

    python scripts/measure_kv_int8_fidelity.py [--prompts 16] [--methods baseline lazyvar ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch


def main(argv=None) -> int:
    from diffusers_var_accel.lab.data.scorer import score
    from diffusers_var_accel.lab.data.shapes import heldout_prompts
    from diffusers_var_accel.lab.metrics import psnr, ssim
    from diffusers_var_accel.pipelines.pipeline_loading import load_embedded_pipeline
    from diffusers_var_accel.schedulers.registry import default_method_specs
    from diffusers_var_accel.schedulers.specs import load_acceleration

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16, help="the first N held-out prompts (default 16)")
    parser.add_argument("--methods", nargs="+", default=None, help="default: baseline and every embedded preset")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)

    from diffusers_var_accel.embedded import EMBEDDED_SAMPLING

    pipe = load_embedded_pipeline()
    pipe.set_progress_bar_config(disable=True)
    entries = heldout_prompts()[: args.prompts]
    methods = args.methods or list(default_method_specs())
    if "baseline" not in methods:
        methods.insert(0, "baseline")
    rows = []
    for method in methods:
        scheduler = load_acceleration(method, pipe.model_family, preset_model=pipe.preset_model)
        images, kv_bytes = {}, {}
        for kv in (None, "int8"):
            if kv is None:
                pipe.disable_kv_cache_quantization()
            else:
                pipe.enable_kv_cache_quantization(kv)
            images[kv] = []
            for entry in entries:
                generator = torch.Generator().manual_seed(int(entry["seed"]))
                out = pipe(
                    entry["prompt"], generator=generator, output_type="pt", acceleration=scheduler, **EMBEDDED_SAMPLING
                )
                images[kv].append(out.images)
            kv_bytes[kv] = pipe.acceleration_summary()["kv_bytes"]
        pipe.disable_kv_cache_quantization()
        psnrs = [float(psnr(q, f)) for q, f in zip(images["int8"], images[None])]
        ssims = [float(ssim(q, f)) for q, f in zip(images["int8"], images[None])]
        accuracy = {
            kv: sum(bool(score(e["prompt"], im[0].permute(1, 2, 0).numpy())["correct"]) for e, im in zip(entries, ims))
            / len(entries)
            for kv, ims in images.items()
        }
        finite = [p for p in psnrs if math.isfinite(p)]
        rows.append(
            dict(
                method=method,
                psnr_mean=sum(finite) / len(finite) if finite else float("inf"),
                psnr_min=min(psnrs),
                identical=len(psnrs) - len(finite),
                ssim_mean=sum(ssims) / len(ssims),
                accuracy_float=accuracy[None],
                accuracy_int8=accuracy["int8"],
                kv_bytes_float=kv_bytes[None],
                kv_bytes_int8=kv_bytes["int8"],
            )
        )
        print(f"{method}: {rows[-1]}", file=sys.stderr, flush=True)
    print(f"embedded model, {len(entries)} held-out prompts (own seeds), int8 KV against the float32 KV cache")
    print(
        "| method | PSNR dB (mean) | PSNR dB (min) | SSIM (mean) | scorer accuracy float KV | int8 KV | KV bytes float | int8 |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['method']} | {r['psnr_mean']:.2f} | {r['psnr_min']:.2f} | {r['ssim_mean']:.4f} | "
            f"{r['accuracy_float']:.0%} | {r['accuracy_int8']:.0%} | {r['kv_bytes_float']} | {r['kv_bytes_int8']} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
