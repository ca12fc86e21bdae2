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
        from .hub import has_hub_shim, pipeline_class

        index = Path(model) / "model_index.json"
        if not index.is_file():
            raise ValueError(f"--model {model}: no model_index.json there; convert official checkpoints first with "
                             "'var-accel convert infinity ...' or 'var-accel convert hart ...' (see var-accel convert --help), "
                             "or pass 'embedded', 'tiny' or 'tiny-hart'")
        cls = pipeline_class(model)  # plain or Hub-shim form (["pipeline", "<class>"]) of model_index.json
        # A folder with the Hub shim (hub.write_hub_shim) makes diffusers execute its pipeline.py, which is the
        # one-line import of our own class: loading it needs trust_remote_code=True. Only our exact shim is trusted.
        shim_form = isinstance(json.loads(index.read_text()).get("_class_name"), list)
        if shim_form and not has_hub_shim(model):
            raise ValueError(f"--model {model}: model_index.json is in Hub-shim form but pipeline.py is not the "
                             "diffusers_var_accel shim; restore it with diffusers_var_accel.hub.write_hub_shim(folder, "
                             "overwrite=True) or undo it with diffusers_var_accel.hub.remove_hub_shim(folder)")
        options = {"trust_remote_code": True} if shim_form else {}
        pipe = cls.from_pretrained(model, torch_dtype=torch_dtype, **options)
    return pipe.to(device)


def _load_accel(spec: Optional[str], family: str):
    """``--accel``: anything ``load_acceleration`` takes, plus a JSON file of any name (not only
    ``acceleration_config.json``, which ``load_acceleration`` reads from the file's folder)."""
    from .schedulers.scheduling_var_base import VARAccelScheduler, load_acceleration

    if spec is None:
        return None
    path = Path(spec)
    if spec.endswith(".json"):
        if not path.is_file():
            raise ValueError(f"--accel {spec}: no such JSON file; pass a preset name (fastvar, lazyvar, depthvar, arvar, "
                             "infinity-2b/lazyvar, ...), name:key=value, a scheduler folder or an existing "
                             "acceleration_config.json")
        if path.name != VARAccelScheduler.config_name:
            import shutil
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:  # from_pretrained reads <folder>/acceleration_config.json
                shutil.copyfile(path, Path(tmp) / VARAccelScheduler.config_name)
                return load_acceleration(tmp, family)
    return load_acceleration(spec, family)


