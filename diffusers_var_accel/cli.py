"""``var-accel``: the command line of diffusers-var-accel.

``var-accel demo`` runs the embedded shapes model (shipped in the package) with the baseline and every acceleration
preset and prints a comparison table. ``var-accel generate "two red circles"`` generates with the embedded model by
default, with a converted pipeline folder (``--model``: an Infinity or HART folder, told apart by its
``model_index.json``), or with tiny random-weight pipelines built on the spot (``--model tiny`` / ``tiny-hart``; the
images are noise-like). ``var-accel bench`` benchmarks the baseline against acceleration methods on a prompt set
(time, speed-up, FLOPs, memory, fidelity to the baseline; ``diffusers_var_accel.bench``). Nothing is downloaded,
except a pipeline that ``var-accel bench --model`` names by its Hub id.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import List, Optional

#: ``var-accel bench``'s default methods (``diffusers_var_accel.bench.DEFAULT_METHODS``, without importing it).
DEFAULT_BENCH_METHODS = ("baseline", "fastvar", "lazyvar", "depthvar", "arvar")


def _load_pipeline(model: Optional[str], device: str, dtype: str):
    import torch

    from .pipelines.hart import HARTPipeline
    from .pipelines.infinity import InfinityPipeline

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    from .embedded import EMBEDDED_MODEL_NAMES, embedded_model_path

    if model is None or model in EMBEDDED_MODEL_NAMES:
        return InfinityPipeline.from_pretrained(embedded_model_path(), torch_dtype=torch_dtype).to(device)
    if model in ("tiny", "tiny-hart"):
        from .utils.tiny import build_tiny_hart_pipeline, build_tiny_infinity_pipeline

        name = "HART" if model == "tiny-hart" else "Infinity"
        print(f"Using a tiny {name} pipeline with RANDOM weights (built locally, no download). Its images are noise-like; "
              "pass --model <converted folder> for a real checkpoint.", file=sys.stderr)
        pipe = build_tiny_hart_pipeline(seed=0) if model == "tiny-hart" else build_tiny_infinity_pipeline(seed=0)
    else:
        index = Path(model) / "model_index.json"
        if not index.is_file():
            raise ValueError(f"--model {model}: no model_index.json there; convert official checkpoints with "
                             "scripts/convert_infinity_original.py or scripts/convert_hart_original.py first")
        class_name = json.loads(index.read_text()).get("_class_name")
        classes = {"InfinityPipeline": InfinityPipeline, "HARTPipeline": HARTPipeline}
        if class_name not in classes:
            raise ValueError(f"--model {model} holds a {class_name!r}; var-accel runs {sorted(classes)}")
        pipe = classes[class_name].from_pretrained(model, torch_dtype=torch_dtype)
    return pipe.to(device)


def _cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from .pipelines.hart import HARTPipeline

    try:
        pipe = _load_pipeline(args.model, args.device, args.dtype)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    is_hart = isinstance(pipe, HARTPipeline)
    from .embedded import EMBEDDED_MODEL_NAMES, EMBEDDED_SAMPLING

    is_embedded = args.model is None or args.model in EMBEDDED_MODEL_NAMES
    if is_hart and args.tau is not None:
        print("error: --tau is an Infinity option; HART samples with top-k/top-p (and --guidance-scale)", file=sys.stderr)
        return 2
    prompts: List[str] = list(args.prompt)
    if args.prompts_file:
        prompts += [line.strip() for line in Path(args.prompts_file).read_text().splitlines() if line.strip()]
    if not prompts:
        print("error: give a prompt or --prompts-file", file=sys.stderr)
        return 2
    if is_hart:
        height = args.height or pipe.default_size
    else:
        height = args.height or (256 if args.model == "tiny" else pipe.default_size[0])
    width = args.width or height
    out_dir = Path(args.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for i, prompt in enumerate(prompts):
        generator = torch.Generator("cpu").manual_seed(args.seed + i)
        start = time.perf_counter()
        try:
            options = dict(EMBEDDED_SAMPLING) if is_embedded else {}  # the embedded model's evaluated settings
            options.update({k: v for k, v in (("guidance_scale", args.guidance_scale), ("tau", args.tau), ("top_k", args.top_k),
                                              ("top_p", args.top_p)) if v is not None})  # unset: the model's defaults
            image = pipe(prompt, height=height, width=width, generator=generator, **options).images[0]
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        seconds = time.perf_counter() - start
        path = out_dir / f"{i:04d}.png"
        image.save(path)
        records.append({"prompt": prompt, "seed": args.seed + i, "file": path.name, "seconds": round(seconds, 3)})
        print(f"{path}  ({seconds:.2f} s)  {prompt}")
    (out_dir / "generations.json").write_text(json.dumps({"height": height, "width": width, "images": records}, indent=2))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    try:
        run_demo(prompts=args.prompt or None, num_prompts=args.num_prompts, methods=methods, seed=args.seed,
                 repeats=args.repeats, output_dir=args.output)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import finish_distributed, run_bench

    sampling = {k: v for k, v in (("guidance_scale", args.guidance_scale), ("tau", args.tau), ("top_k", args.top_k),
                                  ("top_p", args.top_p)) if v is not None}
    try:
        run_bench(model=args.model, prompts=args.prompts, num_prompts=args.num_prompts, seeds=args.seeds, methods=args.methods,
                  repeats=args.repeats, warmup=args.warmup, batch_size=args.batch_size, output_dir=args.output,
                  device=args.device, dtype=args.dtype, height=args.height, width=args.width, sampling=sampling,
                  save_images=not args.no_images, progress=not args.no_progress)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        finish_distributed()
    return 0


_BENCH_DESCRIPTION = """\
Generate every (prompt, seed) with the baseline and every acceleration method, and measure per method:
latency per image (warm-up excluded, methods interleaved, min / median / max) and the speed-up over the baseline;
counted FLOPs per image (text encoder, transformer and VAE apart) and peak memory; PSNR, SSIM, LPIPS and FID*
against the baseline image of the same prompt and seed; the shapes scorer's accuracy on shapes prompts.

