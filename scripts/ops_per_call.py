"""Where a generation's time goes on the embedded model: ATen operations dispatched per call, by kind, for the
baseline and each method's packaged preset, beside the counted FLOPs (docs/benchmarks.md, "Where the time goes").

    python scripts/ops_per_call.py [--prompt "two red circles"] [--seed 0]

Counts, not timings: every operation the call dispatches to ATen is counted once (a ``TorchDispatchMode``), split
into matrix products and attention (``mm``, ``addmm``, ``bmm``, ``linear``, ``scaled_dot_product_attention`` and
their variants), the sampling step's draws and sorts, convolutions (the VAE decoder), and everything else.
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

KINDS = {
    "matmul / attention": ("mm", "addmm", "bmm", "linear", "matmul", "baddbmm", "_scaled_dot_product", "sdpa"),
    "convolution": ("convolution", "conv2d", "conv_"),
    "sampling": ("multinomial", "exponential", "topk", "sort", "softmax", "cumsum", "uniform", "normal", "argmax"),
}


def kind_of(op_name: str) -> str:
    base = op_name.split(".")[1] if op_name.startswith("aten.") else op_name
    for kind, stems in KINDS.items():
        if any(base.startswith(stem) for stem in stems):
            return kind
    return "other"


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[kind_of(str(func.overloadpacket))] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    from diffusers_var_accel.embedded import EMBEDDED_SAMPLING
    from diffusers_var_accel.lab.bench.probe import count_call_flops
    from diffusers_var_accel.pipelines.pipeline_loading import load_embedded_pipeline
    from diffusers_var_accel.schedulers.registry import method_names
    from diffusers_var_accel.schedulers.specs import load_acceleration

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", default="two red circles")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    pipe = load_embedded_pipeline()
    pipe.set_progress_bar_config(disable=True)
    rows = []
    for method in ["baseline", *method_names()]:
        scheduler = load_acceleration(method, pipe.model_family, preset_model=pipe.preset_model)
        call = dict(generator=torch.Generator().manual_seed(args.seed), acceleration=scheduler, **EMBEDDED_SAMPLING)
        flops = count_call_flops(pipe, args.prompt, **call)
        counter = OpCounter()
        call["generator"] = torch.Generator().manual_seed(args.seed)
        with torch.no_grad(), counter:
            pipe(args.prompt, output_type="pt", **call)
        rows.append((method, flops, counter.ops))
    base_flops, base_ops = rows[0][1], sum(rows[0][2].values())
    kinds = [*KINDS, "other"]
    print("| method | GFLOPs | FLOPs ratio | ops dispatched | op ratio | " + " | ".join(kinds) + " |")
    print("| --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in kinds) + " |")
    for method, flops, ops in rows:
        total = sum(ops.values())
        print(
            f"| {method} | {flops / 1e9:.3f} | {base_flops / flops:.2f}x | {total:,} | {base_ops / total:.2f}x | "
            + " | ".join(f"{ops[k]:,}" for k in kinds)
            + " |"
        )


if __name__ == "__main__":
    main()
