"""``var-accel bench``: every method on every (prompt, seed), timed side by side, with FLOPs, memory and fidelity.

For one pipeline (the embedded model by default), a prompt set (:mod:`~diffusers_var_accel.lab.bench.prompts`), seeds
and methods (``baseline``, presets, ``name:key=value`` overrides, scheduler folders or JSON files), :func:`run_bench`
generates every work item (prompt, seed) with every method and measures

* **latency per image**: the whole pipeline call (text encoder, next-scale loop, decode, post-processing to uint8),
  divided by the batch size. ``warmup`` rounds of every method are run first and discarded; then, for every batch of
  work items, ``repeats`` rounds run every method in turn (order reversed every other round), so slow drift of the
  machine hits all methods alike; CUDA is synchronised before and after each call. Reported: min / median / max
  over all timed images; the **speed-up** is the baseline's median divided by the method's, from the same run (and
  per process in ``speedup_per_process``).
* **FLOPs per image**, counted by ``torch.utils.flop_counter`` on one real single-image call per method (the first
  prompt and seed), split into text encoder, transformer (the next-scale loop: condition encoding, every scale, and
  HART's diffusion head) and VAE (decode), plus the per-scale FLOPs;
* **time per scale** of one image (``repeats`` probed calls per method, :class:`~.probe.CallProbe`);
* **peak memory** of the timed calls (:class:`~.probe.PeakMemory`: ``torch.cuda.max_memory_allocated`` on CUDA, the
  per-call peak RSS of the process on a Linux CPU);
* **fidelity to the baseline image of the same prompt and seed**: PSNR, SSIM, LPIPS (when its weights are local)
  and FID* (Fréchet distance between the method's and the baseline's Inception features, when the FID weights are
  local; :mod:`~.metrics`); a metric that cannot run is reported as ``null`` with the reason under ``skipped``;
* the **shapes scorer's accuracy** for prompts of the shapes grammar.

**Scale-out.** Under ``torchrun`` or ``accelerate launch``, the work items are split between the processes with
``accelerate.PartialState.split_between_processes``; every process warms up, times all methods on its own share
(interleaved, so each process's speed-up is fair on its own), computes the per-item metrics and Inception / LPIPS
features, and ``accelerate.utils.gather_object`` brings the records to the main process, which sorts them by item
and writes the same files as a single process. Images are written by the process that made them.

Files in ``output_dir``: ``results.json``, ``results.md`` (the table), ``speedup_vs_fidelity.png``,
``scale_breakdown.png``, ``grid.png`` and each method's images: ``<method>/images/<prompt index:05d>-s<seed>.png``,
or for GenEval-style prompts GenEval's own layout ``<method>/geneval/<prompt index:05d>/metadata.jsonl`` +
``samples/<seed position:04d>.png`` (GenEval's evaluator scores that folder unchanged).
"""

from __future__ import annotations

import json
import math
import platform
import re
import statistics
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from diffusers_var_accel.lab.metrics import (
    MetricUnavailable,
    frechet_distance,
    image_sha256,
    load_fid_extractor,
    load_lpips,
)
from diffusers_var_accel.lab.bench.probe import CallProbe, PeakMemory, make_flop_counter, synchronize
from diffusers_var_accel.lab.bench.pairs import UNSTEADY_SPREAD, paired_speedup
from diffusers_var_accel.lab.bench.prompts import PromptSet, load_prompt_set
from diffusers_var_accel.files import atomic_file, remove_stale_temporaries, write_atomic, write_text_atomic
from diffusers_var_accel.families import MODEL_FAMILIES, model_family_names
from diffusers_var_accel.lab.families import check_sampling_options
from diffusers_var_accel.schedulers.registry import default_method_specs, method_names

#: Methods run when none are given: the baseline and every registered method (read when this module is imported;
#: ``run_bench(methods=None)`` reads the registry at the call).
DEFAULT_METHODS = default_method_specs()

#: ``fid_feature_extractor`` / ``lpips_fn`` default: the standard network, if its weights are on this machine.
USE_STANDARD_NETWORK = "standard"

#: Images per method shown in ``grid.png``.
GRID_IMAGES = 8

_BASELINE = "baseline"


# ---------------------------------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------------------------------
def parse_seeds(seeds: Union[str, int, Sequence[int]]) -> List[int]:
    """Seeds from ``"0,1,2"``, ``"0-3"`` (inclusive range), a mix (``"0-3,10"``), an int or a list of ints.

    Raises:
        ValueError: naming the bad part; seeds must be distinct integers >= 0.
    """
    allowed = "comma-separated integers >= 0 and inclusive ranges, e.g. '0', '0,1,2' or '0-3'"
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        values = [seeds]
    elif isinstance(seeds, str):
        values = []
        for part in (p.strip() for p in seeds.split(",")):
            match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
            if not match:
                raise ValueError(f"bad seeds {seeds!r}: {part!r} is not a seed or a range; expected {allowed}")
            lo, hi = int(match.group(1)), int(match.group(2) or match.group(1))
            if hi < lo:
                raise ValueError(f"bad seeds {seeds!r}: range {part!r} ends before it starts")
            values.extend(range(lo, hi + 1))
    else:
        values = list(seeds)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise ValueError(f"bad seeds {seeds!r}: expected {allowed}")
    if not values:
        raise ValueError(f"bad seeds {seeds!r}: no seed given; expected {allowed}")
    if len(set(values)) != len(values):
        raise ValueError(f"bad seeds {seeds!r}: a seed is repeated")
    return values


