"""Model cards for pipeline folders: YAML metadata, the family's acceleration presets, the measured numbers of a
benchmark ``results.json`` and a usage snippet (the lab's side of publishing; the ``pipeline.py`` shim and presets are
the library's :mod:`diffusers_var_accel.hub`).

* :func:`make_model_card` / :func:`write_model_card` write the folder's ``README.md``: YAML metadata (library, tags
  with the acceleration methods, ``pipeline_tag: text-to-image``, license), the acceleration presets of the model's
  family, the measured numbers of a benchmark ``results.json`` (:func:`read_benchmark_results`) and a usage snippet.

Examples:
    ```py
    >>> from diffusers_var_accel.lab.cards import write_model_card
    >>> from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

    >>> build_tiny_infinity_pipeline().save_pretrained("tiny-infinity")
    >>> readme = write_model_card("tiny-infinity", repo_id="my-org/tiny-infinity")   # also writes the shim
    ```
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from huggingface_hub import ModelCard, ModelCardData

from diffusers_var_accel.embedded import EMBEDDED_MODEL_PATH, EMBEDDED_PRESET_MODEL
from diffusers_var_accel.hub import (
    HUB_SHIM_FILE,
    has_hub_shim,
    pipeline_class,
    read_index,
    remove_hub_shim,
    save_presets,
    write_hub_shim,
)
from diffusers_var_accel.lab.families import lab_family
from diffusers_var_accel.schedulers.presets import (
    FAMILY_PRESET_MODELS,
    is_preset_name,
    load_preset_config,
)
from diffusers_var_accel.version import __version__

PathLike = Union[str, os.PathLike]

#: The metrics a benchmark record may carry, in the order of the model card's table.
RESULT_FIELDS = ("speedup", "tflops", "psnr", "ssim", "accuracy")


def _method_titles() -> str:
    from diffusers_var_accel.schedulers.registry import method_titles

    return ", ".join(method_titles())


# ---------------------------------------------------------------------------------------------------------------------
# benchmark results
# ---------------------------------------------------------------------------------------------------------------------
def read_benchmark_results(results: Union[PathLike, Dict[str, Any], List[Any]]) -> Dict[str, Any]:
    """The per-method numbers of a benchmark ``results.json`` (a path or the parsed JSON), normalised.

    Accepted layouts: a list of records; or an object whose ``"methods"`` / ``"results"`` / ``"records"`` / ``"rows"``
    entry is such a list or a ``{method: record}`` object (``var-accel bench`` writes ``"methods"``); or a ``{method:
    record}`` object. A record names its method by ``method`` (else ``spec``, ``name``, or its key) and may carry, each
    optional (other fields are ignored):

    * ``speedup`` (or ``speed_up``): time ratio baseline / method;
    * ``tflops`` (TFLOPs), else ``gflops`` (GFLOPs), else ``flops``: a number of FLOPs, or an object with
      ``total_tflops`` / ``total_gflops``;
    * ``psnr`` / ``ssim``: numbers, else ``psnr_mean`` / ``ssim_mean``, at the top or inside ``fidelity``; ``"inf"``
      means identical images;
    * ``accuracy``: a fraction (a value above 1 is read as a percentage), at the top or inside ``scorer``.

    An optional ``"run"`` object (``model``, ``device_name``, ``dtype``, ``height``, ``width``, ``num_items``) is kept
    as context.

    Returns:
        `dict`: ``{"records": [{"method": str, "speedup": float | None, "tflops": ..., "psnr": ..., "ssim": ...,
        "accuracy": ...}], "run": {...}}``.

    Raises:
        ValueError: no records, a record without a method name, or a metric that is not a number.
    """
    data = results
    if isinstance(results, (str, os.PathLike)):
        data = json.loads(Path(results).read_text(encoding="utf-8"))
    run = data.get("run") if isinstance(data, dict) and isinstance(data.get("run"), dict) else {}
    raw = _raw_records(data)
    if not raw:
        raise ValueError(
            "the benchmark results hold no per-method records (expected a list of {'method': ..., "
            "'speedup': ..., ...} or an object with a 'methods' / 'results' list)"
        )
    records = []
    for i, (key, rec) in enumerate(raw):
        if not isinstance(rec, dict):
            raise ValueError(f"benchmark record {i} is not an object: {rec!r}")
        method = rec.get("method") or rec.get("spec") or rec.get("name") or key
        if not isinstance(method, str) or not method:
            raise ValueError(f"benchmark record {i} names no method (a 'method' field): {sorted(rec)}")
        fidelity = rec.get("fidelity") if isinstance(rec.get("fidelity"), dict) else {}
        scorer = rec.get("scorer") if isinstance(rec.get("scorer"), dict) else {}
        accuracy = _number(_first(rec.get("accuracy"), scorer.get("accuracy")), method, "accuracy")
        records.append(
            {
                "method": method,
                "speedup": _number(_first(rec.get("speedup"), rec.get("speed_up")), method, "speedup"),
                "tflops": _tflops(rec, method),
                "psnr": _number(
                    _first(rec.get("psnr"), rec.get("psnr_mean"), fidelity.get("psnr_mean"), fidelity.get("psnr")),
                    method,
                    "psnr",
                ),
                "ssim": _number(
                    _first(rec.get("ssim"), rec.get("ssim_mean"), fidelity.get("ssim_mean"), fidelity.get("ssim")),
                    method,
                    "ssim",
                ),
                "accuracy": accuracy / 100 if accuracy is not None and accuracy > 1 else accuracy,
            }
        )
    context = {
        k: run[k]
        for k in ("model", "device_name", "device", "dtype", "height", "width", "num_items")
        if run.get(k) is not None
    }
    return {"records": records, "run": context}


def _raw_records(data: Any) -> List[tuple]:
    if isinstance(data, list):
        return [(None, r) for r in data]
    if not isinstance(data, dict):
        return []
    for key in ("methods", "results", "records", "rows"):
        value = data.get(key)
        if isinstance(value, list):
            return [(None, r) for r in value]
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            return list(value.items())
    if data and all(isinstance(v, dict) for v in data.values()):
        return list(data.items())
    return []


def _first(*values):
    return next((v for v in values if v is not None), None)


def _number(value: Any, method: str, field: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"benchmark record {method!r}: {field} must be a number, got {value!r}")
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"benchmark record {method!r}: {field} must be a number, got {value!r}") from None


def _tflops(rec: Dict[str, Any], method: str) -> Optional[float]:
    if rec.get("tflops") is not None:
        return _number(rec["tflops"], method, "tflops")
    if rec.get("gflops") is not None:
        return _number(rec["gflops"], method, "gflops") / 1e3
    flops = rec.get("flops")
    if isinstance(flops, dict):
        if flops.get("total_tflops") is not None:
            return _number(flops["total_tflops"], method, "flops.total_tflops")
        if flops.get("total_gflops") is not None:
            return _number(flops["total_gflops"], method, "flops.total_gflops") / 1e3
        return None
    return None if flops is None else _number(flops, method, "flops") / 1e12


def _yaml_value(value: Optional[float]) -> Any:
    return "inf" if isinstance(value, float) and math.isinf(value) else value


# ---------------------------------------------------------------------------------------------------------------------
# model cards
# ---------------------------------------------------------------------------------------------------------------------
def make_model_card(
    folder: PathLike,
    results: Union[None, PathLike, Dict[str, Any], List[Any]] = None,
    repo_id: Optional[str] = None,
    license: Optional[str] = None,
    base_model: Optional[str] = None,
    model_name: Optional[str] = None,
    tags: Sequence[str] = (),
    library_name: str = "diffusers",
    calibrations: Sequence[PathLike] = (),
    example_prompt: Optional[str] = None,
) -> ModelCard:
    """The model card of a saved pipeline folder (nothing is written; see :func:`write_model_card`).

    Args:
        folder (`str` or `os.PathLike`): a folder with ``model_index.json`` (Infinity or HART).
        results (`str`, `dict` or `list`, *optional*): a benchmark ``results.json`` (see :func:`read_benchmark_results`
            for the fields read); its numbers are tabled and stored in the metadata as ``acceleration_results``.
        repo_id (`str`, *optional*): the Hub repo id used in the snippets; defaults to the folder's name.
        license (`str`, *optional*): a Hub license id (``mit``, ``apache-2.0``, ``other``...); omitted when `None`.
        base_model (`str`, *optional*): the Hub id of the original model, stored as ``base_model``.
        model_name (`str`, *optional*): the card's title; defaults to the folder's name.
        tags (`list[str]`, *optional*): extra tags.
        library_name (`str`, *optional*, defaults to `"diffusers"`): the metadata's ``library_name``.
        calibrations (`list`, *optional*): ``var-accel calibrate`` outputs (folders, or their ``calibration.json``
            files; see :func:`read_calibration`): the chosen setting of each, its budget and its numbers are tabled and
            stored in the metadata as ``acceleration_calibrations``.
        example_prompt (`str`, *optional*): the prompt of the usage snippets; by default a shapes prompt for a copy of
            the embedded shapes model (its transformer's configuration), else ``"a red fox in the snow"``.

    Returns:
        `huggingface_hub.ModelCard`: YAML metadata (``library_name``, ``pipeline_tag: text-to-image``, ``tags`` with
        the acceleration methods, ``license``, ``base_model``, ``acceleration_presets``, ``acceleration_results``) and
        the text: usage, presets, measured numbers, components.
    """
    folder = Path(folder)
    cls = pipeline_class(folder)
    family = cls.model_family
    repo_id = repo_id or folder.resolve().name
    title = model_name or folder.resolve().name
    preset_model = FAMILY_PRESET_MODELS[family]
    # every registered method with a preset for the family (sorted by name); a packaged preset's stored file, else the
    # configuration its class builds
    from ..schedulers.registry import METHODS

    presets = {method: f"{preset_model}/{method}" for method in sorted(METHODS) if family in METHODS[method].presets}
    configs = {
        method: load_preset_config(name) if is_preset_name(name) else METHODS[method].from_preset(family).to_dict()
        for method, name in presets.items()
    }
    in_folder = sorted(m for m in presets if (folder / m / "acceleration_config.json").is_file())
    bench = read_benchmark_results(results) if results is not None else None
    calibrated = [read_calibration(c) for c in calibrations]

    card_tags = [
        "text-to-image",
        "visual-autoregressive",
        "next-scale-prediction",
        "training-free-acceleration",
        "diffusers-var-accel",
        family,
        *presets,
    ]
    card_tags += [t for t in tags if t not in card_tags]
    metadata: Dict[str, Any] = {
        "acceleration_presets": {
            method: {
                "preset": name,
                "scheduler": configs[method]["_class_name"],
                "settings": {k: v for k, v in configs[method].items() if not k.startswith("_")},
            }
            for method, name in presets.items()
        }
    }
    if calibrated:
        metadata["acceleration_calibrations"] = [
            {k: _yaml_value(v) if isinstance(v, float) else v for k, v in c.items() if v is not None and k != "file"}
            for c in calibrated
        ]
    if bench is not None:
        metadata["acceleration_results"] = [
            {k: _yaml_value(v) for k, v in r.items() if v is not None} for r in bench["records"]
        ]
    data = ModelCardData(
        library_name=library_name,
        pipeline_tag="text-to-image",
        license=license,
        base_model=base_model,
        tags=card_tags,
        **metadata,
    )

    name, about = (lab_family(family).title, lab_family(family).description)
    shim = has_hub_shim(folder)
    lines = [
        f"# {title}",
        "",
        f"{name}, {about}, in the format of `diffusers_var_accel` ({__version__}), loaded by its `{cls.__name__}`: "
        f"🤗 Diffusers-style pipelines with training-free acceleration schedulers ({_method_titles()}).",
        "",
    ]
    if example_prompt is None:
        example_prompt = "two red circles" if _is_embedded_copy(folder) else "a red fox in the snow"
    lines += _usage_section(cls.__name__, repo_id, shim, presets, in_folder, example_prompt)
    lines += _presets_section(name, preset_model, presets, configs, in_folder)
    if calibrated:
        lines += _calibrations_section(calibrated, repo_id)
    if bench is not None:
        lines += _results_section(bench, preset_model)
    lines += _components_section(folder)
    content = f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines).rstrip() + "\n"
    return ModelCard(content)


def write_model_card(
    folder: PathLike,
    results=None,
    shim: bool = True,
    copy_presets: bool = False,
    calibrations: Sequence[PathLike] = (),
    **card_kwargs,
) -> Path:
    """Write ``README.md`` (the model card) into a saved pipeline folder, with the Hub shim and optionally the presets.

    Args:
        folder (`str` or `os.PathLike`): a folder with ``model_index.json``.
        results (*optional*): a benchmark ``results.json`` (see :func:`read_benchmark_results`).
        shim (`bool`, *optional*, defaults to `True`): also write the ``pipeline.py`` shim (:func:`write_hub_shim`),
            so ``DiffusionPipeline.from_pretrained(repo, trust_remote_code=True)`` works; `False` removes it.
        copy_presets (`bool`, *optional*, defaults to `False`): also write the family's packaged presets as
            ``<folder>/<method>/acceleration_config.json`` (loadable with ``from_pretrained(repo, subfolder=method)``).
        calibrations (`list`, *optional*): ``var-accel calibrate`` output folders; each chosen setting is copied to
            ``<folder>/<method>/`` (``acceleration_config.json`` and ``calibration.json``, loadable with
            ``from_pretrained(repo, subfolder=method)``, replacing a copied preset of that method) and tabled in the card.
        **card_kwargs (`Any`): arguments of :func:`make_model_card` (``repo_id``, ``license``, ``base_model``, ...).

    Returns:
        `Path`: the written ``README.md``.
    """
    folder = Path(folder)
    checked = [read_calibration(c) for c in calibrations]  # every file is checked before anything is written
    if shim:
        write_hub_shim(folder)
    elif (folder / HUB_SHIM_FILE).is_file():
        remove_hub_shim(folder)
    if copy_presets:
        save_presets(folder, FAMILY_PRESET_MODELS[pipeline_class(folder).model_family])
    copied = []
    for calibration in checked:
        source = Path(calibration["file"]).parent
        target = folder / calibration["subfolder"]
        if source.resolve() != target.resolve():
            target.mkdir(parents=True, exist_ok=True)
            for name in ("acceleration_config.json", "calibration.json"):
                (target / name).write_bytes((source / name).read_bytes())
        copied.append(target / "calibration.json")
    card = make_model_card(folder, results, calibrations=copied, **card_kwargs)
    path = folder / "README.md"
    card.save(path)
    return path


def _is_embedded_copy(folder: Path) -> bool:
    """Whether ``folder``'s transformer has the packaged embedded (shapes) model's configuration."""

    def config(path: Path) -> Optional[Dict[str, Any]]:
        try:
            data = json.loads((path / "transformer" / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return {k: v for k, v in data.items() if not k.startswith("_")} if isinstance(data, dict) else None

    own = config(folder)
    return own is not None and own == config(EMBEDDED_MODEL_PATH)


def _usage_section(
    class_name: str,
    repo_id: str,
    shim: bool,
    presets: Dict[str, str],
    in_folder: Iterable[str],
    prompt: str = "a red fox in the snow",
) -> List[str]:
    method = "lazyvar" if "lazyvar" in presets else next(iter(presets), None)
    others = " / ".join(f"enable_{m}()" for m in presets if m != method)
    lines = [
        "## Usage",
        "",
        f"Needs the `diffusers_var_accel` package (version {__version__} or later) installed.",
        "",
        "```python",
        "import torch",
        f"from diffusers_var_accel import {class_name}",
        "",
        f'pipe = {class_name}.from_pretrained("{repo_id}")',
    ]
    if method is not None:
        lines += [f"pipe.enable_{method}()" + (f"   # or {others}" if others else "")]
    lines += [
        f"image = pipe({json.dumps(prompt)}, generator=torch.Generator().manual_seed(0)).images[0]",
        "pipe.disable_acceleration()   # the baseline again, bit for bit",
        "```",
        "",
    ]
    if shim:
        lines += [
            "With diffusers' generic loader (the repo's `pipeline.py` is one line, "
            f"`from diffusers_var_accel import {class_name}`; it is why diffusers asks for `trust_remote_code=True`; "
            f"`{class_name}.from_pretrained` above checks that file and needs no flag):",
            "",
            "```python",
            "from diffusers import DiffusionPipeline",
            "",
            f'pipe = DiffusionPipeline.from_pretrained("{repo_id}", trust_remote_code=True)   # returns a {class_name}',
            "```",
            "",
        ]
    if method is not None:
        scheduler = load_preset_config(presets[method])["_class_name"]
        source = f'"{repo_id}", subfolder="{method}"' if method in in_folder else f'"{presets[method]}"'
        lines += [
            "A preset as a scheduler object, with overrides, for one call:",
            "",
            "```python",
            f"from diffusers_var_accel import {scheduler}",
            "",
            f"{method} = {scheduler}.from_pretrained({source})   # keyword arguments override its settings",
            f"image = pipe({json.dumps(prompt)}, acceleration={method}).images[0]",
            "```",
            "",
        ]
    return lines


def _presets_section(
    name: str, preset_model: str, presets: Dict[str, str], configs: Dict[str, Dict[str, Any]], in_folder: Sequence[str]
) -> List[str]:
    lines = [
        "## Acceleration presets",
        "",
        f"Packaged with `diffusers_var_accel` and tuned for `{preset_model}`; their scale indices count from the end "
        f"of the schedule, so they also run on other {name} models and resolutions. `pipe.enable_<method>()` "
        "attaches them.",
    ]
    if in_folder:
        lines += [f"This repo also holds them as `<method>/acceleration_config.json` ({', '.join(in_folder)})."]
    lines += ["", "| method | preset | scheduler | settings |", "| --- | --- | --- | --- |"]
    for method, preset in presets.items():
        settings = ", ".join(
            f"{k}={json.dumps(v)}" for k, v in configs[method].items() if not k.startswith("_") and k != "model_family"
        )
        lines.append(f"| {method} | `{preset}` | `{configs[method]['_class_name']}` | {settings} |")
    return lines + [""]


def _results_section(bench: Dict[str, Any], family_preset_model: Optional[str] = None) -> List[str]:
    flops = [r["tflops"] for r in bench["records"] if r["tflops"] is not None]
    # a small model's FLOPs in GFLOPs (the embedded model's 0.007 TFLOPs would print as 0.00)
    giga = bool(flops) and max(flops) < 1.0
    formats = {
        "speedup": lambda v: f"{v:.2f}×",
        "tflops": (lambda v: f"{1e3 * v:.2f}") if giga else (lambda v: f"{v:.2f}"),
        "psnr": lambda v: "∞ (identical)" if math.isinf(v) else f"{v:.2f}",
        "ssim": lambda v: f"{v:.4f}",
        "accuracy": lambda v: f"{100 * v:.1f} %",
    }
    heads = {
        "speedup": "speed-up",
        "tflops": "GFLOPs" if giga else "TFLOPs",
        "psnr": "PSNR (dB)",
        "ssim": "SSIM",
        "accuracy": "accuracy",
    }
    fields = [f for f in RESULT_FIELDS if any(r[f] is not None for r in bench["records"])]
    lines = ["## Measured", ""]
    run = bench["run"]
    if run:
        lines += ["Benchmark run: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in run.items()) + ".", ""]
    if run.get("model") == EMBEDDED_PRESET_MODEL and family_preset_model != EMBEDDED_PRESET_MODEL:
        lines += [
            f"Measured on the packaged embedded model, whose methods run its own calibrated presets "
            f"(`{EMBEDDED_PRESET_MODEL}/<method>`), not the `{family_preset_model}/<method>` presets above "
            f'(load those with e.g. `LazyVARScheduler.from_pretrained("{EMBEDDED_PRESET_MODEL}/lazyvar")`).',
            "",
        ]
    lines += ["| method | " + " | ".join(heads[f] for f in fields) + " |", "| --- |" + " --- |" * len(fields)]
    for r in bench["records"]:
        lines.append(
            f"| {r['method']} | " + " | ".join("–" if r[f] is None else formats[f](r[f]) for f in fields) + " |"
        )
    return lines + [
        "",
        "PSNR / SSIM compare with the baseline image of the same prompt and seed; speed-up is the baseline's "
        "time over the method's on the same machine.",
        "",
    ]


def read_calibration(path: PathLike) -> Dict[str, Any]:
    """The chosen setting of a ``var-accel calibrate`` output (its folder, or its ``calibration.json``), for cards.

    Returns:
        `dict`: ``method``, ``subfolder`` (the method name, ``+`` kept), ``scheduler``, ``settings``, the budget
        (``target_flops_ratio``, ``target_speedup``), the chosen setting's ``flops_ratio``, ``speedup``, ``ssim``,
        ``psnr``, ``accuracy``, the number of ``prompts`` and ``seeds``, and ``file`` (the calibration.json read).

    Raises:
        ValueError: the file is missing, not JSON, or holds no chosen setting; or the folder's
            ``acceleration_config.json`` is missing. The message names the file.
    """
    path = Path(path)
    file = path / "calibration.json" if path.is_dir() else path
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{file}: not a readable calibration.json of var-accel calibrate ({err})") from None
    chosen = record.get("chosen") if isinstance(record, dict) else None
    if not isinstance(chosen, dict) or not isinstance(record.get("method"), str):
        raise ValueError(
            f"{file}: holds no chosen setting (a 'method' and a 'chosen' object); var-accel calibrate "
            "writes one when a setting meets the budget"
        )
    config_file = file.parent / "acceleration_config.json"
    try:
        scheduler = json.loads(config_file.read_text(encoding="utf-8"))["_class_name"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f"{config_file}: the chosen scheduler's configuration beside {file.name} is missing or unreadable ({err})"
        ) from None
    budget = record.get("budget") or {}
    return {
        "method": record["method"],
        "subfolder": record["method"],
        "scheduler": scheduler,
        "settings": chosen.get("settings"),
        "target_flops_ratio": budget.get("target_flops_ratio"),
        "target_speedup": budget.get("target_speedup"),
        **{
            key: _number(chosen.get(field), record["method"], key)
            for key, field in (
                ("flops_ratio", "flops_ratio"),
                ("speedup", "speedup"),
                ("ssim", "ssim_mean"),
                ("psnr", "psnr_mean"),
                ("accuracy", "accuracy"),
            )
        },
        "prompts": len(record.get("prompts") or []),
        "seeds": len(record.get("seeds") or []),
        "file": str(file),
    }


def _calibrations_section(calibrated: List[Dict[str, Any]], repo_id: str) -> List[str]:
    lines = [
        "## Calibrated settings",
        "",
        "Found with `var-accel calibrate` for this model: the setting closest to the baseline image (SSIM, PSNR"
        " to the baseline image of the same prompt and seed) whose counted FLOPs ratio and/or measured speed-up"
        " meets the budget. Load one with `from_pretrained(repo, subfolder=...)`.",
        "",
        "| method | budget | counted FLOPs ratio | speed-up | SSIM | PSNR (dB) | accuracy | prompts x seeds | load |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for c in calibrated:
        budget = ", ".join(
            t
            for t in (
                f"FLOPs >= {c['target_flops_ratio']:g}x" if c["target_flops_ratio"] else "",
                f"speed-up >= {c['target_speedup']:g}x" if c["target_speedup"] else "",
            )
            if t
        )
        cells = [
            f"{c['flops_ratio']:.2f}×" if c["flops_ratio"] else "–",
            f"{c['speedup']:.2f}×" if c["speedup"] else "–",
            f"{c['ssim']:.3f}" if c["ssim"] is not None else "–",
            f"{c['psnr']:.2f}" if c["psnr"] is not None else "–",
            f"{100 * c['accuracy']:.0f} %" if c["accuracy"] is not None else "–",
        ]
        load = f'`{c["scheduler"]}.from_pretrained("{repo_id}", subfolder="{c["subfolder"]}")`'
        lines.append(
            f"| {c['method']} | {budget} | " + " | ".join(cells) + f" | {c['prompts']} x {c['seeds']} | {load} |"
        )
    return lines + [""]


def _components_section(folder: Path) -> List[str]:
    index = read_index(folder)
    rows = [
        (k, v)
        for k, v in sorted(index.items())
        if not k.startswith("_") and isinstance(v, list) and len(v) == 2 and v[0]
    ]
    lines = ["## Components", "", "| component | library | class |", "| --- | --- | --- |"]
    lines += [f"| `{k}` | `{lib}` | `{name}` |" for k, (lib, name) in rows]
    return lines + [""]