Writes results.json, results.md (the table), speedup_vs_fidelity.png, scale_breakdown.png, grid.png and every
method's images (GenEval's folder layout for GenEval prompts). Under torchrun / accelerate launch the (prompt, seed)
items are split across the processes and the main process writes the same files.
"""

_BENCH_EPILOG = """\
examples:
  var-accel bench                                   # embedded model, 24 shapes prompts, baseline + every preset
  var-accel bench --prompts geneval --num-prompts 60 --seeds 0-3 --output bench_geneval
  var-accel bench --model path/to/infinity-2b-diffusers --device cuda --dtype bfloat16 \\
      --prompts geneval --seeds 0-3 --methods baseline,fastvar,lazyvar,my_scheduler/
  torchrun --nproc_per_node 8 -m diffusers_var_accel bench --model ... --prompts geneval   # split across processes

Every method generates every (prompt, seed) with torch.Generator(device).manual_seed(seed). Times are whole calls per
image, after --warmup rounds, methods interleaved per batch; the speed-up is the baseline's median over the method's,
from the same run. LPIPS and FID* run only when their network weights are already in the torch hub cache (nothing is
downloaded); otherwise results.json says which metric was skipped and why. Protocol: docs/benchmark_protocol.md.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="var-accel", description="Infinity / HART next-scale generation with training-free acceleration.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate images from prompts")
    gen.add_argument("prompt", nargs="*", help="prompt(s)")
    gen.add_argument("--prompts-file", help="a text file with one prompt per line")
    gen.add_argument("--model", help="'embedded' (the default: the packaged shapes model), a converted Infinity or HART "
                     "pipeline folder (scripts/convert_*_original.py), or 'tiny' / 'tiny-hart' (random weights)")
    gen.add_argument("--height", type=int, help="image height (default: the model's own size; Infinity: an official size, 256 "
                     "for the tiny model; the embedded model and HART make one size)")
    gen.add_argument("--width", type=int, help="image width (default: the height)")
    gen.add_argument("--seed", type=int, default=0, help="seed of the first prompt; prompt i uses seed + i")
    gen.add_argument("--guidance-scale", type=float, help="CFG (Infinity default 4.0; HART's weight, default 4.5)")
    gen.add_argument("--tau", type=float, help="sampling temperature (Infinity only; default 0.5)")
    gen.add_argument("--top-k", type=int, help="top-k (Infinity default 900; HART default: the official 600/300)")
    gen.add_argument("--top-p", type=float, help="top-p (Infinity default 0.97; HART default 0 = off)")
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    gen.add_argument("--output", default="outputs", help="output folder (PNG files + generations.json)")
    gen.set_defaults(func=_cmd_generate)

    demo = sub.add_parser("demo", help="the embedded shapes model: baseline vs every acceleration preset (table, grid, report)",
                          description="Generate shapes prompts with the embedded model (offline), baseline and every preset; "
                                      "print time, speed-up, FLOPs, PSNR/SSIM vs the baseline image and the scorer's "
                                      "accuracy; write report.json and grid.png.")
    demo.add_argument("prompt", nargs="*", help="shapes prompts (default: --num-prompts held-out prompts)")
    demo.add_argument("--num-prompts", type=int, default=6)
    demo.add_argument("--methods", default="baseline,fastvar,lazyvar,depthvar,arvar",
                      help="comma-separated: baseline, preset names, name:key=value overrides or scheduler folders")
    demo.add_argument("--seed", type=int, default=0, help="prompt i uses seed + i")
    demo.add_argument("--repeats", type=int, default=1, help="timed generations per method and prompt (median reported)")
    demo.add_argument("--output", default="demo_outputs", help="output folder (report.json, grid.png)")
    demo.set_defaults(func=_cmd_demo)

    bench = sub.add_parser(
        "bench", help="benchmark the baseline against acceleration methods: time, FLOPs, memory, fidelity (JSON, table, plots)",
        description=_BENCH_DESCRIPTION,
        epilog=_BENCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("--model", help="'embedded' (default: the packaged shapes model), a converted Infinity or HART pipeline "
                       "folder, a Hub id (owner/name), or 'tiny' / 'tiny-hart' (random weights)")
    bench.add_argument("--prompts", default="shapes", help="'shapes' (default: held-out shapes prompts), 'geneval' (the packaged "
                       "553 GenEval prompts), or a prompt file: .jsonl (a \"prompt\" per line, e.g. GenEval's "
                       "evaluation_metadata.jsonl), .json (a list, or MJHQ-30K's meta_data.json) or .txt (one per line)")
    bench.add_argument("--num-prompts", type=int, help="how many prompts (shapes: the first N, default 24; a file: N spread "
                       "evenly over it, default all)")
    bench.add_argument("--seeds", default="0", help="seeds per prompt: '0', '0,1,2' or '0-3' (default 0); GenEval's sample index "
                       "is the seed's position")
    bench.add_argument("--methods", default=",".join(DEFAULT_BENCH_METHODS),
                       help="comma-separated: baseline (always run first), preset names (fastvar, lazyvar, depthvar, arvar), "
                       "name:key=value overrides, scheduler folders or acceleration_config.json files "
                       f"(default {','.join(DEFAULT_BENCH_METHODS)})")
    bench.add_argument("--repeats", type=int, default=3, help="timed rounds per batch of prompts (default 3)")
    bench.add_argument("--warmup", type=int, default=1, help="untimed rounds of every method first, per process (default 1)")
    bench.add_argument("--batch-size", type=int, default=1, help="images per call (default 1); each image keeps its own seed")
    bench.add_argument("--height", type=int, help="image height (default: the model's size)")
    bench.add_argument("--width", type=int, help="image width (default: the height)")
    bench.add_argument("--guidance-scale", type=float, help="CFG scale (default: the embedded model's evaluated setting, "
                       "else the pipeline's default)")
    bench.add_argument("--tau", type=float, help="sampling temperature (Infinity only)")
    bench.add_argument("--top-k", type=int, help="top-k (0 = off)")
    bench.add_argument("--top-p", type=float, help="top-p")
    bench.add_argument("--device", help="default: the process's GPU if there is one, else the CPU")
    bench.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                       help="weights dtype when loading --model (default float32)")
    bench.add_argument("--output", default="bench_outputs", help="output folder (default bench_outputs)")
    bench.add_argument("--no-images", action="store_true", help="do not write the generated images")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