def parse_methods(methods: Union[str, Sequence[str]]) -> List[str]:
    """Method specs from a comma-separated string (``key=value`` parts continue the spec before them, see
    :func:`~diffusers_var_accel.schedulers.specs.split_acceleration_specs`) or a list; ``baseline`` is
    put first (added when missing). Raises ``ValueError`` for an empty list or a repeated method."""
    from diffusers_var_accel.schedulers.specs import split_acceleration_specs

    specs = (
        split_acceleration_specs(methods) if isinstance(methods, str) else [m.strip() for m in methods if m.strip()]
    )
    if not specs:
        raise ValueError(
            f"no method given; methods are 'baseline', preset names ({', '.join(method_names())}), "
            "'name:key=value,...' overrides or scheduler folders / JSON files"
        )
    specs = [_BASELINE if s.lower() in ("baseline", "none") else s for s in specs]
    duplicates = sorted({s for s in specs if specs.count(s) > 1})
    if duplicates:
        raise ValueError(f"method(s) {duplicates} given twice")
    return [_BASELINE] + [s for s in specs if s != _BASELINE]


def method_folders(methods: Sequence[str]) -> Dict[str, str]:
    """A distinct, file-system-safe folder name per method (``fastvar:skip_last_scales=false`` ->
    ``fastvar-skip_last_scales-false``; an existing scheduler folder or a JSON file -> its name)."""
    names: Dict[str, str] = {}
    for spec in methods:
        base = spec
        if spec.endswith(".json") or Path(spec).is_dir():
            path = Path(spec.rstrip("/"))
            base = path.parent.name if path.name == "acceleration_config.json" else path.stem
        slug = re.sub(r"[^A-Za-z0-9._]+", "-", base).strip("-.") or "method"
        candidate, n = slug, 2
        while candidate in names.values():
            candidate, n = f"{slug}-{n}", n + 1
        names[spec] = candidate
    return names


def check_methods(methods: Sequence[str]) -> None:
    """Fail early, before a model is loaded, on a method that no model family accepts: each spec must load with
    :func:`~diffusers_var_accel.schedulers.specs.load_acceleration` for Infinity or for HART (its
    message lists what is allowed), and a JSON file must exist."""
    from diffusers_var_accel.schedulers.specs import load_acceleration

    for spec in methods:
        if spec == _BASELINE:
            continue
        if spec.endswith(".json") and not Path(spec).is_file():
            raise ValueError(
                f"method {spec!r}: no such scheduler JSON file; methods are 'baseline', preset names "
                f"({', '.join(method_names())}) with optional ':key=value,...' overrides, or an existing "
                "scheduler folder / acceleration_config.json file"
            )
        errors = []
        for family in model_family_names():
            try:
                load_acceleration(spec, family)
                break
            except (ValueError, TypeError, OSError, KeyError) as err:
                errors.append(err)
        else:
            raise ValueError(f"unknown method {spec!r}: {errors[0]}") from None


def _load_schedulers(methods: Sequence[str], family: str, preset_model: Optional[str] = None) -> Dict[str, Any]:
    from diffusers_var_accel.schedulers.specs import load_acceleration

    schedulers = {}
    for spec in methods:
        try:  # a method name stands for the pipeline's own preset when it has one (the embedded model's)
            schedulers[spec] = load_acceleration(spec, family, preset_model=preset_model)
        except (ValueError, TypeError, OSError, KeyError) as err:
            raise ValueError(f"method {spec!r}: {err}") from None
    return schedulers


def load_bench_pipeline(model: Optional[str], device: Union[str, torch.device], dtype: str = "float32"):
    """``(pipeline, is_embedded)`` for ``model``: ``None`` / ``"embedded"`` (the packaged model), a family's tiny
    model (``"tiny"`` / ``"tiny-hart"``: random weights), a converted pipeline folder, or a Hub id (``owner/name``)
    whose ``model_index.json`` names a registered family's pipeline (``InfinityPipeline``, ``HARTPipeline``).

    Raises:
        ValueError: a folder without a pipeline, or a Hub id that cannot be resolved.
    """
    from diffusers_var_accel.embedded import EMBEDDED_MODEL_NAMES
    from diffusers_var_accel.lab.families import family_of_tiny_model
    from diffusers_var_accel.lab.loading import load_pipeline, model_names_hint

    device = str(device)
    is_embedded = model is None or model in EMBEDDED_MODEL_NAMES
    if is_embedded or family_of_tiny_model(model) is not None or Path(model).exists():
        return load_pipeline(model, device, dtype), is_embedded
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", model):
        raise ValueError(
            f"model {model!r}: not {model_names_hint().replace(' or ', ', ')}, an existing pipeline folder "
            "or a Hub id (owner/name)"
        )
    from huggingface_hub import hf_hub_download

    try:
        index = json.loads(Path(hf_hub_download(model, "model_index.json")).read_text())
    except Exception as err:  # network, missing repository, offline mode: one clear message
        raise ValueError(
            f"model {model!r}: no local folder of that name, and its model_index.json could not be "
            f"fetched from the Hub ({type(err).__name__}: {err})"
        ) from None
    from diffusers_var_accel.hub import HUB_SHIM_FILE, hub_shim_source

    classes = {cls.__name__: cls for cls in (family.pipeline_class() for family in MODEL_FAMILIES.values())}
    stored = index.get("_class_name")
    # the Hub-shim form (hub.write_hub_shim) stores ["pipeline", "<class>"]
    shim_form = isinstance(stored, list) and len(stored) == 2
    class_name = stored[1] if shim_form else stored
    if class_name not in classes:
        raise ValueError(f"model {model!r} holds a {stored!r}; the benchmark runs {sorted(classes)}")
    options = {}
    if shim_form:  # diffusers executes the repo's pipeline.py: trust it only when it is exactly our one-line shim
        try:
            shim_text = Path(hf_hub_download(model, HUB_SHIM_FILE)).read_text(encoding="utf-8")
        except Exception as err:
            raise ValueError(
                f"model {model!r}: model_index.json is in Hub-shim form but its {HUB_SHIM_FILE} could not be "
                f"fetched ({type(err).__name__}: {err})"
            ) from None
        if shim_text != hub_shim_source(class_name):
            raise ValueError(f"model {model!r}: {HUB_SHIM_FILE} is not the diffusers_var_accel shim; it is not run")
        options["trust_remote_code"] = True
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    return classes[class_name].from_pretrained(model, dtype=torch_dtype, **options).to(device), False


