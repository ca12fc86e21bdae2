#!/usr/bin/env python
"""Fidelity of torchao weight quantisation on the embedded model (docs/memory.md, "Quantised weights: fidelity").

python scripts/quantization_fidelity.py [--prompts 64] [--json rows.json]

For the unquantised fp32 pipeline and int8 / float8 weight-only (transformer and text encoder, loaded with
``quantization_config``), for the baseline and each embedded preset: scorer accuracy on the first ``--prompts``
held-out prompts (held out by seed, each with its own seed), and PSNR / SSIM of each image against the unquantised
image of the same method, prompt and seed (mean over the prompts). The wall time of each evaluation is printed beside
it (one thread; the ratio quantised / unquantised of the same method).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

METHODS = ("baseline", "fastvar", "lazyvar", "depthvar", "arvar", "stagevar")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64, help="the first N of the 200 held-out prompts")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args(argv)

    import torch
    from diffusers import PipelineQuantizationConfig, TorchAoConfig
    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig
    from transformers import TorchAoConfig as TransformersTorchAoConfig

    from diffusers_var_accel import InfinityPipeline
    from diffusers_var_accel.lab.data.shapes import heldout_prompts
    from diffusers_var_accel.lab.evaluation import evaluate_shapes
    from diffusers_var_accel.lab.metrics import psnr, ssim
    from diffusers_var_accel.schedulers.specs import load_acceleration

    torch.set_num_threads(1)
    prompts = heldout_prompts()[: args.prompts]
    forms = {"fp32": None, "int8": Int8WeightOnlyConfig, "float8": Float8WeightOnlyConfig}
    reference, rows = {}, []
    print("| weights | method | accuracy | PSNR dB | SSIM | CPU time s | time / fp32 |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for form, config in forms.items():
        kwargs = {}
        if config is not None:
            kwargs["quantization_config"] = PipelineQuantizationConfig(
                quant_mapping={
                    "transformer": TorchAoConfig(config()),
                    "text_encoder": TransformersTorchAoConfig(config()),
                }
            )
        pipe = InfinityPipeline.from_pretrained("embedded", dtype=torch.float32, **kwargs)
        pipe.set_progress_bar_config(disable=True)
        pipe("a red circle", generator=torch.Generator().manual_seed(0))  # warm-up: first-call costs are not timed
        for method in METHODS:
            acceleration = load_acceleration(method, "infinity", preset_model=pipe.preset_model)
            start = time.perf_counter()
            report = evaluate_shapes(
                pipe,
                prompts=prompts,
                acceleration=acceleration,
                batch_size=args.batch_size,
                progress=False,
                keep_images=True,
            )
            seconds = time.perf_counter() - start
            images = torch.stack([torch.as_tensor(i).permute(2, 0, 1) for i in report["images"]]).float()
            if form == "fp32":
                reference[method] = (images, seconds)
            ref_images, ref_seconds = reference[method]
            row = dict(
                weights=form,
                method=method,
                prompts=len(prompts),
                accuracy=float(report["overall"]),
                psnr_db=float(psnr(images, ref_images).clamp(max=100).mean()),
                ssim=float(ssim(images, ref_images).mean()),
                seconds=seconds,
                time_ratio=seconds / ref_seconds,
            )
            rows.append(row)
            print(
                f"| {form} | {method} | {row['accuracy']:.3f} | "
                f"{'-' if form == 'fp32' else format(row['psnr_db'], '.1f')} | "
                f"{'-' if form == 'fp32' else format(row['ssim'], '.3f')} | {seconds:.1f} | {row['time_ratio']:.2f} |",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
