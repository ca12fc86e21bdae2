"""Calibration: the setting of an acceleration method that stays closest to the baseline under a compute budget.

Every packaged preset is a paper's setting for Infinity-2B or HART-0.7B. On another model (another depth, another
schedule, the embedded shapes model) it can be far off. :func:`calibrate` searches a small, explicit and deterministic
grid of each method's real settings (:func:`candidate_grid`), keeps the candidates that meet the budget, and picks the
one whose images are closest to the baseline image of the same prompt and seed:

* **budget**: a counted-FLOPs ratio (``target_flops_ratio``: baseline FLOPs / accelerated FLOPs of one real call at the
  pipeline's own size and schedule, counted with ``var-accel bench``'s counter, text encoder and decoder included), a
  measured latency ratio on the current device (``target_speedup``: baseline and candidate timed interleaved), or both;
* **fidelity**: SSIM and PSNR to the baseline image, always; LPIPS when its weights are cached; the shapes scorer's
  accuracy when the prompts are shapes prompts. The chosen candidate has the highest mean of the ``select`` metric
  (SSIM by default) among those that meet the budget; ties go to the earlier candidate of the grid. Accuracy counts
  verdicts over a few prompts, so many candidates tie on it (every one that keeps all the baseline's verdicts): its
  ties go to the higher SSIM first.

The default calibration prompts for the embedded model (:func:`calibration_prompts`) are drawn from the shapes grammar
with their own seed, and every prompt string of the 200 held-out evaluation prompts
(:func:`~diffusers_var_accel.lab.data.shapes.heldout_prompts`) is removed from them, so the held-out set never decides a
setting. Given the same prompts, seeds and grid the search is deterministic (FLOPs and images do not depend on timing);
with ``target_speedup`` the feasible set depends on measured times.

Outputs (:func:`write_calibration`): ``acceleration_config.json`` (the chosen scheduler's ``save_pretrained`` layout:
``XScheduler.from_pretrained(folder)``, ``var-accel generate --accel folder``), ``calibration.json`` (the method, the
budget, the chosen setting and its numbers, and every setting tried with its numbers) and ``frontier.png`` (fidelity
against counted-FLOPs ratio of every setting tried).

Examples:
    ```py
    >>> from diffusers_var_accel import InfinityPipeline
    >>> from diffusers_var_accel.lab.calibration import calibrate, calibration_prompts, write_calibration

    >>> pipe = InfinityPipeline.from_pretrained("embedded")
    >>> result = calibrate(pipe, "lazyvar", target_flops_ratio=2.0, prompts=calibration_prompts(8), seeds=[0])
    >>> write_calibration(result, "calibrated/lazyvar")
    ```
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

import torch

from diffusers_var_accel.schedulers.registry import COMPOSE_SEPARATOR, get_method, method_names
from diffusers_var_accel.schedulers.composition import ComposedScheduler
from diffusers_var_accel.schedulers.scheduling_var_base import CALIBRATION_RECORD_NAME
from diffusers_var_accel.schedulers.scheduling_var_base import VARAccelScheduler
from diffusers_var_accel.lab.selection import decides

#: Seed of the default calibration prompts (the held-out set uses ``HELDOUT_SEED``; validation used seed 1).
CALIBRATION_PROMPT_SEED = 7

#: A PSNR of identical images is infinite; means use this value for them instead (and say so).
PSNR_CAP_DB = 60.0

#: The metrics ``select`` may name: the mean to maximise (``lpips``: to minimise).
SELECT_METRICS = ("ssim", "psnr", "accuracy", "lpips")

CALIBRATION_FILE = CALIBRATION_RECORD_NAME  # "calibration.json", read back by VARAccelScheduler.from_pretrained
FRONTIER_FILE = "frontier.png"


# ---------------------------------------------------------------------------------------------------------------------
# the candidate grids: each method's own (VARAccelScheduler.calibration_grid and composition_calibration_grid)
# ---------------------------------------------------------------------------------------------------------------------
def calibrated_methods(as_member: bool = False) -> List[str]:
    """The registered methods that ship a calibration grid (with ``as_member``: settings as a composition member),
    in registration order."""
    return [name for name in method_names() if get_method(name).has_calibration_grid(as_member)]


def method_members(method: str) -> List[str]:
    grids = calibrated_methods()
    example = COMPOSE_SEPARATOR.join(calibrated_methods(as_member=True)[:2])
    if not isinstance(method, str) or not method:
        raise ValueError(
            f"method must be a method name ({sorted(grids)}) or names joined with {COMPOSE_SEPARATOR!r}, "
            f"got {method!r}"
        )
    names = method.split(COMPOSE_SEPARATOR)
    for name in names:
        if name not in grids:
            why = "" if name not in method_names() else " (registered, but it has no calibration grid)"
            raise ValueError(
                f"method {name!r}{why} cannot be calibrated; methods with a grid: {sorted(grids)}, joined "
                f"with {COMPOSE_SEPARATOR!r} to compose ({example})"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"method {method!r} names a method twice; a composition holds each method once")
    if len(names) > 1:
        alone = [name for name in names if not get_method(name).has_calibration_grid(as_member=True)]
        if alone:
            raise ValueError(
                f"method {alone[0]!r} has a calibration grid but no settings as a composition member, so "
                f"{method!r} cannot be calibrated; methods that compose in calibration: "
                f"{sorted(calibrated_methods(as_member=True))}"
            )
    return names


def candidate_grid(method: str, num_layers: int) -> List[Dict[str, Any]]:
    """The candidates of ``method`` (a name or ``"a+b"``) for a model of ``num_layers`` blocks, in search order.

    A single method's candidate is its settings (``{"keep_ratios": [...], ...}``: the method's
    :meth:`~diffusers_var_accel.schedulers.scheduling_var_base.VARAccelScheduler.calibration_grid`); a composition's is
    one settings dict per member (``{"lazyvar": {...}, "arvar": {...}}``): the product of the members'
    :meth:`~diffusers_var_accel.schedulers.scheduling_var_base.VARAccelScheduler.composition_calibration_grid` (a few per
    method). A combination the composition refuses (two members routing the same block at the same scale) is recorded
    by :func:`calibrate` as not runnable.
    """
    names = method_members(method)
    if len(names) == 1:
        return get_method(names[0]).calibration_grid(num_layers)
    members = {name: get_method(name).composition_calibration_grid(num_layers) for name in names}
    return [dict(zip(names, combo)) for combo in itertools.product(*(members[n] for n in names))]


def build_candidate(method: str, settings: Dict[str, Any], model_family: str) -> VARAccelScheduler:
    """The scheduler of one candidate (settings over the constructor's defaults, ``model_family`` set)."""
    names = method_members(method)
    if len(names) == 1:
        return get_method(names[0])(**{**settings, "model_family": model_family})
    members = [get_method(n)(**{**settings[n], "model_family": model_family}) for n in names]
    return ComposedScheduler(members, model_family=model_family)


# ---------------------------------------------------------------------------------------------------------------------
# prompts
# ---------------------------------------------------------------------------------------------------------------------
def calibration_prompts(
    n: int = 8,
    seed: int = CALIBRATION_PROMPT_SEED,
    grammar: str = "original",
    words: Optional[Iterable[str]] = None,
) -> List[str]:
    """``n`` shapes prompts, categories interleaved, none of whose strings is among the 200 held-out prompts.

    Drawn with :func:`~diffusers_var_accel.lab.data.shapes.heldout_prompts` (its category round robin) in ``grammar``
    under ``seed``; a draw whose string occurs in the held-out set, or earlier in this list, is dropped. In the
    original grammar (the default, the embedded model's world) only ``counting``, ``position`` and ``color_attr``
    (and a few ``colors``) strings lie outside the held-out set; ``grammar="enlarged"`` draws prompts of every
    category outside it, for a model that knows the enlarged grammar's words. ``words``: keep only prompts made of
    these words (e.g. a word-level tokenizer's vocabulary).
    """
    from diffusers_var_accel.lab.data.shapes import heldout_prompts

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of calibration prompts must be an integer >= 1, got {n!r}")
    allowed = None if words is None else set(words)
    held_out = {e["prompt"] for e in heldout_prompts()}
    chosen: List[str] = []
    draws = 4 * n + 200
    while len(chosen) < n:
        for entry in heldout_prompts(draws, seed=seed, grammar=grammar):
            prompt = entry["prompt"]
            if prompt in held_out or prompt in chosen:
                continue
            if allowed is not None and not set(prompt.split()) <= allowed:
                continue
            chosen.append(prompt)
            if len(chosen) == n:
                break
        if len(chosen) < n:
            if draws > 20000:
                raise ValueError(
                    f"the shapes grammar {grammar!r} has only {len(chosen)} prompts outside the held-out set"
                    + ("" if allowed is None else " made of the given words")
                    + "; ask for fewer"
                )
            chosen, draws = [], draws * 4
    return chosen


def _is_shapes_prompt(prompt: str) -> bool:
    from diffusers_var_accel.lab.data.shapes import parse_prompt

    try:
        parse_prompt(prompt)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------------------------------------------------
# measuring
# ---------------------------------------------------------------------------------------------------------------------
def num_layers_of(pipe) -> int:
    """The number of transformer blocks of ``pipe``."""
    blocks = getattr(pipe.transformer, "blocks", None)
    if blocks is None:
        raise ValueError(
            f"{type(pipe.transformer).__name__} has no blocks; calibration needs a next-scale transformer with "
            "a list of blocks (transformer.blocks)"
        )
    return len(blocks)


def _count_flops(pipe, prompt: str, seed: int, scheduler, sampling: Dict[str, Any]) -> int:
    from diffusers_var_accel.lab.bench.probe import make_flop_counter

    counter = make_flop_counter()
    with counter:
        pipe(
            prompt, generator=torch.Generator().manual_seed(seed), output_type="pt", acceleration=scheduler, **sampling
        )
    return int(counter.get_total_flops())


def _generate(pipe, prompts: Sequence[str], seed: int, scheduler, sampling: Dict[str, Any]) -> torch.Tensor:
    generators = [torch.Generator().manual_seed(seed) for _ in prompts]
    return pipe(list(prompts), generator=generators, output_type="pt", acceleration=scheduler, **sampling).images


def _time_call(pipe, prompt: str, seed: int, scheduler, sampling: Dict[str, Any]) -> float:
    start = time.perf_counter()
    pipe(prompt, generator=torch.Generator().manual_seed(seed), output_type="pt", acceleration=scheduler, **sampling)
    return time.perf_counter() - start


def _load_lpips_if_cached():
    from diffusers_var_accel.lab.metrics import MetricUnavailable, load_lpips

    try:
        return load_lpips("cpu"), None
    except MetricUnavailable as err:
        return None, str(err)


def _fidelity(
    images: torch.Tensor, baseline: torch.Tensor, prompts: List[str], lpips_fn, shapes: bool, strict: bool = True
) -> Dict[str, Any]:
    from diffusers_var_accel.lab.metrics import psnr, ssim

    psnrs = [min(float(psnr(images[i : i + 1], baseline[i : i + 1])), PSNR_CAP_DB) for i in range(len(prompts))]
    ssims = [float(ssim(images[i : i + 1], baseline[i : i + 1])) for i in range(len(prompts))]
    out: Dict[str, Any] = dict(psnr=psnrs, ssim=ssims)
    if lpips_fn is not None:
        out["lpips"] = [float(v) for v in lpips_fn(images, baseline)]
    if shapes:
        from diffusers_var_accel.lab.data.scorer import score

        out["correct"] = [
            bool(score(p, images[i].permute(1, 2, 0).clamp(0, 1).numpy(), strict=strict)["correct"])
            for i, p in enumerate(prompts)
        ]
    return out


def _package_version() -> str:
    from diffusers_var_accel.version import __version__

    return __version__


def _duration(seconds: float) -> str:
    """``"45 s"``, ``"12 min"``, ``"2.3 h"``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values))


def _check_budget(name: str, value: Optional[float]) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1.0:
        raise ValueError(f"{name} must be a finite number >= 1.0 (baseline cost / accelerated cost), got {value!r}")
    return float(value)


def model_name(pipe) -> str:
    """The name a calibration record gives the model: a packaged model's own name (``"embedded"``, not the folder it
    was installed to on this machine), else what the pipeline was loaded from (a folder as given, a Hub id)."""
    from diffusers_var_accel.pipelines.preset_models import packaged_model_presets

    name = str(getattr(pipe, "name_or_path", "") or "")
    if name:
        try:
            return packaged_model_presets().get(Path(name).resolve(), name)
        except OSError:
            pass
    return name


@decides("a calibration search")
def calibrate(
    pipe,
    method: str,
    *,
    target_flops_ratio: Optional[float] = None,
    target_speedup: Optional[float] = None,
    prompts: Optional[Sequence[str]] = None,
    seeds: Sequence[int] = (0,),
    grid: Optional[List[Dict[str, Any]]] = None,
    select: str = "ssim",
    sampling: Optional[Dict[str, Any]] = None,
    timing_repeats: int = 3,
    use_lpips: bool = True,
    progress: bool = True,
) -> Dict[str, Any]:
    """Search ``method``'s settings for the one closest to the baseline under a budget.

    Args:
        pipe (`InfinityPipeline` or `HARTPipeline`): the pipeline to calibrate (the embedded model, a converted folder,
            a Hub pipeline).
        method (`str`): a method name (``"lazyvar"``) or a composition (``"lazyvar+arvar"``).
        target_flops_ratio (`float`, *optional*): keep candidates whose counted FLOPs ratio (baseline / candidate, one
            real call at the pipeline's own size) is at least this.
        target_speedup (`float`, *optional*): keep candidates whose measured latency ratio (median of
            ``timing_repeats`` interleaved baseline / candidate calls of the first prompt and seed) is at least this.
            At least one budget is required; with both, both must hold.
        prompts (`list[str]`, *optional*): calibration prompts (default: :func:`calibration_prompts` ``(8)``, disjoint
            from the held-out evaluation prompts).
        seeds (`list[int]`): every prompt is generated once per seed, by the baseline and by every candidate.
        grid (`list[dict]`, *optional*): the candidates (default: :func:`candidate_grid`); each as
            :func:`candidate_grid` gives them.
        select (`str`): the fidelity the choice maximises: ``"ssim"`` (default), ``"psnr"``, ``"accuracy"`` (shapes
            prompts only) or ``"lpips"`` (minimised; needs its cached weights).
        sampling (`dict`, *optional*): call arguments (default: ``EMBEDDED_SAMPLING`` for the embedded model, else the
            pipeline's defaults). The record holds them with every argument of ``pipe.sampling_arguments`` resolved
            (the call's default where not given); a scheduler loaded from the record warns on a call that samples
            otherwise.
        timing_repeats (`int`): interleaved timed calls per candidate (and per baseline beside it).
        use_lpips (`bool`): compute LPIPS when its weights are cached.
        progress (`bool`): print the cost up front and one line per candidate on stderr.

    Returns:
        `dict`: the calibration record (see :func:`write_calibration`); ``"scheduler"`` holds the chosen scheduler
        (``None`` when no candidate meets the budget; ``"chosen"`` is then ``None`` too).

    Raises:
        ValueError: no budget, a budget below 1, an unknown method, empty prompts or seeds, an unknown ``select``, or a
            grid entry that is not a dict.
    """
    from diffusers_var_accel.embedded import EMBEDDED_SAMPLING

    target_flops_ratio = _check_budget("target_flops_ratio", target_flops_ratio)
    target_speedup = _check_budget("target_speedup", target_speedup)
    if target_flops_ratio is None and target_speedup is None:
        raise ValueError(
            "give a budget: target_flops_ratio (counted FLOPs, e.g. 2.0) and/or target_speedup (measured latency)"
        )
    names = method_members(method)
    if select not in SELECT_METRICS:
        raise ValueError(f"select must be one of {list(SELECT_METRICS)}, got {select!r}")
    prompts = list(calibration_prompts(8) if prompts is None else prompts)
    if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise ValueError(f"prompts must be a non-empty list of non-empty strings, got {prompts!r}")
    seeds = list(seeds)
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        raise ValueError(f"seeds must be a non-empty list of integers >= 0, got {seeds!r}")
    if isinstance(timing_repeats, bool) or not isinstance(timing_repeats, int) or timing_repeats < 1:
        raise ValueError(f"timing_repeats must be an integer >= 1, got {timing_repeats!r}")
    layers = num_layers_of(pipe)
    candidates = candidate_grid(method, layers) if grid is None else list(grid)
    if not candidates or not all(isinstance(c, dict) for c in candidates):
        raise ValueError(f"grid must be a non-empty list of settings dicts, got {grid!r}")
    shapes = all(_is_shapes_prompt(p) for p in prompts)
    if select == "accuracy" and not shapes:
        raise ValueError("select='accuracy' needs shapes prompts (the shapes scorer decides from the prompt text)")
    lpips_fn, lpips_note = _load_lpips_if_cached() if use_lpips else (None, "not asked for (use_lpips=False)")
    if select == "lpips" and lpips_fn is None:
        raise ValueError(f"select='lpips' but LPIPS is unavailable: {lpips_note}")
    if sampling is None:
        sampling = dict(EMBEDDED_SAMPLING) if getattr(pipe, "preset_model", None) == "embedded" else {}
    # the record holds the arguments the calls used, the pipeline's defaults included (never {}: a default that
    # changes later must not change what an old record means)
    sampling = {**{name: pipe.call_default(name) for name in getattr(pipe, "sampling_arguments", ())}, **sampling}
    family = pipe.model_family
    pipe.set_progress_bar_config(disable=True)

    def say(message: str) -> None:
        if progress:
            print(f"calibrate: {message}", file=sys.stderr, flush=True)

    per_candidate = len(prompts) * len(seeds)
    say(
        f"{method}: {len(candidates)} candidates x {len(prompts)} prompts x {len(seeds)} seeds = "
        f"{len(candidates) * per_candidate} generations, + {per_candidate} baseline, + {len(candidates) + 1} counted "
        f"calls and {2 * timing_repeats * len(candidates)} timed calls"
    )
    started = time.perf_counter()
    baseline_flops = _count_flops(pipe, prompts[0], seeds[0], None, sampling)
    baseline_images = {s: _generate(pipe, prompts, s, None, sampling) for s in seeds}
    # a time estimate from the baseline's own calls (accelerated calls are faster; a loaded machine is slower)
    per_call = (time.perf_counter() - started) / (per_candidate + 1)
    calls_per_candidate = per_candidate + 1 + 2 * timing_repeats
    say(
        f"baseline: {per_candidate + 1} calls in {time.perf_counter() - started:.1f} s ({per_call:.2f} s each); the "
        f"{len(candidates)} candidates take about {_duration(per_call * calls_per_candidate * len(candidates))} at "
        "that pace (accelerated calls are faster, a loaded machine slower)"
    )
    search_started = time.perf_counter()
    all_prompts = [p for _ in seeds for p in prompts]
    baseline_correct = None
    if shapes:
        base_fid = _fidelity(
            torch.cat([baseline_images[s] for s in seeds]),
            torch.cat([baseline_images[s] for s in seeds]),
            all_prompts,
            None,
            True,
        )
        baseline_correct = base_fid["correct"]

    tried: List[Dict[str, Any]] = []
    for index, settings in enumerate(candidates):
        record: Dict[str, Any] = dict(index=index, settings=settings)
        try:
            scheduler = build_candidate(method, settings, family)
            flops = _count_flops(pipe, prompts[0], seeds[0], scheduler, sampling)
            images = torch.cat([_generate(pipe, prompts, s, scheduler, sampling) for s in seeds])
        except (ValueError, RuntimeError) as err:  # a setting this model's schedule or depth cannot run
            record["error"] = " ".join(str(err).split())
            tried.append(record)
            say(f"[{index + 1}/{len(candidates)}] {_short(settings)}: not runnable here ({record['error'][:120]})")
            continue
        base_times, times = [], []
        for _ in range(timing_repeats):
            base_times.append(_time_call(pipe, prompts[0], seeds[0], None, sampling))
            times.append(_time_call(pipe, prompts[0], seeds[0], scheduler, sampling))
        reference = torch.cat([baseline_images[s] for s in seeds])
        fidelity = _fidelity(images, reference, all_prompts, lpips_fn, shapes)
        record.update(
            flops=flops,
            flops_ratio=baseline_flops / flops,
            speedup=statistics.median(base_times) / statistics.median(times),
            seconds_per_image=statistics.median(times),
            psnr_mean=_mean(fidelity["psnr"]),
            ssim_mean=_mean(fidelity["ssim"]),
        )
        if "lpips" in fidelity:
            record["lpips_mean"] = _mean(fidelity["lpips"])
        if shapes:
            record["accuracy"] = _mean([float(c) for c in fidelity["correct"]])
        record["per_image"] = fidelity
        record["meets_budget"] = meets_budget(record, target_flops_ratio, target_speedup)
        tried.append(record)
        elapsed = time.perf_counter() - search_started
        left = elapsed / (index + 1) * (len(candidates) - index - 1)
        say(
            f"[{index + 1}/{len(candidates)}] {_short(settings)}: FLOPs {record['flops_ratio']:.2f}x, speed-up "
            f"{record['speedup']:.2f}x, SSIM {record['ssim_mean']:.3f}, PSNR {record['psnr_mean']:.2f} dB"
            + (f", accuracy {record['accuracy']:.0%}" if shapes else "")
            + (" (meets the budget)" if record["meets_budget"] else "")
            + f"; {_duration(elapsed)} so far, about {_duration(left)} left"
        )

    chosen = choose(tried, target_flops_ratio, target_speedup, select)
    result: Dict[str, Any] = dict(
        method=method,
        members=names,
        model=model_name(pipe),
        model_family=family,
        preset_model=getattr(pipe, "preset_model", None),
        num_layers=layers,
        budget=dict(target_flops_ratio=target_flops_ratio, target_speedup=target_speedup),
        select=select,
        # The scorer decides only an accuracy selection; records chosen by SSIM stay as they were. Accuracy records
        # without this field were made with the lenient scorer (before 2026-12-06; score(..., strict=False)).
        **(dict(scorer="strict") if select == "accuracy" else {}),
        prompts=prompts,
        seeds=seeds,
        sampling=sampling,
        baseline=dict(
            flops=baseline_flops,
            accuracy=None if baseline_correct is None else _mean([float(c) for c in baseline_correct]),
        ),
        lpips=None if lpips_fn is None else "alexnet v0.1",
        lpips_note=lpips_note,
        chosen=None if chosen is None else {k: v for k, v in chosen.items() if k != "per_image"},
        tried=tried,
        seconds=time.perf_counter() - started,
        # what reproducing the record needs besides the model: the code's version, the exact grid, the image size and
        # a digest of the prompts (their text is above; the digest tells a changed list at a glance)
        package_version=_package_version(),
        grid=candidates,
        timing_repeats=timing_repeats,
        image_size=list(baseline_images[seeds[0]].shape[-2:]),
        prompts_sha256=hashlib.sha256("\n".join(prompts).encode("utf-8")).hexdigest(),
        notes=(
            f"FLOPs: one real call (first prompt and seed) counted with var-accel bench's counter, text encoder and "
            f"decoder included; speed-up: median of {timing_repeats} interleaved baseline/candidate calls of the first "
            f"prompt on this device; PSNR of identical images counted as {PSNR_CAP_DB:g} dB; selection: highest mean "
            f"{select} among the candidates that meet the budget, "
            + (
                "the higher SSIM, then the earlier candidate on ties"
                if select == "accuracy"
                else "the earlier candidate on ties"
            )
        ),
    )
    result["scheduler"] = None if chosen is None else build_candidate(method, chosen["settings"], family)
    if chosen is None:
        best = max((r["flops_ratio"] for r in tried if "flops_ratio" in r), default=None)
        say(f"no candidate meets the budget (highest counted FLOPs ratio of the grid: {best})")
    else:
        say(
            f"chosen: {_short(chosen['settings'])} (FLOPs {chosen['flops_ratio']:.2f}x, SSIM {chosen['ssim_mean']:.3f}, "
            f"PSNR {chosen['psnr_mean']:.2f} dB) in {result['seconds']:.0f} s"
        )
    return result


def meets_budget(
    record: Dict[str, Any], target_flops_ratio: Optional[float] = None, target_speedup: Optional[float] = None
) -> bool:
    """Whether a tried setting (an entry of ``calibration.json``'s ``tried``) meets the budget."""
    if "flops_ratio" not in record:
        return False
    return bool(
        (target_flops_ratio is None or record["flops_ratio"] >= target_flops_ratio)
        and (target_speedup is None or record["speedup"] >= target_speedup)
    )


@decides("a calibration choice")
def choose(
    tried: Sequence[Dict[str, Any]],
    target_flops_ratio: Optional[float] = None,
    target_speedup: Optional[float] = None,
    select: str = "ssim",
) -> Optional[Dict[str, Any]]:
    """The tried setting :func:`calibrate` picks for a budget: the highest mean ``select`` among those meeting it, the
    earlier one on ties (for ``"accuracy"``, a count over few prompts that many settings tie on, the higher SSIM
    first); ``None`` when none meets it. Applied to a ``calibration.json``'s ``tried`` list it gives the
    choice of the same search under another budget (FLOPs and fidelity do not depend on the budget)."""
    if select not in SELECT_METRICS:
        raise ValueError(f"select must be one of {list(SELECT_METRICS)}, got {select!r}")
    key = {
        "ssim": lambda r: r["ssim_mean"],
        "psnr": lambda r: r["psnr_mean"],
        "accuracy": lambda r: (r["accuracy"], r["ssim_mean"]),
        "lpips": lambda r: -r["lpips_mean"],
    }[select]
    chosen = None
    for record in tried:
        if meets_budget(record, target_flops_ratio, target_speedup) and (chosen is None or key(record) > key(chosen)):
            chosen = record
    return chosen


def _short(settings: Dict[str, Any]) -> str:
    return json.dumps(settings, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------------------------------------------------
def calibration_record(result: Dict[str, Any]) -> Dict[str, Any]:
    """The JSON-safe part of a :func:`calibrate` result (everything but the scheduler object)."""
    from diffusers_var_accel.lab.bench.runner import json_safe

    return json_safe({k: v for k, v in result.items() if k != "scheduler"})


def write_calibration(result: Dict[str, Any], output_dir: Union[str, Path]) -> Dict[str, Path]:
    """Write ``calibration.json``, ``frontier.png`` and (when a setting was chosen) ``acceleration_config.json``.

    The three are written together into a temporary folder beside ``output_dir`` and swapped in as a whole
    (:func:`~diffusers_var_accel.files.replace_folder`): a killed run leaves the earlier calibration or this one, never
    files of both (an earlier calibration's files that this one does not write, e.g. its config when nothing was
    chosen now, go with it; other files of the folder stay).

    Returns:
        `dict`: the written paths by name (``"config"`` only when a setting was chosen).
    """
    from diffusers_var_accel.files import replace_folder

    out = Path(output_dir)
    names = {"frontier": FRONTIER_FILE, "calibration": CALIBRATION_FILE}
    if result.get("scheduler") is not None:
        names["config"] = VARAccelScheduler.config_name

    def write(tmp: Path) -> None:
        tmp.mkdir()
        plot_frontier(result, tmp / FRONTIER_FILE)
        (tmp / CALIBRATION_FILE).write_text(
            json.dumps(calibration_record(result), indent=2, allow_nan=False) + "\n", encoding="utf-8"
        )
        if "config" in names:
            (tmp / names["config"]).write_text(result["scheduler"].to_json_string(), encoding="utf-8")

    replace_folder(out, write, owned=lambda folder: [FRONTIER_FILE, CALIBRATION_FILE, VARAccelScheduler.config_name])
    return {key: out / name for key, name in names.items()}


def plot_frontier(result: Dict[str, Any], path: Union[str, Path]) -> Path:
    """Fidelity (SSIM, PSNR) against counted-FLOPs ratio of every setting tried; the budget and the chosen setting
    marked, the measured speed-up in the point's colour."""
    from diffusers_var_accel.lab.bench.report import require_matplotlib

    matplotlib = require_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [r for r in result["tried"] if "flops_ratio" in r]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, label in (
        (axes[0], "ssim_mean", "SSIM to the baseline"),
        (axes[1], "psnr_mean", "PSNR to the baseline (dB)"),
    ):
        if ran:
            points = ax.scatter(
                [r["flops_ratio"] for r in ran],
                [r[metric] for r in ran],
                c=[r["speedup"] for r in ran],
                cmap="viridis",
                s=18,
            )
            fig.colorbar(points, ax=ax, label="measured speed-up")
        chosen = result.get("chosen")
        if chosen:
            ax.scatter([chosen["flops_ratio"]], [chosen[metric]], marker="*", s=180, c="red", label="chosen")
            ax.legend(loc="lower left")
        if result["budget"].get("target_flops_ratio"):
            ax.axvline(result["budget"]["target_flops_ratio"], color="grey", linestyle="--")
        ax.set_xlabel("counted FLOPs ratio (baseline / setting)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"{result['method']}: {len(ran)} settings, {len(result['prompts'])} prompts x {len(result['seeds'])} seeds"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