# ---------------------------------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------------------------------
def _as_tensor(image_HWC: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(image_HWC)).permute(2, 0, 1).unsqueeze(0).float().div(255.0)


def json_safe(value: Any) -> Any:
    """JSON without NaN / Infinity: ``inf`` becomes the string ``"inf"``, NaN ``null``; numpy scalars become Python."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (np.floating, float)):
        value = float(value)
        if math.isnan(value):
            return None
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else value
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def _stats(values: Sequence[float]) -> Dict[str, Optional[float]]:
    if not values:
        return {"min": None, "median": None, "max": None, "mean": None, "n": 0}
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "mean": statistics.fmean(values),
        "n": len(values),
    }


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    return f"CPU {cpu} ({torch.get_num_threads()} torch threads)".replace("  ", " ")


def _scorable(prompt: str) -> bool:
    from diffusers_var_accel.lab.data.shapes import parse_prompt

    try:
        parse_prompt(prompt)
    except ValueError:
        return False
    return True


def finish_distributed() -> None:
    """Tear the process group down after a distributed run (a gloo group left alive aborts the process at exit)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        from accelerate import PartialState

        state = PartialState()
        state.wait_for_everyone()
        state.destroy_process_group()


def process_state(device: Optional[str] = None):
    """``(state, device)`` of this process: ``accelerate.PartialState`` (one process, or one of a ``torchrun`` /
    ``accelerate launch`` run; a CPU run uses the gloo backend) and its device: ``device`` as given, except that
    ``None`` means the process's accelerator (``cuda:<local rank>``) if any, else the CPU, and under several processes
    ``"cuda"`` means the process's own GPU."""
    from accelerate import PartialState

    want_cpu = device == "cpu" or (device is None and not torch.cuda.is_available())
    state = PartialState(cpu=want_cpu)
    if device is None or (state.num_processes > 1 and device == "cuda"):
        device = str(state.device)
    return state, device


def process_share(state, items: Sequence[Any]) -> List[Any]:
    """This process's contiguous share of ``items`` (``split_between_processes``: process 0 first, the first
    processes one item more when the count does not divide; all of them in a single process)."""
    with state.split_between_processes(list(items)) as share:
        return list(share)


# ---------------------------------------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchSettings:
    """What one benchmark run measures (the arguments of ``var-accel bench``); :func:`run_bench` checks them.

    Attributes:
        model (`str`, *optional*): ``None`` / ``"embedded"`` (default), a family's tiny model (``"tiny"``), a pipeline folder or
            a Hub id (:func:`load_bench_pipeline`). Ignored when ``pipe`` is given.
        prompts (`str`, *optional*, defaults to `"shapes"`): ``"shapes"``, ``"geneval"`` or a prompt file
            (:func:`~diffusers_var_accel.lab.bench.prompts.load_prompt_set`).
        num_prompts (`int`, *optional*): prompts to use (shapes: 24 by default; files: all by default, else spread
            evenly over the file).
        seeds (`str` or `List[int]`, *optional*, defaults to `(0,)`): every prompt is generated once per seed; the image
            of (prompt, seed) uses ``torch.Generator(device).manual_seed(seed)`` for every method.
        methods (`str` or `List[str]`, *optional*): ``baseline`` (always run, first) and acceleration specs; by default
            the baseline and every registered method.
        repeats (`int`, *optional*, defaults to 3): timed rounds per batch (and probed calls per method).
        warmup (`int`, *optional*, defaults to 1): untimed rounds of every method before timing, per process.
        batch_size (`int`, *optional*, defaults to 1): images per call; each image has its own generator.
        output_dir: where the files go.
        device (`str`, *optional*): default: the process's accelerator (``cuda:<local rank>``) if any, else the CPU.
        dtype (`str`, *optional*, defaults to `"float32"`): weights dtype when loading ``model``.
        height (`int`, *optional*): image height (default: the model's).
        width (`int`, *optional*): image width (default: the model's).
        sampling (`dict`, *optional*): call arguments (``guidance_scale``, ``tau``, ``top_k``, ``top_p``...) on top of
            the embedded model's ``EMBEDDED_SAMPLING`` (embedded model) or the pipeline's defaults.
        save_images (`bool`, *optional*, defaults to `True`): write every method's images.
        progress (`bool`, *optional*, defaults to `True`): a progress bar on the main process.
        verbose (`bool`, *optional*, defaults to `True`): print the table and the output paths (main process).
    """

    model: Optional[str] = None
    prompts: str = "shapes"
    num_prompts: Optional[int] = None
    seeds: Union[str, int, Sequence[int]] = (0,)
    methods: Optional[Union[str, Sequence[str]]] = None
    repeats: int = 3
    warmup: int = 1
    batch_size: int = 1
    output_dir: Union[str, Path] = "bench_outputs"
    device: Optional[str] = None
    dtype: str = "float32"
    height: Optional[int] = None
    width: Optional[int] = None
    sampling: Optional[Dict[str, Any]] = None
    save_images: bool = True
    progress: bool = True
    verbose: bool = True