def _read_prompts(args: argparse.Namespace) -> List[str]:
    prompts: List[str] = list(args.prompt)
    if args.prompts_file:
        path = Path(args.prompts_file)
        if not path.is_file():
            raise ValueError(f"--prompts-file {args.prompts_file}: no such file; give a text file with one prompt per line")
        prompts += [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not prompts:
            raise ValueError(f"--prompts-file {args.prompts_file} holds no prompt (one prompt per line, blank lines skipped)")
    if not prompts:
        raise ValueError("give a prompt (var-accel generate \"two red circles\") or --prompts-file FILE")
    return prompts


def _cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from .pipelines.hart import HARTPipeline

    if args.batch_size < 1:
        print(f"error: --batch-size {args.batch_size}: must be 1 or more", file=sys.stderr)
        return 2
    try:
        prompts = _read_prompts(args)
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
    try:
        acceleration = _load_accel(args.accel, pipe.model_family)
    except (ValueError, TypeError, OSError, KeyError) as err:
        print(f"error: --accel {args.accel}: {err}", file=sys.stderr)
        return 2
    if is_hart:
        height = args.height or pipe.default_size
    else:
        height = args.height or (256 if args.model == "tiny" else pipe.default_size[0])
    width = args.width or height
    out_dir = Path(args.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    options = dict(EMBEDDED_SAMPLING) if is_embedded else {}  # the embedded model's evaluated settings
    options.update({k: v for k, v in (("guidance_scale", args.guidance_scale), ("tau", args.tau), ("top_k", args.top_k),
                                      ("top_p", args.top_p)) if v is not None})  # unset: the model's defaults
    if acceleration is not None:
        options["acceleration"] = acceleration
    records = []
    for first in range(0, len(prompts), args.batch_size):
        batch = prompts[first:first + args.batch_size]
        seeds = [args.seed + first + j for j in range(len(batch))]
        generators = [torch.Generator("cpu").manual_seed(seed) for seed in seeds]  # each image keeps its own seed
        start = time.perf_counter()
        try:
            if len(batch) == 1:
                images = pipe(batch[0], height=height, width=width, generator=generators[0], **options).images
            else:
                images = pipe(batch, height=height, width=width, generator=generators, **options).images
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        seconds = (time.perf_counter() - start) / len(batch)
        for j, (prompt, seed, image) in enumerate(zip(batch, seeds, images)):
            path = out_dir / f"{first + j:04d}.png"
            image.save(path)
            records.append({"prompt": prompt, "seed": seed, "file": path.name, "seconds": round(seconds, 3)})
            print(f"{path}  ({seconds:.2f} s)  {prompt}")
    report = {"height": height, "width": width, "acceleration": args.accel or "baseline", "batch_size": args.batch_size,
              "images": records}
    (out_dir / "generations.json").write_text(json.dumps(report, indent=2))
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


DTYPES = ("float32", "bfloat16", "float16")


def _load_local_tokenizer(folder: str):
    """The tokenizer class named by the folder's ``tokenizer_config.json`` (else ``AutoTokenizer``), offline."""
    import transformers

    config = Path(folder) / "tokenizer_config.json"
    name = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    cls = getattr(transformers, name, None) if name else None
    return (cls or transformers.AutoTokenizer).from_pretrained(folder, local_files_only=True)


def convert_script_main(family: str, argv: Optional[List[str]] = None) -> int:
    """``scripts/convert_<family>_original.py``: ``var-accel convert <family>``, replacing an existing output folder
    as those scripts always have."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--overwrite" not in argv and not any(a in ("-h", "--help") for a in argv):
        argv.append("--overwrite")
    return main(["convert", family, *argv])


def _cmd_convert(args: argparse.Namespace) -> int:
    import torch

    if args.tokenizer is not None and args.text_encoder is None:
        print("error: --tokenizer needs --text-encoder (the tokenizer defaults to the text encoder's folder)", file=sys.stderr)
        return 2
    for flag, value in (("--text-encoder", args.text_encoder), ("--tokenizer", args.tokenizer)):
        if value is not None and not Path(value).is_dir():
            print(f"error: {flag} {value}: not a folder; give a local transformers folder (downloaded beforehand)",
                  file=sys.stderr)
            return 2
    output = Path(args.output)
    if (output / "model_index.json").is_file() and not args.overwrite:
        print(f"error: --output {output} already holds a pipeline (model_index.json); pass --overwrite or another folder",
              file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    try:
        if args.family == "infinity":
            for flag, value in (("--transformer", args.transformer), ("--vae", args.vae)):
                if not (Path(value).is_file() or (flag == "--transformer" and Path(value).is_dir())):
                    raise FileNotFoundError(f"{flag} {value}: no such file; give the official checkpoint file "
                                            "(infinity_2b_reg.pth / infinity_vae_d32reg.pth or .safetensors copies; "
                                            "for 8B the infinity_8b_weights/ shard folder)")
            from .pipelines.infinity.convert import convert_infinity_original

            pipe = convert_infinity_original(args.transformer, args.vae, text_encoder_path=args.text_encoder,
                                             tokenizer_path=args.tokenizer, config=args.config, torch_dtype=dtype)
        else:
            if not Path(args.checkpoint).is_dir():
                raise FileNotFoundError(f"--checkpoint {args.checkpoint}: not a folder; give the official HART folder "
                                        "(hart-0.7b-1024px/ with llm/config.json and tokenizer/) or its llm/ folder")
            from .pipelines.hart.convert import load_original_hart_pipeline

            text_encoder = tokenizer = None
            if args.text_encoder is not None:
                from transformers import AutoModel

                text_encoder = AutoModel.from_pretrained(args.text_encoder, torch_dtype=dtype, local_files_only=True)
                tokenizer = _load_local_tokenizer(args.tokenizer or args.text_encoder)
            pipe = load_original_hart_pipeline(args.checkpoint, use_ema=not args.no_ema, torch_dtype=dtype,
                                               text_encoder=text_encoder, tokenizer=tokenizer)
    except (ValueError, FileNotFoundError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    pipe.save_pretrained(output, safe_serialization=True)
    if args.hub_shim:
        from .hub import write_hub_shim

        write_hub_shim(output)
    components = [name for name in ("transformer", "vae", "text_encoder", "tokenizer") if getattr(pipe, name, None) is not None]
    print(f"wrote {output} ({', '.join(components)}); run it with: var-accel generate \"a red fox\" --model {output}")
    return 0


_FLOPS_NEEDS_CHECKOUT = ("var-accel flops needs a source checkout of diffusers-var-accel: it runs benchmarks/flops.py, "
                         "which is not installed with the package. Clone the repository and run it there "
                         "(python -m diffusers_var_accel flops ... or python benchmarks/flops.py ...).")


def _import_flops_module():
    """``benchmarks.flops`` from the source checkout this package lives in, or ``None`` (installed package)."""
    import importlib

    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "flops.py").is_file():
        return None
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module("benchmarks.flops")


def _cmd_flops(argv: List[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print("var-accel flops: counted FLOPs of one generation (benchmarks/flops.py; needs a source checkout).\n"
              "examples:\n  var-accel flops --model infinity-2b\n  var-accel flops --model hart-0.7b --accel fastvar lazyvar\n")
    module = _import_flops_module()
    if module is None:
        print(f"error: {_FLOPS_NEEDS_CHECKOUT}", file=sys.stderr)
        return 2
    program, sys.argv[0] = sys.argv[0], "var-accel flops"  # benchmarks/flops.py's parser names itself after argv[0]
    try:
        return module.main(argv)
    finally:
        sys.argv[0] = program


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


_MAIN_DESCRIPTION = """\
Infinity / HART next-scale (VAR) text-to-image generation with training-free acceleration
(FastVAR, LazyVAR, DepthVAR, ARVAR). Nothing is downloaded, except a pipeline that bench --model names by Hub id.
"""

_MAIN_EPILOG = """\
examples:
  var-accel demo
  var-accel generate "two red circles" --accel lazyvar
  var-accel convert infinity --transformer infinity_2b_reg.pth --vae infinity_vae_d32reg.pth --output infinity-2b-diffusers
  var-accel flops --model infinity-2b --accel fastvar lazyvar

Run var-accel COMMAND --help for a command's options. Docs: docs/cli.md.
"""

_GENERATE_DESCRIPTION = """\
Generate one PNG per prompt into --output, with generations.json (prompt, seed, file, seconds per image).
Prompt i (counting the positional prompts first, then the --prompts-file lines) uses seed --seed + i, whatever
--batch-size is, so batching does not change which seed an image gets.
"""

_GENERATE_EPILOG = """\
examples:
  var-accel generate "two red circles"                                   # embedded shapes model, baseline
  var-accel generate "two red circles" --accel lazyvar                   # the LazyVAR preset of the model's family
  var-accel generate --prompts-file prompts.txt --batch-size 4 --seed 10 --output out
  var-accel generate "a red fox" --model infinity-2b-diffusers --device cuda --dtype bfloat16 \\
      --height 1024 --width 1024 --accel infinity-2b/fastvar:skip_last_scales=false
  var-accel generate "a red fox" --model tiny --accel my_lazyvar.json    # a scheduler JSON file (any file name)

--accel takes: baseline (the default); a method preset for the model's family (fastvar, lazyvar, depthvar, arvar);
a packaged preset (infinity-2b/lazyvar, hart-0.7b/fastvar, ...); either with :key=value,key=value overrides (values
parsed as JSON); a scheduler folder holding acceleration_config.json; or a JSON file of a scheduler config.
--model takes a folder saved with the Hub shim (diffusers_var_accel.hub.write_hub_shim) too.
"""

_CONVERT_DESCRIPTION = """\
Convert official checkpoints into a diffusers-format folder that var-accel generate --model and
InfinityPipeline / HARTPipeline.from_pretrained load. Loading is strict: missing, unexpected or mis-shaped keys stop
the conversion (exit status 1) with every offending key listed. Nothing is downloaded: text encoders are local folders.
"""

_CONVERT_EPILOG = """\
examples:
  var-accel convert infinity --transformer infinity_2b_reg.pth --vae infinity_vae_d32reg.pth \\
      --text-encoder flan-t5-xl --dtype bfloat16 --output infinity-2b-diffusers
  var-accel convert hart --checkpoint hart-0.7b-1024px --text-encoder Qwen2-VL-1.5B-Instruct --output hart-0.7b-diffusers
  var-accel convert hart --checkpoint hart-0.7b-1024px --output hart-0.7b-diffusers --hub-shim   # for the Hub
"""


def _add_convert_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--text-encoder", help="local transformers folder of the text encoder; omit to convert without one "
                        "(the pipeline then runs from prompt embeddings)")
    parser.add_argument("--tokenizer", help="local tokenizer folder (default: the --text-encoder folder)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="dtype of the saved weights (default float32)")
    parser.add_argument("--output", required=True, help="output folder (created)")
    parser.add_argument("--overwrite", action="store_true", help="write into an --output that already holds a pipeline")
    parser.add_argument("--hub-shim", action="store_true", help="also write the Hub pipeline.py shim "
                        "(diffusers_var_accel.hub.write_hub_shim), so DiffusionPipeline.from_pretrained(..., "
                        "trust_remote_code=True) loads the folder")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="var-accel", description=_MAIN_DESCRIPTION, epilog=_MAIN_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{generate,demo,bench,convert,flops}")
    gen = sub.add_parser("generate", help="generate images from prompts", description=_GENERATE_DESCRIPTION,
                         epilog=_GENERATE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    gen.add_argument("prompt", nargs="*", help="prompt(s)")
    gen.add_argument("--prompts-file", help="a text file with one prompt per line")
    gen.add_argument("--model", help="'embedded' (the default: the packaged shapes model), a converted Infinity or HART "
                     "pipeline folder (var-accel convert; with or without the Hub shim), or 'tiny' / 'tiny-hart' "
                     "(random weights)")
    gen.add_argument("--height", type=int, help="image height (default: the model's own size; Infinity: an official size, 256 "
                     "for the tiny model; the embedded model and HART make one size)")
    gen.add_argument("--width", type=int, help="image width (default: the height)")
    gen.add_argument("--seed", type=int, default=0, help="seed of the first prompt; prompt i uses seed + i")
    gen.add_argument("--guidance-scale", type=float, help="CFG (Infinity default 4.0; HART's weight, default 4.5)")
    gen.add_argument("--tau", type=float, help="sampling temperature (Infinity only; default 0.5)")
    gen.add_argument("--top-k", type=int, help="top-k (Infinity default 900; HART default: the official 600/300)")
    gen.add_argument("--top-p", type=float, help="top-p (Infinity default 0.97; HART default 0 = off)")
    gen.add_argument("--device", default="cpu", help="torch device (default cpu)")
    gen.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    gen.add_argument("--output", default="outputs", help="output folder (PNG files + generations.json)")
    gen.add_argument("--accel", metavar="NAME|JSON", help="acceleration: baseline (default), fastvar, lazyvar, depthvar, arvar, "
                     "a packaged preset (infinity-2b/lazyvar), name:key=value overrides, a scheduler folder or a JSON file")
    gen.add_argument("--batch-size", type=int, default=1, help="prompts per pipeline call (default 1); each image keeps "
                     "its own seed")
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

    conv = sub.add_parser("convert", help="official Infinity / HART checkpoints -> a diffusers pipeline folder",
                          description=_CONVERT_DESCRIPTION, epilog=_CONVERT_EPILOG,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    families = conv.add_subparsers(dest="family", required=True, metavar="{infinity,hart}")
    inf = families.add_parser("infinity", help="Infinity: transformer .pth + VAE .pth (+ a local T5 folder)",
                              description="Convert the official Infinity transformer and VAE checkpoints.",
                              epilog=_CONVERT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    inf.add_argument("--transformer", required=True, help="official transformer .pth (plain state dict, e.g. "
                     "infinity_2b_reg.pth), a .safetensors copy with the official keys, or the 8B shard folder "
                     "(infinity_8b_weights/ with model.safetensors.index.json)")
    inf.add_argument("--vae", required=True, help="official VAE .pth (e.g. infinity_vae_d32reg.pth, "
                     "infinity_vae_d56_f8_14_patchify.pth for 8B) or .safetensors")
    inf.add_argument("--config", choices=("infinity-2b", "infinity-8b"), help="named config (default: inferred from the shapes)")
    _add_convert_common(inf)
    inf.set_defaults(func=_cmd_convert)
    hart = families.add_parser("hart", help="HART: the official folder (llm/ + tokenizer/) (+ a local Qwen2 folder)",
                               description="Convert the official HART folder (hart-0.7b-1024px/: llm/ and tokenizer/).",
                               epilog=_CONVERT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    hart.add_argument("--checkpoint", required=True, help="official HART folder (with llm/ and tokenizer/) or its llm/ folder")
    hart.add_argument("--no-ema", action="store_true", help="use the main weights instead of llm/ema_model.bin")
    _add_convert_common(hart)
    hart.set_defaults(func=_cmd_convert)

    # parsed by benchmarks/flops.py itself (main() forwards the arguments); listed here for --help
    sub.add_parser("flops", add_help=False,
                   help="counted FLOPs table per model and method: --model infinity-2b|infinity-8b|hart-0.7b|... "
                   "[--accel ...] (runs benchmarks/flops.py: needs a source checkout, not an installed package)")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "flops":
            return _cmd_flops(argv[1:])
        args = build_parser().parse_args(argv)
        return args.func(args)
    except SystemExit as exit_:  # argparse (--help: 0; a bad value: 2, with the allowed values on stderr)
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
