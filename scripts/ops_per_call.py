"""Where a generation's time goes on the embedded model: ATen operations dispatched per call, by kind, for the
baseline and each method's packaged preset, beside the counted FLOPs (docs/benchmarks.md, "Where the time goes").

    python scripts/ops_per_call.py [--prompt "two red circles"] [--seed 0]
    python scripts/ops_per_call.py --time [--repeats 5]

Counts: every operation the call dispatches to ATen is counted once (a ``TorchDispatchMode``), split into matrix
products and attention (``mm``, ``addmm``, ``bmm``, ``linear``, ``scaled_dot_product_attention`` and their
variants), the sampling step's draws and sorts, convolutions (the VAE decoder), and everything else.

``--time`` (one torch thread): per method, the median wall time of ``--repeats`` plain calls after a warm-up, the
VAE decode's share of it (``vae.decode`` timed inside the same calls), then one call under ``torch.profiler``: the
time spent inside ATen per kind (the operations' self times, dispatch included) and the rest of the profiled call,
which is Python (the loop, the schedulers, the modules' ``forward`` code). The dispatch floor is the op count times
the median time of a one-element ``torch.add`` called from Python: what the call would cost if every operation did
no arithmetic.
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

KINDS = {
    "matmul / attention": ("mm", "addmm", "bmm", "linear", "matmul", "baddbmm", "_scaled_dot_product", "sdpa"),
    "convolution": ("convolution", "conv2d", "conv_", "_convolution", "mkldnn_convolution", "_slow_conv2d"),
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


def _median(values):
    values = sorted(values)
    return values[len(values) // 2]


def one_op_seconds(samples: int = 20000) -> float:
    """Median time of a one-element ``torch.add`` called from Python (the cost of dispatching one operation)."""
    import time

    a, b = torch.ones(1), torch.ones(1)
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        torch.add(a, b)
        times.append(time.perf_counter() - start)
    return _median(times)


def time_breakdown(pipe, prompt: str, seed: int, repeats: int, methods, top: int = 0) -> None:
    """Print the per-call time breakdown table (see the module docstring)."""
    import time

    from torch.profiler import ProfilerActivity, profile

    from diffusers_var_accel.embedded import EMBEDDED_SAMPLING
    from diffusers_var_accel.schedulers.specs import load_acceleration

    torch.set_num_threads(1)
    decode_seconds = []
    original_decode = pipe.vae.decode

    def timed_decode(*args, **kwargs):
        start = time.perf_counter()
        out = original_decode(*args, **kwargs)
        decode_seconds.append(time.perf_counter() - start)
        return out

    pipe.vae.decode = timed_decode
    op_seconds = one_op_seconds()
    kinds = [*KINDS, "other"]
    print(f"one torch thread; a one-element torch.add from Python: {op_seconds * 1e6:.1f} us")
    print(
        "| method | ms per call | VAE decode ms | ops | dispatch floor ms | profiled ms | inside ATen ms | "
        + " | ".join(f"{k} ms" for k in kinds)
        + " | Python ms |"
    )
    print("| --- | " + " | ".join("---:" for _ in range(7 + len(kinds))) + " |")
    for method in methods:
        scheduler = load_acceleration(method, pipe.model_family, preset_model=pipe.preset_model)

        def call():
            generator = torch.Generator().manual_seed(seed)
            return pipe(prompt, output_type="pt", generator=generator, acceleration=scheduler, **EMBEDDED_SAMPLING)

        with torch.no_grad():
            call()  # warm-up: per-process and per-(size, method) caches
            counter = OpCounter()
            with counter:
                call()
            walls, decodes = [], []
            for _ in range(repeats):
                decode_seconds.clear()
                start = time.perf_counter()
                call()
                walls.append(time.perf_counter() - start)
                decodes.append(sum(decode_seconds))
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                start = time.perf_counter()
                call()
                profiled = time.perf_counter() - start
        if top:
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))
        inside = Counter()
        for event in prof.events():
            if event.name.startswith("aten::"):
                inside[kind_of("aten." + event.name[len("aten::") :])] += event.self_cpu_time_total / 1e6
        ops = sum(counter.ops.values())
        total_inside = sum(inside.values())
        print(
            f"| {method} | {_median(walls) * 1e3:.0f} | {_median(decodes) * 1e3:.0f} | {ops:,} | "
            f"{ops * op_seconds * 1e3:.0f} | {profiled * 1e3:.0f} | {total_inside * 1e3:.0f} | "
            + " | ".join(f"{inside[k] * 1e3:.0f}" for k in kinds)
            + f" | {(profiled - total_inside) * 1e3:.0f} |",
            flush=True,
        )
    pipe.vae.decode = original_decode


def main() -> None:
    from diffusers_var_accel.embedded import EMBEDDED_SAMPLING
    from diffusers_var_accel.lab.bench.probe import count_call_flops
    from diffusers_var_accel.pipelines.pipeline_loading import load_embedded_pipeline
    from diffusers_var_accel.schedulers.registry import method_names
    from diffusers_var_accel.schedulers.specs import load_acceleration

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", default="two red circles")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time", action="store_true", help="the per-call time breakdown instead of the op counts")
    parser.add_argument("--repeats", type=int, default=5, help="--time: timed calls per method (default 5)")
    parser.add_argument("--top", type=int, default=0, help="--time: also print each profile's N largest operations")
    parser.add_argument("--methods", default=None, help="comma-separated (default: baseline and every method)")
    args = parser.parse_args()
    pipe = load_embedded_pipeline()
    pipe.set_progress_bar_config(disable=True)
    methods = args.methods.split(",") if args.methods else ["baseline", *method_names()]
    if args.time:
        time_breakdown(pipe, args.prompt, args.seed, args.repeats, methods, args.top)
        return
    rows = []
    for method in methods:
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