def run_bench(
    settings: Optional[BenchSettings] = None,
    *,
    pipe=None,
    fid_feature_extractor: Union[str, Callable[[torch.Tensor], torch.Tensor], None] = USE_STANDARD_NETWORK,
    lpips_fn: Union[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor], None] = USE_STANDARD_NETWORK,
    **setting_overrides: Any,
) -> Optional[Dict[str, Any]]:
    """Run the benchmark (see the module docstring) and write its files; returns the results on the main process
    (also in ``results.json``) and ``None`` on the other processes of a distributed run.

    Args:
        settings (`BenchSettings`, *optional*): what to measure (default: ``BenchSettings()``).
        pipe (*optional*): an already loaded pipeline.
        fid_feature_extractor (`str` or `Callable`, *optional*): ``"standard"`` (default: the standard FID network
            when its weights are on this machine), a callable (``(B, 3, H, W)`` in [0, 1] -> ``(B, D)`` features),
            or ``None`` to skip FID*.
        lpips_fn (`str` or `Callable`, *optional*): ``"standard"`` (default: the standard LPIPS network when its
            weights are on this machine), a callable (``(images, references)`` -> ``(B,)`` distances), or ``None``
            to skip LPIPS.
        **setting_overrides: fields of :class:`BenchSettings` replacing ``settings``' (``run_bench(num_prompts=1,
            methods="baseline,lazyvar")``); an unknown name raises a ``TypeError``.

    Raises:
        ValueError / FileNotFoundError: bad prompts, seeds, methods, numbers or model, naming the bad value.
        TypeError: a keyword that is no field of :class:`BenchSettings`.
    """
    settings = settings if settings is not None else BenchSettings()
    unknown = sorted(set(setting_overrides) - {f.name for f in fields(BenchSettings)})
    if unknown:
        allowed = [f.name for f in fields(BenchSettings)]
        raise TypeError(
            f"run_bench() got unknown settings {unknown}; allowed: {allowed} and pipe, fid_feature_extractor, lpips_fn"
        )
    settings = replace(settings, **setting_overrides)
    plan = _plan_bench(settings, pipe)
    networks = _metric_networks(plan, fid_feature_extractor, lpips_fn)
    run = _run_bench(plan, networks)
    gathered = _gather_runs(plan, run)
    if gathered is None:  # a process other than the main one: its records went to the main process
        return None
    results = _aggregate_bench(plan, networks, run, *gathered)
    _write_bench(plan, networks, run, results, settings.verbose)
    return results


@dataclass
class _BenchPlan:
    """What the benchmark runs: the checked inputs, the pipeline, its schedulers and this process's work items."""

    seed_list: List[int]
    method_list: List[str]
    prompt_set: PromptSet
    state: Any
    device: torch.device
    pipe: Any
    model_name: str
    family: str
    call_kwargs: Dict[str, Any]
    schedulers: Dict[str, Any]
    folders: Dict[str, str]
    items: List[Tuple[int, int]]
    mine: List[Tuple[int, int]]
    batches: List[List[Tuple[int, int]]]
    out_dir: Path
    repeats: int
    warmup: int
    batch_size: int
    dtype: str
    save_images: bool
    progress: bool

    def generate(self, method: str, batch: Sequence[Tuple[int, int]], callback=None) -> np.ndarray:
        """The uint8 images of ``batch``'s (prompt, seed) items with ``method``; each image its own generator."""
        gen_device = self.device if self.device.type == "cuda" else torch.device("cpu")
        texts = [self.prompt_set.prompts[p].prompt for p, _ in batch]
        generators = [torch.Generator(gen_device).manual_seed(self.seed_list[k]) for _, k in batch]
        images = self.pipe(
            texts,
            generator=generators,
            output_type="np",
            acceleration=self.schedulers[method],
            callback_on_step_end=callback,
            **self.call_kwargs,
        ).images
        return (np.clip(images, 0.0, 1.0) * 255).round().astype(np.uint8)


