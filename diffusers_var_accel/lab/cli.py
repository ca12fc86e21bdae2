"""``var-accel``: the command line of diffusers-var-accel.

``var-accel demo`` runs the embedded shapes model (shipped in the package) with the baseline and every acceleration
preset and prints a comparison table. ``var-accel generate "two red circles"`` generates with the embedded model by
default, with a converted pipeline folder (``--model``: an Infinity or HART folder, told apart by its
``model_index.json``), or with tiny random-weight pipelines built on the spot (``--model tiny`` / ``tiny-hart``; the
images are noise-like). ``var-accel bench`` benchmarks the baseline against acceleration methods on a prompt set
(time, speed-up, FLOPs, memory, fidelity to the baseline; ``diffusers_var_accel.lab.bench``). Nothing is downloaded,
except a pipeline that ``var-accel bench --model`` names by its Hub id.

A bad value (an argument, a file or folder it names, a device) is reported as one ``error: ...`` line on stderr with
exit status 2; ``--debug`` shows the traceback instead. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

# Only modules that import neither torch nor diffusers at module level: the parser, --help and a bad flag answer at
# once (tests/lab/test_cli_startup.py); each command imports what it runs.
from diffusers_var_accel.builtin_methods import BUILTIN_METHODS
from diffusers_var_accel.lab.families import lab_families, lab_family
from diffusers_var_accel.lab.generate_job import SAMPLING_KEYS
from diffusers_var_accel.lab.user_errors import UserInputError, one_line, user_errors

#: ``var-accel bench``'s default methods (``diffusers_var_accel.lab.bench.DEFAULT_METHODS``, without importing it):
#: the baseline and every built-in method (the registry's order).
DEFAULT_BENCH_METHODS = ("baseline", *BUILTIN_METHODS)


def method_names() -> List[str]:
    """The registered methods (the registry's, which imports torch: call it only when a command runs)."""
    from diffusers_var_accel.schedulers.registry import method_names as registered

    return registered()


#: For help texts: the built-in methods' names and titles (a plugin's method is in the registry only).
_METHOD_NAMES = ", ".join(BUILTIN_METHODS)
_METHOD_TITLES = ", ".join(BUILTIN_METHODS.values())

#: A bad value given on the command line: printed as one ``error:`` line on stderr, exit status 2 (the generate job
#: raises the same type).
CLIError = UserInputError
_one_line = one_line
_user_errors = user_errors


# ---------------------------------------------------------------------------------------------------------------------
# checks of the arguments, before anything is loaded
# ---------------------------------------------------------------------------------------------------------------------
def check_device(value: Optional[str], flag: str = "--device") -> None:
    """A torch device that exists on this machine (``cpu``, ``cuda``, ``cuda:1``, ``mps``), else :class:`CLIError`."""
    if value is None:
        return
    import torch

    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise CLIError(f"{flag} {value}: not a torch device; use cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise CLIError(f"{flag} {value}: CUDA is not available ({why}); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise CLIError(
                f"{flag} {value}: no such GPU; this machine has {torch.cuda.device_count()} (cuda:0 ... "
                f"cuda:{torch.cuda.device_count() - 1})"
            )
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise CLIError(f"{flag} {value}: MPS is not available on this machine; use --device cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise CLIError(
            f"{flag} {value}: device type {device.type!r} is not supported here; use cpu, cuda, cuda:N or mps"
        )


def check_output_folder(value: str, flag: str = "--output") -> Path:
    """``value`` as an output folder that can be created (nothing is created yet), else :class:`CLIError`."""
    path = Path(value)
    for folder in (path.absolute(), *path.absolute().parents):
        if folder.exists():
            if not folder.is_dir():
                where = "is a file" if folder == path.absolute() else f"is under {folder}, which is a file"
                raise CLIError(f"{flag} {value}: {where}, not a folder; give a folder path")
            if not os.access(folder, os.W_OK | os.X_OK):
                raise CLIError(f"{flag} {value}: {folder} is not writable; give a folder you can write to")
            break
    return path


def _make_output_folder(path: Path, flag: str = "--output") -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CLIError(f"{flag} {path}: cannot create the folder ({err.strerror or err})") from None


def _type_name(hint: Any) -> str:
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return " or ".join(_type_name(a) for a in inner) + " or null"
    if origin is not None and args and origin not in (typing.Union,):
        return f"a list of {_type_name(args[0])}s"
    return {bool: "boolean (true or false)", int: "integer", float: "number", str: "string"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )


def _matches(value: Any, hint: Any) -> bool:
    """Whether the JSON value ``value`` is of the declared type ``hint`` (``Sequence[float]``, ``Optional[int]``, ...)."""
    import typing
    from collections.abc import Sequence as AbcSequence

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin is typing.Union:
        return any(value is None if a is type(None) else _matches(value, a) for a in args)
    if origin in (list, tuple, AbcSequence, typing.Sequence) or (
        isinstance(origin, type) and issubclass(origin, AbcSequence)
    ):
        return isinstance(value, list) and all(_matches(v, args[0] if args else Any) for v in value)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    return True  # a type the command line cannot check: the scheduler checks it


def check_acceleration_overrides(spec: Optional[str], flag: str = "--accel") -> None:
    """The ``name:key=value,...`` overrides of an acceleration spec, checked against the scheduler's declared setting
    types (lists of numbers or integers, booleans, numbers, integers, strings); values are JSON (``[0.2,0.1]``,
    ``false``, ``0.5``), as ``load_acceleration`` parses them. An unknown key or a value of the wrong type is a
    :class:`CLIError` naming the value and the expected type. Other specs (names, folders, files) pass unchanged."""
    if spec is None or ":" not in spec or os.path.exists(spec) or spec.endswith(".json"):
        return
    import typing

    from diffusers_var_accel.schedulers.presets import is_preset_name, load_preset_config
    from diffusers_var_accel.schedulers.scheduling_var_base import SCHEDULER_CLASSES
    from diffusers_var_accel.schedulers.specs import split_top_level

    name, _, overrides_text = spec.partition(":")
    if "/" in name:
        cls = SCHEDULER_CLASSES.get(load_preset_config(name).get("_class_name")) if is_preset_name(name) else None
    else:
        cls = {c.__name__.lower()[: -len("scheduler")]: c for c in SCHEDULER_CLASSES.values() if c.presets}.get(
            name.lower()
        )
    if cls is None:
        return  # an unknown name: load_acceleration says which names exist
    parameters = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    hints = typing.get_type_hints(cls.__init__)
    for item in split_top_level(overrides_text):
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise CLIError(f"{flag} {spec}: override {item!r} is not key=value")
        if key not in parameters:
            raise CLIError(
                f"{flag} {spec}: {cls.__name__} has no setting {key!r}; its settings: {', '.join(parameters)}"
            )
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text  # a bare word is a string, as load_acceleration reads it
        hint = hints.get(key, Any)
        if not _matches(value, hint):
            raise CLIError(
                f"{flag} {spec}: {key}={text!r} is not {_article(_type_name(hint))} (values are JSON, e.g. "
                f"{key}={json.dumps(_example(hint), separators=(',', ':'))})"
            )


def _article(name: str) -> str:
    return name if name.startswith("a list") else ("an " if name[0] in "aeiou" else "a ") + name


def _example(hint: Any) -> Any:
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        return _example(next(a for a in args if a is not type(None)))
    if origin is not None and args:
        return [_example(args[0])] * 2
    return {bool: False, int: 2, float: 0.5, str: "text"}.get(hint, None)


# ---------------------------------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------------------------------
#: ``--model``: the pipeline loader below the CLI and the benchmark (kept under this name: tests replace it).
def _load_pipeline(*args, **kwargs):
    """:func:`diffusers_var_accel.lab.loading.load_pipeline` (imported at the call: it imports torch)."""
    from diffusers_var_accel.lab.loading import load_pipeline

    return load_pipeline(*args, **kwargs)


def _load_accel(spec: Optional[str], family: str, preset_model: Optional[str] = None):
    """``--accel``: anything ``load_acceleration`` takes, plus a JSON file of any name (not only
    ``acceleration_config.json``, which ``load_acceleration`` reads from the file's folder)."""
    from diffusers_var_accel.schedulers.scheduling_var_base import VARAccelScheduler
    from diffusers_var_accel.schedulers.specs import load_acceleration

    if spec is None:
        return None
    path = Path(spec)
    if spec.endswith(".json"):
        if not path.is_file():
            raise ValueError(
                f"--accel {spec}: no such JSON file; pass a preset name ({', '.join(method_names())}, "
                "infinity-2b/lazyvar, ...), name:key=value, a scheduler folder or an existing "
                "acceleration_config.json"
            )
        if path.name != VARAccelScheduler.config_name:
            import shutil
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:  # from_pretrained reads <folder>/acceleration_config.json
                shutil.copyfile(path, Path(tmp) / VARAccelScheduler.config_name)
                return _checked_scheduler(load_acceleration(tmp, family), path)
    elif path.is_dir() and not (path / VARAccelScheduler.config_name).is_file():
        raise ValueError(
            f"the folder has no {VARAccelScheduler.config_name}; pass a scheduler folder "
            "(scheduler.save_pretrained(folder)), a JSON file or a preset name"
        )
    return _checked_scheduler(
        load_acceleration(spec, family, preset_model=preset_model), path / VARAccelScheduler.config_name
    )


def _checked_scheduler(scheduler, config_file: Path):
    """A scheduler that accelerates: the base class (a config whose ``_class_name`` names no scheduler class) is
    refused, not run as the baseline and recorded as accelerated."""
    from diffusers_var_accel.schedulers.scheduling_var_base import SCHEDULER_CLASSES, VARAccelScheduler

    if type(scheduler) is VARAccelScheduler:
        try:
            stored = json.loads(config_file.read_text(encoding="utf-8")).get("_class_name")
        except (OSError, ValueError, AttributeError):
            stored = None
        known = sorted(name for name, cls in SCHEDULER_CLASSES.items() if cls is not VARAccelScheduler)
        raise ValueError(
            f"{config_file.name}: _class_name {stored!r} is not an acceleration scheduler; known: {known}"
        )
    return scheduler


def _read_prompts(args: argparse.Namespace) -> List[str]:
    prompts: List[str] = list(args.prompt)
    for index, prompt in enumerate(prompts):
        if not prompt.strip():
            which = "the prompt" if len(prompts) == 1 else f"prompt {index + 1}"
            raise CLIError(
                f"{which} is {'empty' if not prompt else 'only whitespace'} ({prompt!r}); give a prompt "
                '(var-accel generate "two red circles"). The pipeline itself takes "" as diffusers does (the '
                "unconditional image), from Python"
            )
    if args.prompts_file:
        path = Path(args.prompts_file)
        if not path.is_file():
            raise CLIError(
                f"--prompts-file {args.prompts_file}: no such file; give a text file with one prompt per line"
            )
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as err:
            raise CLIError(
                f"--prompts-file {args.prompts_file}: not UTF-8 text ({err.reason} at byte {err.start})"
            ) from None
        prompts += [line.strip() for line in lines if line.strip()]
        if not prompts:
            raise CLIError(
                f"--prompts-file {args.prompts_file} holds no prompt (one prompt per line, blank lines skipped)"
            )
    if not prompts:
        raise CLIError('give a prompt (var-accel generate "two red circles") or --prompts-file FILE')
    return prompts


# ---------------------------------------------------------------------------------------------------------------------
# generate (the job itself: diffusers_var_accel.lab.generate_job)
# ---------------------------------------------------------------------------------------------------------------------
def _cmd_generate(args: argparse.Namespace) -> int:
    from diffusers_var_accel.lab.generate_job import GenerateJob, run_generate_job

    # everything that needs no model; the job checks the rest (the model's family, the output folder's contents)
    if args.batch_size < 1:
        raise CLIError(f"--batch-size {args.batch_size}: must be 1 or more")
    for flag, value in (("--height", args.height), ("--width", args.width)):
        if value is not None and value < 1:
            raise CLIError(f"{flag} {value}: must be a positive number of pixels")
    prompts = _read_prompts(args)
    check_device(args.device)
    out_dir = check_output_folder(args.output)
    check_acceleration_overrides(args.accel)
    job = GenerateJob(
        prompts=prompts,
        output=out_dir,
        model=args.model,
        height=args.height,
        width=args.width,
        seed=args.seed,
        sampling={k: getattr(args, k) for k in SAMPLING_KEYS},
        accel=args.accel,
        device=args.device,
        dtype=args.dtype,
        batch_size=args.batch_size,
        overwrite=args.overwrite,
        summary=args.summary,
        progress=args.progress,
        debug=args.debug,
    )
    # the loader is looked up here, at the call: tests replace cli._load_pipeline
    return run_generate_job(job, load_pipeline=_load_pipeline, load_acceleration=_load_accel)


def _cmd_demo(args: argparse.Namespace) -> int:
    from diffusers_var_accel.lab.demo import run_demo
    from diffusers_var_accel.schedulers.specs import split_acceleration_specs

    methods = split_acceleration_specs(args.methods)
    for method in methods:
        check_acceleration_overrides(method, _accel_flag(args))
    check_output_folder(args.output)
    with _user_errors("", args.debug):
        run_demo(
            prompts=args.prompt or None,
            num_prompts=args.num_prompts,
            methods=methods,
            seed=args.seed,
            repeats=args.repeats,
            output_dir=args.output,
            progress=args.progress,
            overwrite=args.overwrite,
        )
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    import importlib.util

    from diffusers_var_accel.lab.serve import GRADIO_MISSING, MAX_REPEATS

    if importlib.util.find_spec("gradio") is None:
        raise CLIError(GRADIO_MISSING)
    check_device(args.device)
    picked = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in picked if m not in method_names()]
    if unknown:
        raise CLIError(
            f"{_accel_flag(args)} {args.methods}: unknown methods {unknown}; the page's methods are {method_names()} "
            "(presets, overrides and compositions are typed in the page)"
        )
    if not 1 <= args.repeats <= MAX_REPEATS:
        raise CLIError(f"--repeats {args.repeats}: must be in [1, {MAX_REPEATS}]")
    from diffusers_var_accel.lab.serve import serve

    with _user_errors("--model ", args.debug):
        serve(
            model=args.model,
            device=args.device or "cpu",
            dtype=args.dtype,
            host=args.host,
            port=args.port,
            picked=picked,
            repeats=args.repeats,
        )
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from diffusers_var_accel.lab.bench import BenchSettings, finish_distributed, run_bench
    from diffusers_var_accel.schedulers.specs import split_acceleration_specs

    for method in split_acceleration_specs(args.methods):
        check_acceleration_overrides(method, _accel_flag(args))
    check_device(args.device)
    check_output_folder(args.output)
    sampling = {
        k: v
        for k, v in (
            ("guidance_scale", args.guidance_scale),
            ("tau", args.tau),
            ("top_k", args.top_k),
            ("top_p", args.top_p),
        )
        if v is not None
    }
    try:
        with _user_errors("", args.debug):
            settings = BenchSettings(
                model=args.model,
                prompts=args.prompts,
                num_prompts=args.num_prompts,
                seeds=args.seeds,
                methods=args.methods,
                repeats=args.repeats,
                warmup=args.warmup,
                batch_size=args.batch_size,
                output_dir=args.output,
                device=args.device,
                dtype=args.dtype,
                height=args.height,
                width=args.width,
                sampling=sampling,
                save_images=not args.no_images,
                progress=args.progress,
            )
            run_bench(settings)
    finally:
        finish_distributed()
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from diffusers_var_accel.lab.calibration import calibrate, calibration_prompts, write_calibration

    if args.target_flops_ratio is None and args.target_speedup is None:
        raise CLIError(
            "give a budget: --target-flops-ratio (counted FLOPs, e.g. 2.0) and/or --target-speedup (measured latency)"
        )
    check_device(args.device)
    out = check_output_folder(args.output)
    with _user_errors("--method ", args.debug):
        from diffusers_var_accel.lab.calibration import method_members

        method_members(args.method)
    with _user_errors("--seeds ", args.debug):
        from diffusers_var_accel.lab.bench.runner import parse_seeds

        seeds = parse_seeds(args.seeds)
    if args.prompts == "shapes":
        prompts = calibration_prompts(args.num_prompts)
    else:
        path = Path(args.prompts)
        if not path.is_file():
            raise CLIError(
                f"--prompts {args.prompts}: no such file; use 'shapes' (calibration shapes prompts, disjoint "
                "from the held-out set) or a text file with one prompt per line"
            )
        try:
            prompts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except UnicodeDecodeError as err:
            raise CLIError(f"--prompts {args.prompts}: not UTF-8 text ({err.reason})") from None
        if not prompts:
            raise CLIError(f"--prompts {args.prompts}: the file holds no prompt")
        prompts = prompts[: args.num_prompts]
    grid = None
    if args.grid is not None:
        try:
            grid = json.loads(Path(args.grid).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise CLIError(f"--grid {args.grid}: cannot read a JSON list of settings ({_one_line(err)})") from None
        if not isinstance(grid, list) or not grid or not all(isinstance(c, dict) for c in grid):
            raise CLIError(
                f"--grid {args.grid}: must hold a non-empty JSON list of settings objects, e.g. "
                '[{"group_scales": [-2, -1], "keep_ratios": [0.5, 0.25]}]'
            )
    with _user_errors("--model ", args.debug):
        from diffusers_var_accel.lab.bench.runner import load_bench_pipeline

        pipe, _ = load_bench_pipeline(args.model, args.device or "cpu", args.dtype)
    _make_output_folder(out)
    with _user_errors("", args.debug):
        result = calibrate(
            pipe,
            args.method,
            target_flops_ratio=args.target_flops_ratio,
            target_speedup=args.target_speedup,
            prompts=prompts,
            seeds=seeds,
            grid=grid,
            select=args.select,
            timing_repeats=args.timing_repeats,
            progress=args.progress,
        )
        written = write_calibration(result, out)
    if result["chosen"] is None:
        best = max((r["flops_ratio"] for r in result["tried"] if "flops_ratio" in r), default=0.0)
        raise CLIError(
            f"no setting of {args.method}'s grid meets the budget (highest counted FLOPs ratio {best:.2f}x); "
            f"every setting tried is in {written['calibration']}"
        )
    chosen = result["chosen"]
    print(
        f"{args.method}: {json.dumps(chosen['settings'])}\n  counted FLOPs ratio {chosen['flops_ratio']:.2f}x, measured "
        f"speed-up {chosen['speedup']:.2f}x, SSIM {chosen['ssim_mean']:.3f}, PSNR {chosen['psnr_mean']:.2f} dB"
        + (f", scorer accuracy {chosen['accuracy']:.0%}" if "accuracy" in chosen else "")
    )
    print(f"wrote {', '.join(str(p) for p in written.values())}")
    return 0


DTYPES = ("float32", "bfloat16", "float16")


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
        print(
            "error: --tokenizer needs --text-encoder (the tokenizer defaults to the text encoder's folder)",
            file=sys.stderr,
        )
        return 2
    for flag, value in (("--text-encoder", args.text_encoder), ("--tokenizer", args.tokenizer)):
        if value is not None and not Path(value).is_dir():
            print(
                f"error: {flag} {value}: not a folder; give a local transformers folder (downloaded beforehand)",
                file=sys.stderr,
            )
            return 2
    output = check_output_folder(args.output)
    from diffusers_var_accel.files import resolve_interrupted_replace

    resolve_interrupted_replace(output)  # what a killed earlier conversion left beside the folder
    record = _conversion_record(args)
    if (output / "model_index.json").is_file() and not args.overwrite:
        if _read_conversion_record(output) == record:
            print(f"{output} already holds this conversion (same sources and settings): nothing to do")
            return 0
        print(
            f"error: --output {output} already holds a pipeline (model_index.json); pass --overwrite or another folder",
            file=sys.stderr,
        )
        return 2
    dtype = getattr(torch, args.dtype)
    try:
        pipe = lab_family(args.family).convert_command().convert(args, dtype)
    except FileNotFoundError as err:  # a checkpoint file or folder that is not there, or not of the official layout
        if args.debug:
            raise
        raise CLIError(_one_line(err)) from err
    except (ValueError, OSError, RuntimeError) as err:  # the checkpoint itself does not convert (keys, shapes, file)
        if args.debug:
            raise
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 1
    from diffusers_var_accel.files import write_text_atomic
    from diffusers_var_accel.pipelines.pipeline_loading import CONVERSION_RECORD, save_pipeline_folder

    def finish(folder: Path) -> None:
        if args.hub_shim:
            from diffusers_var_accel.hub import write_hub_shim

            write_hub_shim(folder)
        write_text_atomic(Path(folder) / CONVERSION_RECORD, json.dumps(record, indent=2) + "\n")

    # all or nothing: the whole folder (shim and record included) is written beside --output and swapped in, so a
    # killed conversion leaves the earlier folder or none, and the same command again starts over
    save_pipeline_folder(pipe, output, (), {"safe_serialization": True}, finish=finish)
    components = [
        name for name in ("transformer", "vae", "text_encoder", "tokenizer") if getattr(pipe, name, None) is not None
    ]
    print(f'wrote {output} ({", ".join(components)}); run it with: var-accel generate "a red fox" --model {output}')
    return 0


def _conversion_record(args: argparse.Namespace) -> Dict[str, Any]:
    """What makes a conversion's output: the family, every option but ``--output`` / ``--overwrite`` / ``--debug``,
    and the stamp (size, modification time) of every file under the files and folders the options name."""
    options, sources = {}, {}
    for name, value in sorted(vars(args).items()):
        if name in ("output", "overwrite", "debug", "func") or callable(value):
            continue
        options[name] = value if isinstance(value, (bool, int, float, type(None))) else str(value)
        if isinstance(value, (str, os.PathLike)) and name != "family" and Path(value).exists():
            root = Path(value)
            files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
            sources[name] = [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    return {"command": "var-accel convert", "options": options, "sources": sources}


def _read_conversion_record(folder: Path) -> Optional[Dict[str, Any]]:
    from diffusers_var_accel.pipelines.pipeline_loading import CONVERSION_RECORD

    try:
        return json.loads((folder / CONVERSION_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _cmd_counter(command: str, argv: List[str]) -> int:
    """``var-accel flops / launches / memory``: the counter parses its own arguments; they are parsed here first with
    the same torch-free parser, so that ``--help`` and a mistyped flag answer before the counter imports torch."""
    import importlib

    from diffusers_var_accel.lab.counter_parsers import COUNTER_PARSERS, knows_every_family

    prog = f"var-accel {command}"
    if knows_every_family():  # else a plugin family's models and options are known to the counter only
        COUNTER_PARSERS[command](prog).parse_args(argv)
    counter = importlib.import_module(f"diffusers_var_accel.lab.bench.{command}")
    return counter.main(argv, prog=prog)


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


_MAIN_DESCRIPTION = f"""\
Infinity / HART next-scale (VAR) text-to-image generation with training-free acceleration
({_METHOD_TITLES}). Nothing is downloaded, except a pipeline that bench --model names by Hub id.
"""

_MAIN_EPILOG = """\
examples:
  var-accel demo
  var-accel serve                      # a web page on http://127.0.0.1:7860 (pip install ".[app]")
  var-accel generate "two red circles" --accel lazyvar -o out_lazyvar
  var-accel convert infinity --transformer infinity_2b_reg.pth --vae infinity_vae_d32reg.pth --output infinity-2b-diffusers
  var-accel flops --model infinity-2b --accel fastvar lazyvar
  var-accel calibrate --method lazyvar --target-flops-ratio 2.0 --output calibrated/lazyvar
  var-accel launches --models infinity-2b --methods baseline,lazyvar --syncs

Run var-accel COMMAND --help for a command's options. Docs: docs/cli.md.
"""

_GENERATE_DESCRIPTION = """\
Generate one PNG per prompt into --output, named <prompt>-s<seed>.png, with generations.json (the settings used:
model, size, guidance, tau, top-k, top-p, acceleration; per image the prompt, seed, file and seconds).
Prompt i (counting the positional prompts first, then the --prompts-file lines) uses seed --seed + i, whatever
--batch-size is, so batching does not change which seed an image gets. The same command again skips the images
already there (resume); other settings into the same --output are an error unless --overwrite. Under torchrun /
accelerate launch the (prompt, seed) items are split across the processes, as var-accel bench splits them.
"""

_GENERATE_EPILOG = """\
examples:
  var-accel generate "two red circles"                                   # embedded shapes model, baseline
  var-accel generate "two red circles" --accel lazyvar -o out_lazyvar    # the LazyVAR preset of the model's family
  var-accel generate --prompts-file prompts.txt --batch-size 4 --seed 10 --output out
  var-accel generate "a red fox" --model infinity-2b-diffusers --device cuda --dtype bfloat16 \\
      --height 1024 --width 1024 --accel infinity-2b/fastvar:skip_last_scales=false -o fox_fastvar
  var-accel generate "a red fox" --model tiny --accel my_lazyvar.json -o tiny   # a scheduler JSON file (any name)
  torchrun --nproc_per_node 8 -m diffusers_var_accel generate --prompts-file geneval.txt --device cuda -o geneval

--accel takes: baseline (the default); a method preset for the model's family ({methods}), or methods joined with
'+' (lazyvar+arvar: a composition of their presets);
a packaged preset (infinity-2b/lazyvar, hart-0.7b/fastvar, ...); either with :key=value,key=value overrides (values
parsed as JSON and checked against the scheduler's setting types: keep_ratios=[0.4,0.2,0.1,0.05],
skip_last_scales=false); a scheduler folder holding acceleration_config.json; or a JSON file of a scheduler config.
--model takes a folder saved with the Hub shim (diffusers_var_accel.hub.write_hub_shim) too.
"""

_CALIBRATE_DESCRIPTION = """\
Search a small, explicit grid of a method's settings (keep ratios, grouped or pruned scales, pruned layers, reference
scale, branch-halving scales, rotation step, code blending...) for the one whose images are closest to the baseline
image of the same prompt and seed (SSIM by default; PSNR always; LPIPS when its weights are cached; the shapes scorer on
shapes prompts), among those meeting the budget: a counted-FLOPs ratio and/or a measured speed-up. The cost
(settings x prompts x seeds generations) is printed first. Docs: docs/calibration.md.
"""

_CALIBRATE_EPILOG = """\
examples:
  var-accel calibrate --model embedded --method lazyvar --target-flops-ratio 2.0 --output calibrated/lazyvar
  var-accel calibrate --model infinity-2b-diffusers --device cuda --method lazyvar+arvar --target-speedup 2.5 \\
      --prompts my_prompts.txt --num-prompts 32 --seeds 0,1 --output calibrated/lazyvar+arvar
  var-accel generate "two red circles" --accel calibrated/lazyvar      # use the chosen setting
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
    parser.add_argument(
        "--text-encoder",
        help="local transformers folder of the text encoder; omit to convert without one "
        "(the pipeline then runs from prompt embeddings)",
    )
    parser.add_argument("--tokenizer", help="local tokenizer folder (default: the --text-encoder folder)")
    parser.add_argument(
        "--dtype", default="float32", choices=DTYPES, help="dtype of the saved weights (default float32)"
    )
    parser.add_argument("-o", "--output", required=True, help="output folder (created)")
    parser.add_argument(
        "--overwrite", action="store_true", help="write into an --output that already holds a pipeline"
    )
    parser.add_argument(
        "--hub-shim",
        action="store_true",
        help="also write the Hub pipeline.py shim "
        "(diffusers_var_accel.hub.write_hub_shim), so DiffusionPipeline.from_pretrained(..., "
        "trust_remote_code=True) loads the folder",
    )


def _number_type(
    kind, low: Optional[float] = None, high: Optional[float] = None, low_open: bool = False, what: str = ""
):
    """An argparse ``type``: a finite ``kind`` (int or float) in ``[low, high]`` (``(low, high]`` with ``low_open``);
    argparse's message then names the value and the range."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if kind is int else 'a number'}"
            ) from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if (low is not None and (value <= low if low_open else value < low)) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: {what}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


_GUIDANCE = _number_type(float)
_TAU = _number_type(float, 0, low_open=True, what="a temperature > 0")
_TOP_K = _number_type(int, 0, what="0 (off) or more")
_TOP_P = _number_type(float, 0, 1, what="0 (off) to 1")
_AT_LEAST_1 = _number_type(int, 1, what="1 or more")


class _Parser(argparse.ArgumentParser):
    """``argparse`` without abbreviated options (``--prompt`` is not ``--prompts-file``), with ``--debug``; an unknown
    option is named with the close one of its command (``--accell``: did you mean ``--accel``?)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        if self.add_help:
            self.add_argument(
                "--debug",
                action="store_true",
                default=argparse.SUPPRESS,
                help="show the Python traceback of an error instead of its one-line message",
            )

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._suggestion(parsed, extras)}")
        return parsed

    def _suggestion(self, parsed: argparse.Namespace, extras: List[str]) -> str:
        import difflib

        parser: argparse.ArgumentParser = self
        for action in self._actions:  # the command's own parser holds its options
            if isinstance(action, argparse._SubParsersAction) and getattr(parsed, action.dest, None) in action.choices:
                parser = action.choices[getattr(parsed, action.dest)]
        options = [option for action in parser._actions for option in action.option_strings]
        hints = []
        for extra in extras:
            if extra.startswith("--"):
                close = difflib.get_close_matches(extra.split("=", 1)[0], options, n=1, cutoff=0.6)
                if close:
                    hints.append(f"did you mean {close[0]} for {extra.split('=', 1)[0]}?")
        return f" ({'; '.join(hints)})" if hints else ""


class _StoreSpelling(argparse._StoreAction):
    """Stores the value and the option as typed (``--accel`` or its alias ``--methods``), so that an error about the
    value names the flag the user typed (``args.<dest>_flag``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_flag", option_string)


def default_threads() -> int:
    """torch's intra-op CPU threads when ``--threads`` is not given: the usable cores less one, at least 1. Measured on
    the embedded model, 2 cores, one image: quiet, 1 thread 0.53 s and 2 threads 3.03 s (the machine shared with other
    jobs); beside one busy process per core, 1 thread 1.91 s and 2 threads 15.05 s (docs/benchmarks.md, "Threads"):
    a thread per core collapses as soon as a neighbour takes a core."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


def _add_accel_list_flag(parser: argparse.ArgumentParser, help_tail: str) -> None:
    """``--accel SPECS`` (alias ``--methods``): the comma-separated methods a command runs beside the baseline."""
    parser.add_argument(
        "--accel",
        "--methods",
        dest="methods",
        action=_StoreSpelling,
        metavar="SPECS",
        default=",".join(DEFAULT_BENCH_METHODS),
        help="comma-separated, each one of: " + _ACCEL_VOCABULARY.format(methods=_METHOD_NAMES) + help_tail,
    )


def _add_threads_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        metavar="N",
        default=None,
        help=f"torch's intra-op CPU threads (default: the usable cores less one, at least 1; here {default_threads()}). "
        "A thread per core collapses beside a busy neighbour (docs/benchmarks.md, Threads)",
    )


def parse_threads(value: Optional[str]) -> int:
    """``--threads`` as a number of threads (``None``: :func:`default_threads`); a bad value is a one-line error."""
    if value is None:
        return default_threads()
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if threads < 1 or str(value).strip() != str(threads):
        raise CLIError(f"--threads {value}: must be a whole number of threads, 1 or more")
    return threads


def _torch_threads() -> Optional[int]:
    """torch's intra-op threads if torch is already imported (``None`` otherwise: nothing to restore)."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def _set_torch_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def apply_threads(args: argparse.Namespace) -> Optional[int]:
    """Set torch's intra-op threads from ``--threads`` for the commands that take it (before any work); the count."""
    if not hasattr(args, "threads"):
        return None
    threads = parse_threads(args.threads)
    _set_torch_threads(threads)
    return threads


def _accel_flag(args: argparse.Namespace, dest: str = "methods") -> str:
    """The acceleration flag the user typed (``--accel`` when none was: the default was used)."""
    return getattr(args, f"{dest}_flag", None) or "--accel"


#: What ``--accel`` takes, in every command (one vocabulary).
_ACCEL_VOCABULARY = (
    "baseline, a method ({methods}), methods joined with '+' (lazyvar+arvar), a packaged preset "
    "(infinity-2b/lazyvar), name:key=value overrides, a scheduler folder or an acceleration_config.json file"
)


def _sampling_default(family_defaults: str) -> str:
    from diffusers_var_accel.embedded import EMBEDDED_SAMPLING

    embedded = EMBEDDED_SAMPLING
    return family_defaults.format(
        **{k: ("off" if v is None or v == 0 and k in ("top_k", "top_p") else v) for k, v in embedded.items()}
    )


def build_parser(argv: Optional[List[str]] = None) -> argparse.ArgumentParser:
    """The ``var-accel`` parser. Given the command line (``argv``), a ``convert`` family's own options (whose module
    imports its converter, and torch) are added only when that family is named; without it, all of them are."""
    parser = _Parser(
        prog="var-accel",
        description=_MAIN_DESCRIPTION,
        epilog=_MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="{generate,demo,serve,bench,calibrate,convert,flops,launches,memory}",
        parser_class=_Parser,
    )
    gen = sub.add_parser(
        "generate",
        help="generate images from prompts",
        description=_GENERATE_DESCRIPTION,
        epilog=_GENERATE_EPILOG.replace("{methods}", _METHOD_NAMES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gen.add_argument("prompt", nargs="*", help="prompt(s)")
    gen.add_argument("--prompts-file", help="a text file with one prompt per line")
    gen.add_argument(
        "--model",
        help="'embedded' (the default: the packaged shapes model), a converted Infinity or HART "
        "pipeline folder (var-accel convert; with or without the Hub shim), or 'tiny' / 'tiny-hart' "
        "(random weights)",
    )
    gen.add_argument(
        "--height",
        type=int,
        help="image height (default: the model's own size; Infinity: an official size, 256 "
        "for the tiny model; the embedded model and HART make one size)",
    )
    gen.add_argument("--width", type=int, help="image width (default: the height)")
    gen.add_argument("--seed", type=int, default=0, help="seed of the first prompt; prompt i uses seed + i")
    gen.add_argument(
        "--summary",
        action="store_true",
        help="after each call, print what acceleration did per pass (tokens computed, layers per token, CFG rows, "
        "scales grouped or skipped, KV kept) and the call's counted FLOPs against the baseline's (two more calls)",
    )
    gen.add_argument(
        "--guidance-scale",
        type=_GUIDANCE,
        help=_sampling_default(
            "CFG scale (default: the model's own: embedded {guidance_scale}; an Infinity folder / tiny 4.0; HART 4.5)"
        ),
    )
    gen.add_argument(
        "--tau",
        type=_TAU,
        help=_sampling_default(
            "sampling temperature, Infinity only (default: embedded {tau}; an Infinity folder / tiny 0.5)"
        ),
    )
    gen.add_argument(
        "--top-k",
        type=_TOP_K,
        help=_sampling_default(
            "top-k, 0 = off (default: embedded {top_k}; an Infinity folder / tiny 900; HART the official 600 / 300 per size)"
        ),
    )
    gen.add_argument(
        "--top-p",
        type=_TOP_P,
        help=_sampling_default("top-p (default: embedded {top_p}; an Infinity folder / tiny 0.97; HART 0 = off)"),
    )
    gen.add_argument(
        "--device",
        default="cpu",
        help="torch device: cpu (default), cuda, cuda:N, mps; under torchrun / "
        "accelerate launch, cuda is each process's own GPU",
    )
    gen.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="weights dtype (default float32)",
    )
    gen.add_argument(
        "-o",
        "--output",
        default="outputs",
        help="output folder (default outputs): the PNG files "
        "(<prompt>-s<seed>.png) and generations.json; running again with the same settings adds to it and "
        "skips images already there (resume)",
    )
    gen.add_argument(
        "--overwrite",
        action="store_true",
        help="--output holds images made with other settings: delete "
        "them and start afresh (without it, that is an error)",
    )
    gen.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar per image")
    gen.add_argument(
        "--accel",
        metavar="NAME|JSON",
        help="acceleration, one of: " + _ACCEL_VOCABULARY.format(methods=_METHOD_NAMES) + " (default baseline)",
    )
    gen.add_argument(
        "--batch-size",
        type=int,
        default=1,
        help="prompts per pipeline call (default 1); each image keeps its own seed",
    )
    _add_threads_flag(gen)
    gen.set_defaults(func=_cmd_generate)

    demo = sub.add_parser(
        "demo",
        help="the embedded shapes model: baseline vs every acceleration preset (table, grid, report)",
        description="Generate shapes prompts with the embedded model (offline), baseline and every preset; "
        "print time, speed-up, FLOPs, PSNR/SSIM vs the baseline image and the scorer's "
        "accuracy; write report.json and grid.png.",
    )
    demo.add_argument("prompt", nargs="*", help="shapes prompts (default: --num-prompts held-out prompts)")
    demo.add_argument(
        "--num-prompts", type=_AT_LEAST_1, default=6, help="held-out prompts when none is given (default 6)"
    )
    _add_accel_list_flag(demo, " (default: baseline and every registered method; --methods is the same flag)")
    demo.add_argument("--seed", type=int, default=0, help="prompt i uses seed + i (default 0)")
    demo.add_argument(
        "--repeats",
        type=_AT_LEAST_1,
        default=1,
        help="timed generations per method and prompt, after one "
        "untimed call per method (default 1; the median and spread are reported)",
    )
    demo.add_argument(
        "-o", "--output", default="demo_outputs", help="output folder: report.json, grid.png (default demo_outputs)"
    )
    demo.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier demo's report.json and grid.png in --output (without it, they are an error)",
    )
    demo.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar (default: shown)")
    _add_threads_flag(demo)
    demo.set_defaults(func=_cmd_demo)

    srv = sub.add_parser(
        "serve",
        help="a web page: type a prompt, pick methods, see the baseline and each method side "
        'by side with time, FLOPs and fidelity (Gradio: pip install ".[app]")',
        description="Serve a Gradio page that generates a prompt with the baseline and the chosen "
        "methods (same seed) and shows them side by side with each one's time (median "
        "and spread of interleaved rounds), counted FLOPs, speed-up and PSNR / SSIM to the "
        "baseline; offline on the embedded model by default. One pipeline serves every "
        "visitor through a queue.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    srv.add_argument(
        "--model",
        help="'embedded' (default: the packaged shapes model), a converted Infinity or HART "
        "pipeline folder, or 'tiny' / 'tiny-hart' (random weights)",
    )
    srv.add_argument("--device", default="cpu", help="torch device")
    srv.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weights dtype")
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    srv.add_argument(
        "--port", type=_number_type(int, 1, 65535, what="a port in [1, 65535]"), default=7860, help="port"
    )
    srv.add_argument(
        "--accel",
        "--methods",
        dest="methods",
        action=_StoreSpelling,
        metavar="METHODS",
        default="lazyvar,fastvar",
        help=f"comma-separated methods ticked when the page opens ({_METHOD_NAMES}; presets, overrides and "
        "compositions are typed in the page; --methods is the same flag)",
    )
    srv.add_argument("--repeats", type=int, default=2, help="timed rounds per request (the page can change it)")
    _add_threads_flag(srv)
    srv.set_defaults(func=_cmd_serve)

    bench = sub.add_parser(
        "bench",
        help="benchmark the baseline against acceleration methods: time, FLOPs, memory, fidelity (JSON, table, plots)",
        description=_BENCH_DESCRIPTION,
        epilog=_BENCH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument(
        "--model",
        help="'embedded' (default: the packaged shapes model), a converted Infinity or HART pipeline "
        "folder, a Hub id (owner/name), or 'tiny' / 'tiny-hart' (random weights)",
    )
    bench.add_argument(
        "--prompts",
        default="shapes",
        help="'shapes' (default: held-out shapes prompts), 'geneval' (the packaged "
        '553 GenEval prompts), or a prompt file: .jsonl (a "prompt" per line, e.g. GenEval\'s '
        "evaluation_metadata.jsonl), .json (a list, or MJHQ-30K's meta_data.json) or .txt (one per line)",
    )
    bench.add_argument(
        "--num-prompts",
        type=int,
        help="how many prompts (shapes: the first N, default 24; a file: N spread evenly over it, default all)",
    )
    bench.add_argument(
        "--seeds",
        default="0",
        help="seeds per prompt: '0', '0,1,2' or '0-3' (default 0); GenEval's sample index is the seed's position",
    )
    _add_accel_list_flag(
        bench,
        f"; the baseline always runs first (default {','.join(DEFAULT_BENCH_METHODS)}; --methods is the same flag)",
    )
    bench.add_argument("--repeats", type=int, default=3, help="timed rounds per batch of prompts (default 3)")
    bench.add_argument(
        "--warmup", type=int, default=1, help="untimed rounds of every method first, per process (default 1)"
    )
    bench.add_argument(
        "--batch-size", type=int, default=1, help="images per call (default 1); each image keeps its own seed"
    )
    bench.add_argument("--height", type=int, help="image height (default: the model's size)")
    bench.add_argument("--width", type=int, help="image width (default: the height)")
    bench.add_argument(
        "--guidance-scale",
        type=_GUIDANCE,
        help="CFG scale (default: the embedded model's evaluated setting, else the pipeline's default)",
    )
    bench.add_argument("--tau", type=_TAU, help="sampling temperature (Infinity only)")
    bench.add_argument("--top-k", type=_TOP_K, help="top-k (0 = off)")
    bench.add_argument("--top-p", type=_TOP_P, help="top-p")
    bench.add_argument("--device", help="default: the process's GPU if there is one, else the CPU")
    bench.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="weights dtype when loading --model (default float32)",
    )
    bench.add_argument("-o", "--output", default="bench_outputs", help="output folder (default bench_outputs)")
    bench.add_argument("--no-images", action="store_true", help="do not write the generated images")
    bench.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    _add_threads_flag(bench)
    bench.set_defaults(func=_cmd_bench)

    cal = sub.add_parser(
        "calibrate",
        help="search a method's settings for the one closest to the baseline under a FLOPs "
        "or speed-up budget (acceleration_config.json, calibration.json, frontier.png)",
        description=_CALIBRATE_DESCRIPTION,
        epilog=_CALIBRATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cal.add_argument(
        "--model",
        help="'embedded' (default: the packaged shapes model), a converted Infinity or HART pipeline "
        "folder, or a Hub id (owner/name)",
    )
    cal.add_argument(
        "--accel",
        "--method",
        dest="method",
        required=True,
        metavar="NAME",
        help=f"the method whose settings are searched: {_METHOD_NAMES}, or methods joined with '+' (lazyvar+arvar); "
        "--method is the same flag",
    )
    cal.add_argument(
        "--target-flops-ratio",
        type=_number_type(float, 1, what="a FLOPs ratio >= 1"),
        help="keep settings whose counted FLOPs ratio (baseline / setting) is at least this, e.g. 2.0",
    )
    cal.add_argument(
        "--target-speedup",
        type=_number_type(float, 1, what="a speed-up >= 1"),
        help="keep settings whose measured latency ratio on --device is at least this",
    )
    cal.add_argument(
        "--prompts",
        default="shapes",
        help="'shapes' (default: shapes prompts disjoint from the 200 held-out "
        "prompts) or a text file with one prompt per line (your own prompts)",
    )
    cal.add_argument(
        "--num-prompts", type=_AT_LEAST_1, default=8, help="calibration prompts (default 8; a file: its first N)"
    )
    cal.add_argument("--seeds", default="0", help="seeds per prompt: '0', '0,1' or '0-3' (default 0)")
    cal.add_argument(
        "--select",
        default="ssim",
        choices=["ssim", "psnr", "accuracy", "lpips"],
        help="the fidelity the choice maximises (default ssim; accuracy: shapes prompts, its ties go to the higher "
        "SSIM; lpips: minimised, needs its cached weights)",
    )
    cal.add_argument(
        "--grid",
        metavar="JSON",
        help="a JSON file with the list of settings to try instead of the method's "
        "built-in grid (diffusers_var_accel.lab.calibration.candidate_grid); a composition's entries hold one "
        "settings object per member",
    )
    cal.add_argument(
        "--timing-repeats", type=_AT_LEAST_1, default=3, help="interleaved timed calls per setting (default 3)"
    )
    cal.add_argument("--device", help="torch device (default cpu)")
    cal.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="weights dtype (default float32)",
    )
    cal.add_argument(
        "-o", "--output", required=True, help="output folder: acceleration_config.json, calibration.json, frontier.png"
    )
    cal.add_argument("--no-progress", dest="progress", action="store_false", help="no progress lines")
    cal.set_defaults(func=_cmd_calibrate)

    conv = sub.add_parser(
        "convert",
        help="official Infinity / HART checkpoints -> a diffusers pipeline folder",
        description=_CONVERT_DESCRIPTION,
        epilog=_CONVERT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    convertible = [family for family in lab_families() if family.converter]
    families = conv.add_subparsers(
        dest="family", required=True, metavar="{" + ",".join(f.name for f in convertible) + "}"
    )
    for family in convertible:  # each family's own options, next to its converter
        if argv is not None and family.name not in argv:  # not asked for: its name only, no converter imported
            families.add_parser(family.name, help=f"official {family.name} checkpoints -> a pipeline folder")
            continue
        command = family.convert_command()
        family_parser = families.add_parser(
            family.name,
            help=command.help,
            description=command.description,
            epilog=_CONVERT_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(family_parser)
        _add_convert_common(family_parser)
        family_parser.set_defaults(func=_cmd_convert)

    # parsed by diffusers_var_accel.lab.bench.flops itself (main() forwards the arguments); listed here for --help
    sub.add_parser(
        "flops",
        add_help=False,
        help="counted FLOPs table per model and method: --model infinity-2b|infinity-8b|hart-0.7b|... "
        "[--accel ...] (meta tensors: no weights needed)",
    )
    # parsed by diffusers_var_accel.lab.bench.launches itself, like flops
    sub.add_parser(
        "launches",
        add_help=False,
        help="kernel launches and host-device syncs per generation, every method on the real Infinity-2B and "
        "HART-0.7B structures at a tiny width on the CPU [--models ...] [--methods ...] [--syncs] [--json]",
    )
    # parsed by diffusers_var_accel.lab.bench.memory itself, like flops
    sub.add_parser(
        "memory",
        add_help=False,
        help="counted peak device memory of one generation per phase and part: --model M [--accel ...] [--weights "
        "int8|float8] [--offload model|group-block|group-leaf] [--tiling] [--json FILE] (meta tensors; no recipe flag: "
        "every documented recipe)",
    )
    return parser


#: What a Ctrl-C leaves, per command (every file is written under a temporary name and renamed: none is half-written).
INTERRUPTED = {
    "generate": "finished images are kept: run the same command again to resume",
    "calibrate": "calibrate writes its files when the search ends, so none was written: run the same command again "
    "to start the search over",
    "demo": "the demo writes report.json and grid.png when it ends, so none was written: run it again",
    "bench": "no half-written file is left; run the same command again to measure afresh",
    "convert": "no half-written file is left (the folder is not a pipeline until its model_index.json is there): run "
    "the same command again",
    "serve": "the page is stopped",
}


def command_paths(parser: argparse.ArgumentParser, prefix: Optional[List[str]] = None) -> List[List[str]]:
    """Every (sub-)command ``parser`` has, as the words that name it (``["convert", "hart"]``), nested ones too."""
    paths = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                path = [*(prefix or []), name]
                paths.append(path)
                paths.extend(command_paths(sub, path))
    return paths


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        # the counters parse their own arguments: a --debug before their name goes to them, not to the main parser
        leading_debug = (
            ["--debug"] if argv[:1] == ["--debug"] and argv[1:2] in (["flops"], ["launches"], ["memory"]) else []
        )
        command = argv[len(leading_debug) :]
        if command and command[0] in ("flops", "launches", "memory"):
            return _cmd_counter(command[0], command[1:] + leading_debug)
        args = build_parser(argv).parse_args(argv)
        args.debug = getattr(args, "debug", False)
        threads_before = _torch_threads()
        apply_threads(args)
        try:
            return args.func(args)
        finally:  # main() called in a process that goes on (a test, a notebook) leaves its thread count as it was
            if threads_before is not None:
                _set_torch_threads(threads_before)
    except SystemExit as exit_:  # argparse (--help: 0; a bad value: 2, with the allowed values on stderr)
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except CLIError as err:
        if "--debug" in argv:
            raise
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if "--debug" in argv:
            raise
        command = next((a for a in argv if not a.startswith("-")), "")
        print(f"interrupted; {INTERRUPTED.get(command, 'no half-written file is left')}", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
