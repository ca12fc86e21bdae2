"""How long preparing the passes takes: direct capture against ``compile_passes()``, side by side in one run.

Times, on the embedded model (or ``--model``), the first call (which prepares every pass) and a second call (which
replays them) for each way of running the passes:

* ``eager``: no preparation (the reference);
* ``capture``: ``pipe.enable_cuda_graphs()`` with direct capture (``capture="cuda"`` on a GPU; on the CPU its stand-in
  ``capture="trace"``: the same walk of the pass inputs, one eager warm-up and one capture per pass);
* ``compile``: ``pipe.compile_passes(backend=--backend)`` (``torch.compile`` of each pass, inductor by default), with
  an empty inductor cache folder unless ``--warm-cache`` (a warm on-disk cache makes a repeated compile several times
  faster: 149.7 s cold against 20.7 s warm here).

Usage::

    python -m diffusers_var_accel.lab.bench.capture                       # embedded model, CPU: capture="trace" vs compile (inductor)
    python -m diffusers_var_accel.lab.bench.capture --device cuda         # capture="cuda" vs compile on a GPU
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Dict, List, Optional

import torch


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(pipe, call, modes: List[str], device: str, backend: str) -> Dict[str, Dict[str, float]]:
    """``{mode: {"first_s", "second_s"}}``; the images of every mode are checked equal to eager's."""
    results, reference = {}, None
    for mode in modes:
        torch._dynamo.reset()
        pipe.disable_cuda_graphs()
        if mode == "capture":
            pipe.enable_cuda_graphs(capture="cuda" if device.startswith("cuda") else "trace")
        elif mode == "compile":
            pipe.compile_passes(backend=backend)
        images: List[torch.Tensor] = []
        first = _time(lambda: images.append(call()))
        second = _time(lambda: images.append(call()))
        pipe.disable_cuda_graphs()
        if reference is None:
            reference = images[0]
        same = all(torch.equal(image, reference) for image in images)
        results[mode] = {"first_s": first, "second_s": second, "equal_to_eager": same}
    return results


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="embedded", help="a pipeline folder or 'embedded' (default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--backend", default="inductor", help="torch.compile backend of the compile row (default inductor)"
    )
    parser.add_argument("--modes", default="eager,capture,compile", help="comma-separated: eager, capture, compile")
    parser.add_argument("--method", default=None, help="an acceleration method for every row (default: the baseline)")
    parser.add_argument(
        "--warm-cache",
        action="store_true",
        help="keep inductor's on-disk caches (default: a fresh, empty cache folder: a first compile)",
    )
    args = parser.parse_args(argv)
    if not args.warm_cache:  # a user's first compile: nothing cached on disk by an earlier run (read when compiling)
        import os
        import tempfile

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="capture-bench-inductor-")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("eager", "capture", "compile")]
    if bad or not modes or modes[0] != "eager":
        print(f"error: --modes {args.modes!r}: eager first, then any of capture, compile", file=sys.stderr)
        return 2
    from diffusers_var_accel import InfinityPipeline
    from diffusers_var_accel.embedded import EMBEDDED_SAMPLING

    pipe = InfinityPipeline.from_pretrained(args.model).to(args.device)
    pipe.set_progress_bar_config(disable=True)
    if args.method:
        pipe.enable_acceleration(args.method)
    sampling = EMBEDDED_SAMPLING if args.model == "embedded" else {}

    def call():
        return pipe(
            ["two red circles", "a yellow triangle"],
            generator=torch.Generator().manual_seed(3),
            output_type="pt",
            **sampling,
        ).images

    results = measure(pipe, call, modes, args.device, args.backend)
    print(f"{args.model} on {args.device}, torch {torch.__version__}, method {args.method or 'baseline'}")
    print(
        f"{'mode':<10} {'first call s':>13} {'second call s':>14} {'prepare s':>10} {'vs compile':>11}  equal to eager"
    )
    eager_first = results["eager"]["first_s"]
    compile_prepare = results["compile"]["first_s"] - eager_first if "compile" in results else None
    for mode, r in results.items():
        prepare = r["first_s"] - eager_first if mode != "eager" else 0.0
        ratio = f"{compile_prepare / prepare:.1f}x" if compile_prepare and prepare > 0 and mode != "compile" else "-"
        print(
            f"{mode:<10} {r['first_s']:>13.2f} {r['second_s']:>14.2f} {prepare:>10.2f} {ratio:>11}  {r['equal_to_eager']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