def _plan_bench(settings: BenchSettings, pipe) -> _BenchPlan:
    """1. the inputs, checked; 2. processes, device, pipeline, schedulers; this process's share of the work items."""
    model, prompts, num_prompts, seeds, methods = (
        settings.model,
        settings.prompts,
        settings.num_prompts,
        settings.seeds,
        settings.methods,
    )
    repeats, warmup, batch_size, device, dtype = (
        settings.repeats,
        settings.warmup,
        settings.batch_size,
        settings.device,
        settings.dtype,
    )
    height, width, sampling = settings.height, settings.width, settings.sampling
    for name, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0), ("batch_size", batch_size, 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    seed_list = parse_seeds(seeds)
    method_list = parse_methods(default_method_specs() if methods is None else methods)
    check_methods(method_list)
    prompt_set: PromptSet = load_prompt_set(prompts, num_prompts)

    if pipe is not None:
        device = str(pipe.device) if device is None else device
    state, device = process_state(device)
    device_t = torch.device(device)
    if pipe is None:
        pipe, is_embedded = load_bench_pipeline(model, device_t, dtype)
        model_name = model or "embedded"
    else:
        from diffusers_var_accel.embedded import EMBEDDED_MODEL_PATH

        model_name = str(getattr(pipe, "name_or_path", None) or type(pipe).__name__)
        is_embedded = Path(model_name).resolve() == EMBEDDED_MODEL_PATH
        model_name = "embedded" if is_embedded else model_name
    pipe.set_progress_bar_config(disable=True)
    family = pipe.model_family
    call_kwargs: Dict[str, Any] = {}
    if is_embedded:
        from diffusers_var_accel.embedded import EMBEDDED_SAMPLING

        call_kwargs.update(EMBEDDED_SAMPLING)
    call_kwargs.update({k: v for k, v in (sampling or {}).items()})
    check_sampling_options(family, call_kwargs)  # an option of another family (tau for HART) is refused
    call_kwargs.update({k: v for k, v in (("height", height), ("width", width)) if v is not None})
    schedulers = _load_schedulers(method_list, family, getattr(pipe, "preset_model", None))

    items = [(p, k) for p in range(len(prompt_set)) for k in range(len(seed_list))]
    mine = process_share(state, items)
    return _BenchPlan(
        seed_list=seed_list,
        method_list=method_list,
        prompt_set=prompt_set,
        state=state,
        device=device_t,
        pipe=pipe,
        model_name=model_name,
        family=family,
        call_kwargs=call_kwargs,
        schedulers=schedulers,
        folders=method_folders(method_list),
        items=items,
        mine=mine,
        batches=[mine[i : i + batch_size] for i in range(0, len(mine), batch_size)],
        out_dir=Path(settings.output_dir),
        repeats=repeats,
        warmup=warmup,
        batch_size=batch_size,
        dtype=dtype,
        save_images=settings.save_images,
        progress=settings.progress,
    )


@dataclass
class _MetricNetworks:
    """3. the metrics that need networks (used when available, else skipped with the reason) and the shapes scorer."""

    extractor: Optional[Callable[[torch.Tensor], torch.Tensor]]
    lpips_distance: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]
    scorable: List[bool]
    skipped: Dict[str, str]


def _metric_networks(plan: _BenchPlan, fid_feature_extractor, lpips_fn) -> _MetricNetworks:
    skipped: Dict[str, str] = {}

    def resolve(option, loader, name: str):
        if option is None:
            skipped[name] = "disabled by the caller"
            return None
        if option == USE_STANDARD_NETWORK:
            try:
                return loader(plan.device)
            except MetricUnavailable as err:
                skipped[name] = str(err)
                return None
        if not callable(option):
            raise ValueError(f"{name} option must be 'standard', a callable or None, got {option!r}")
        return option

    extractor = resolve(fid_feature_extractor, load_fid_extractor, "fid_star")
    lpips_distance = resolve(lpips_fn, load_lpips, "lpips")
    scorable = [_scorable(p.prompt) for p in plan.prompt_set.prompts]
    if not any(scorable):
        skipped["scorer"] = "no prompt is in the shapes grammar (the scorer only judges shapes prompts)"
    return _MetricNetworks(extractor, lpips_distance, scorable, skipped)


@dataclass
class _BenchRun:
    """What one process measured: per-item records, times, peaks, the grid's images, the probed scales."""

    records: List[Dict[str, Any]]
    image_size: Optional[List[int]]
    per_image_seconds: Dict[str, List[float]]
    peaks: Dict[str, List[Optional[int]]]
    nondeterministic: set
    grid_rows: Dict[str, List[np.ndarray]]
    per_scale: Dict[str, Optional[Dict[str, Any]]]
    flops: Dict[str, Optional[Dict[str, Any]]]
    peak_memory_kind: str


def _run_bench(plan: _BenchPlan, networks: _MetricNetworks) -> _BenchRun:
    """4.-5. warm-up (discarded), then interleaved timed rounds per batch, every image compared with the baseline's;
    6. on the main process, per-scale time and FLOPs of the first work item."""
    from tqdm.auto import tqdm

    from diffusers_var_accel.lab.data.scorer import score
    from diffusers_var_accel.lab.metrics import psnr, ssim

    method_list, batches, state = plan.method_list, plan.batches, plan.state
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(plan.out_dir, recursive=True)  # what a killed earlier run was writing
    meter = PeakMemory(plan.device)
    if meter.unavailable:
        networks.skipped["peak_memory"] = meter.unavailable
    show = plan.progress and state.is_main_process
    bar = tqdm(
        total=len(method_list) * (plan.warmup + plan.repeats * len(batches)) if batches else 0,
        desc="bench",
        disable=not show,
        unit="call",
    )

    if batches:
        for _ in range(plan.warmup):
            for m in method_list:
                plan.generate(m, batches[0])
                bar.update()
    records: List[Dict[str, Any]] = []
    image_size: Optional[List[int]] = None
    per_image_seconds: Dict[str, List[float]] = {m: [] for m in method_list}
    peaks: Dict[str, List[Optional[int]]] = {m: [None, None] for m in method_list}
    nondeterministic: set = set()
    grid_rows: Dict[str, List[np.ndarray]] = {m: [] for m in method_list}
    for batch in batches:
        images: Dict[str, np.ndarray] = {}
        seconds: Dict[str, List[float]] = {m: [] for m in method_list}
        for r in range(plan.repeats):
            for m in method_list if r % 2 == 0 else method_list[::-1]:
                meter.start()
                synchronize(plan.device)
                start = time.perf_counter()
                out = plan.generate(m, batch)
                synchronize(plan.device)
                elapsed = time.perf_counter() - start
                peak, increase = meter.stop()
                if peak is not None:
                    peaks[m] = [max(peaks[m][0] or 0, peak), max(peaks[m][1] or 0, increase)]
                seconds[m].append(elapsed / len(batch))
                if m not in images:
                    images[m] = out
                elif not np.array_equal(images[m], out):
                    nondeterministic.add(m)
                bar.update()
        for m in method_list:
            per_image_seconds[m] += seconds[m] * len(batch)
        image_size = [int(images[_BASELINE].shape[1]), int(images[_BASELINE].shape[2])]
        for j, (p, k) in enumerate(batch):
            entry = plan.prompt_set.prompts[p]
            reference = images[_BASELINE][j]
            ref_t = _as_tensor(reference)
            record: Dict[str, Any] = {
                "prompt_position": p,
                "prompt_index": entry.index,
                "prompt": entry.prompt,
                "category": entry.category,
                "seed": plan.seed_list[k],
                "seed_position": k,
                "process": state.process_index,
                "methods": {},
                "features": {},
            }
            for m in method_list:
                image = images[m][j]
                image_t = _as_tensor(image)
                row: Dict[str, Any] = {
                    "seconds_per_image": seconds[m],
                    "sha256": image_sha256(image),
                    "psnr": float(psnr(image, reference)),
                    "ssim": float(ssim(image, reference)),
                    "lpips": float(networks.lpips_distance(image_t, ref_t).reshape(-1)[0])
                    if networks.lpips_distance
                    else None,
                    "scorer_correct": bool(score(entry.prompt, image)["correct"]) if networks.scorable[p] else None,
                }
                if networks.extractor is not None:
                    record["features"][m] = (
                        networks.extractor(image_t).detach().to("cpu", torch.float32).reshape(-1).numpy()
                    )
                record["methods"][m] = row
                if plan.save_images:
                    _save_image(
                        plan.out_dir / plan.folders[m], entry, plan.seed_list[k], k, image, plan.prompt_set.geneval
                    )
                if state.is_main_process and len(grid_rows[m]) < GRID_IMAGES:
                    grid_rows[m].append(image)
            records.append(record)
    bar.close()
    per_scale, flops = _probe_first_item(plan)
    return _BenchRun(
        records, image_size, per_image_seconds, peaks, nondeterministic, grid_rows, per_scale, flops, meter.kind
    )


def _probe_first_item(plan: _BenchPlan):
    """``(per_scale, flops)`` per method: the main process's per-scale time (median of ``repeats`` interleaved
    probed calls) and counted FLOPs on the first work item (one image); ``None`` on the other processes."""
    method_list = plan.method_list
    per_scale: Dict[str, Optional[Dict[str, Any]]] = {m: None for m in method_list}
    flops: Dict[str, Optional[Dict[str, Any]]] = {m: None for m in method_list}
    if not plan.state.is_main_process:
        return per_scale, flops
    first = [(0, 0)]
    runs: Dict[str, List[Dict[str, Any]]] = {m: [] for m in method_list}
    for r in range(plan.repeats):
        for m in method_list if r % 2 == 0 else method_list[::-1]:
            with CallProbe(plan.pipe, plan.device) as probe:
                plan.generate(m, first, probe.on_scale_end)
            runs[m].append(probe.breakdown())
    for m in method_list:
        secs = [run["seconds"] for run in runs[m]]
        per_scale[m] = {
            "seconds": [statistics.median(s["scales"][i] for s in secs) for i in range(len(secs[0]["scales"]))],
            "text_encoder_seconds": statistics.median(s["text_encoder"] for s in secs),
            "decode_seconds": statistics.median(s["decode"] for s in secs),
            "other_seconds": statistics.median(s["other"] for s in secs),
            "scale_shapes": runs[m][0]["scale_shapes"],
        }
        counter = make_flop_counter()
        with counter:
            with CallProbe(plan.pipe, plan.device, counter) as probe:
                plan.generate(m, first, probe.on_scale_end)
        flops[m] = probe.breakdown()["flops"]
        per_scale[m]["flops"] = flops[m]["scales"]
    return per_scale, flops


def _gather_runs(plan: _BenchPlan, run: _BenchRun):
    """7. every process's records and summary on the main process, in (prompt, seed) / process order; ``None`` on the
    other processes."""
    from accelerate.utils import gather_object

    state = plan.state
    summary = {
        "process": state.process_index,
        "device_name": _device_name(plan.device),
        "num_items": len(plan.mine),
        "image_size": run.image_size,
        "median_seconds": {m: statistics.median(v) if v else None for m, v in run.per_image_seconds.items()},
        "peaks": run.peaks,
        "nondeterministic": sorted(run.nondeterministic),
    }
    all_records = gather_object(run.records)
    summaries = gather_object([summary])
    if not state.is_main_process:
        return None
    all_records.sort(key=lambda rec: (rec["prompt_position"], rec["seed_position"]))
    summaries.sort(key=lambda s: s["process"])
    return all_records, summaries


def _aggregate_bench(
    plan: _BenchPlan, networks: _MetricNetworks, run: _BenchRun, all_records, summaries
) -> Dict[str, Any]:
    """8. the results: per method (time, speed-up, FLOPs, memory, fidelity, KV cache), the run's settings, the items."""
    method_list, call_kwargs, pipe = plan.method_list, plan.call_kwargs, plan.pipe
    guidance = {k: call_kwargs[k] for k in ("guidance_scale", "cfg_list") if k in call_kwargs}
    kv_cache_bytes = {
        m: pipe.kv_cache_bytes(
            plan.schedulers[m],
            height=call_kwargs.get("height"),
            width=call_kwargs.get("width"),
            batch_size=plan.batch_size,
            cfg=pipe.guided_call(**guidance),
        )
        for m in method_list
    }
    results = _aggregate(
        all_records,
        summaries,
        method_list,
        plan.folders,
        run.per_scale,
        run.flops,
        networks.extractor is not None,
        networks.lpips_distance is not None,
        networks.skipped,
        run.peak_memory_kind,
    )
    results["run"] = {
        "model": plan.model_name,
        "family": plan.family,
        "height": None,
        "width": None,
        "device": str(plan.device),
        "device_name": summaries[0]["device_name"],
        "dtype": str(getattr(pipe, "dtype", plan.dtype)).replace("torch.", ""),
        "num_processes": plan.state.num_processes,
        "processes": [{k: s[k] for k in ("process", "device_name", "num_items")} for s in summaries],
        "prompt_source": plan.prompt_set.source,
        "prompts_in_source": plan.prompt_set.total,
        "num_prompts": len(plan.prompt_set),
        "geneval_layout": plan.prompt_set.geneval,
        "seeds": plan.seed_list,
        "num_items": len(all_records),
        "methods": method_list,
        "method_folders": plan.folders,
        "repeats": plan.repeats,
        "warmup": plan.warmup,
        "batch_size": plan.batch_size,
        "sampling": {k: v for k, v in call_kwargs.items() if k not in ("height", "width")},
        "peak_memory_kind": run.peak_memory_kind,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }
    results["run"]["height"], results["run"]["width"] = summaries[0]["image_size"]
    for m in method_list:  # counted from the plan (pipe.kv_cache_bytes), for one call of the benchmark's batch
        results["methods"][m]["kv_cache_bytes"] = kv_cache_bytes[m]
    results["run"]["scale_schedule"] = run.per_scale[_BASELINE]["scale_shapes"] if run.per_scale[_BASELINE] else None
    results["items"] = [{k: v for k, v in rec.items() if k != "features"} for rec in all_records]
    return results


def _write_bench(
    plan: _BenchPlan, networks: _MetricNetworks, run: _BenchRun, results: Dict[str, Any], verbose: bool
) -> None:
    """9. results.json, results.md, the two plots and the grid (main process); the table when ``verbose``."""
    from diffusers_var_accel.lab.bench.report import (
        format_markdown,
        format_table,
        plot_scale_breakdown,
        plot_speedup_vs_fidelity,
        save_grid,
    )

    out_dir = plan.out_dir
    write_text_atomic(out_dir / "results.json", json.dumps(json_safe(results), indent=2, allow_nan=False))
    write_text_atomic(out_dir / "results.md", format_markdown(results))
    plot_speedup_vs_fidelity(results, out_dir / "speedup_vs_fidelity.png")
    plot_scale_breakdown(results, out_dir / "scale_breakdown.png")
    save_grid({m: run.grid_rows[m] for m in plan.method_list}, out_dir / "grid.png")
    if verbose:
        print(format_table(results))
        for name, reason in networks.skipped.items():
            print(f"skipped {name}: {reason}")
        print(
            f"wrote {out_dir / 'results.json'}, results.md, speedup_vs_fidelity.png, scale_breakdown.png, grid.png"
            + (" and the images" if plan.save_images else "")
        )


def _save_image(folder: Path, entry, seed: int, seed_position: int, image: np.ndarray, geneval: bool) -> None:
    from PIL import Image

    if geneval:
        item = folder / "geneval" / f"{entry.index:05d}"
        (item / "samples").mkdir(parents=True, exist_ok=True)
        write_atomic(item / "metadata.jsonl", (entry.metadata_line + "\n").encode("utf-8"))
        path = item / "samples" / f"{seed_position:04d}.png"
    else:
        (folder / "images").mkdir(parents=True, exist_ok=True)
        path = folder / "images" / f"{entry.index:05d}-s{seed}.png"
    with atomic_file(path) as tmp:
        Image.fromarray(image).save(tmp)


def _aggregate(
    records,
    summaries,
    methods,
    folders,
    per_scale,
    flops,
    with_fid: bool,
    with_lpips: bool,
    skipped: Dict[str, str],
    memory_kind: Optional[str],
) -> Dict[str, Any]:
    """Per-method summary of the gathered per-item records (main process)."""
    from diffusers_var_accel.lab.data.shapes import CATEGORIES

    base_seconds = [s for rec in records for s in rec["methods"][_BASELINE]["seconds_per_image"]]
    base_median = statistics.median(base_seconds)
    base_flops = flops[_BASELINE]
    n_items = len(records)
    out: Dict[str, Any] = {}
    for m in methods:
        seconds = [s for rec in records for s in rec["methods"][m]["seconds_per_image"]]
        timing = _stats(seconds)
        paired = paired_speedup(base_seconds, seconds)  # aligned: the same records, rounds in the same order
        per_process = []
        for s in summaries:
            b, x = s["median_seconds"][_BASELINE], s["median_seconds"][m]
            per_process.append(None if not b or not x else b / x)
        psnrs = [rec["methods"][m]["psnr"] for rec in records]
        finite = [v for v in psnrs if math.isfinite(v)]
        ssims = [rec["methods"][m]["ssim"] for rec in records]
        lpips_values = [rec["methods"][m]["lpips"] for rec in records] if with_lpips else []
        fid = None
        if with_fid:
            if n_items >= 2:
                fid = frechet_distance(
                    np.stack([rec["features"][m] for rec in records]),
                    np.stack([rec["features"][_BASELINE] for rec in records]),
                )
            else:
                skipped["fid_star"] = "FID* needs at least 2 images per method"
        correct = [
            (rec["category"], rec["methods"][m]["scorer_correct"])
            for rec in records
            if rec["methods"][m]["scorer_correct"] is not None
        ]
        by_category: Dict[str, List[bool]] = {}
        for category, flag in correct:
            by_category.setdefault(category or "unknown", []).append(flag)
        per_category = {
            c: sum(v) / len(v)
            for c, v in sorted(
                by_category.items(), key=lambda kv: CATEGORIES.index(kv[0]) if kv[0] in CATEGORIES else len(CATEGORIES)
            )
        }
        f = flops[m]
        flop_summary: Dict[str, Any] = {
            "text_encoder_gflops": None,
            "transformer_gflops": None,
            "vae_gflops": None,
            "total_gflops": None,
            "ratio": None,
            "transformer_ratio": None,
        }
        if f is not None:
            transformer, total = sum(f["scales"]), f["text_encoder"] + sum(f["scales"]) + f["decode"] + f["other"]
            base_total = (
                base_flops["text_encoder"] + sum(base_flops["scales"]) + base_flops["decode"] + base_flops["other"]
            )
            flop_summary = {
                "text_encoder_gflops": f["text_encoder"] / 1e9,
                "transformer_gflops": transformer / 1e9,
                "vae_gflops": f["decode"] / 1e9,
                "other_gflops": f["other"] / 1e9,
                "total_gflops": total / 1e9,
                "ratio": base_total / total if total else None,
                "transformer_ratio": sum(base_flops["scales"]) / transformer if transformer else None,
            }
        peak_values = [s["peaks"][m] for s in summaries if s["peaks"][m][0] is not None]
        out[m] = {
            "spec": m,
            "folder": folders[m],
            "seconds_per_image": timing,
            # the median of the per-round ratios: each round ran the baseline and the method on the same item
            "speedup": paired[0],
            "speedup_spread": paired[1],
            "unsteady": paired[1] > UNSTEADY_SPREAD,
            "speedup_of_medians": base_median / timing["median"] if timing["median"] else None,
            "speedup_per_process": per_process,
            "flops": flop_summary,
            "peak_memory": {
                "kind": memory_kind,
                "peak_gib": max(p[0] for p in peak_values) / 2**30 if peak_values else None,
                "increase_gib": max(p[1] for p in peak_values) / 2**30 if peak_values else None,
            },
            "fidelity": {
                "psnr_mean": statistics.fmean(finite) if finite else (math.inf if psnrs else None),
                "psnr_median": statistics.median(psnrs) if psnrs else None,
                "identical_images": sum(1 for v in psnrs if math.isinf(v)),
                "ssim_mean": statistics.fmean(ssims) if ssims else None,
                "lpips_mean": statistics.fmean(lpips_values) if lpips_values else None,
                "fid_star": fid,
            },
            "scorer": {
                "accuracy": sum(flag for _, flag in correct) / len(correct) if correct else None,
                "n": len(correct),
                "per_category": per_category,
                "category_mean": statistics.fmean(per_category.values())
                if per_category
                else None,  # GenEval's overall
            },
            "per_scale": per_scale[m],
            "nondeterministic_processes": [s["process"] for s in summaries if m in s["nondeterministic"]],
        }
    notes = [
        "Time: the whole pipeline call (text encoder, next-scale loop, decode, post-processing to uint8) divided by the "
        "batch size; warm-up rounds excluded; every batch runs all methods in turn, in reversed order every other round; "
        "CUDA synchronised around every call. Speed-up: the median of the per-round ratios baseline / method (each "
        "round runs the baseline and the method on the same prompts), unsteady when they spread by more than "
        f"{UNSTEADY_SPREAD:.0%}; speedup_of_medians: the baseline's median s / image over the method's "
        "(speedup_per_process: that ratio within each process).",
        "FLOPs: torch.utils.flop_counter on one real single-image call per method (first prompt and seed); "
        "FLOPs = 2 x multiply-accumulates of matmul / linear / conv / attention, element-wise work not counted. "
        "transformer = the next-scale loop (condition encoding, every scale, HART's diffusion head); VAE = decode; "
        "the text encoder is counted apart. FLOPs ratio: baseline total / method total.",
        "Per-scale time: median of `repeats` probed calls of the first prompt and seed; a grouped pass (LazyVAR) is "
        "charged to the first scale of its group, a skipped scale costs ~0; scale 0 includes the condition encoding.",
        {
            "cuda_max_memory_allocated": "Peak memory: torch.cuda.max_memory_allocated over the method's timed calls (reset "
            "before each call); increase_gib is the part above what was allocated at the call's start.",
            "peak_rss": "Peak memory: the process's peak resident set size during the method's timed calls (VmHWM reset "
            "through /proc/self/clear_refs before each call), so it includes the model weights and the Python "
            "process; increase_gib is the part above the RSS at the call's start.",
        }.get(memory_kind, "Peak memory: not measured (see skipped)."),
        "Fidelity: PSNR / SSIM / LPIPS against the baseline image of the same prompt and seed on the saved uint8 images; "
        "the baseline's own PSNR is inf (identical images); psnr_mean averages the finite values.",
        f"FID*: Fréchet distance between the Inception features of the method's {n_items} images and the baseline's. "
        "It is only meaningful for thousands of images; with fewer images than the 2048 feature dimensions it is a "
        "rough consistency check, not a statistic to compare with published FID.",
    ]
    if any(r["nondeterministic_processes"] for r in out.values()):
        notes.append(
            "Some methods gave different images for the same (prompt, seed) across repeats "
            "(nondeterministic kernels); the fidelity metrics use the first repeat."
        )
    return {"methods": out, "skipped": dict(skipped), "notes": notes}
