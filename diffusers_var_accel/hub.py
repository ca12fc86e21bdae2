"""Publishing converted pipelines on the Hugging Face Hub: the ``pipeline.py`` shim, model cards, a local Hub cache.

* :func:`write_hub_shim` makes a saved pipeline folder load through diffusers' generic entry point:
  ``DiffusionPipeline.from_pretrained(repo_id, trust_remote_code=True)`` returns our :class:`InfinityPipeline` /
  :class:`HARTPipeline`. It writes the one-line ``pipeline.py`` (``from diffusers_var_accel import InfinityPipeline``)
  and sets ``"_class_name": ["pipeline", "InfinityPipeline"]`` in ``model_index.json``; diffusers then imports
  ``pipeline.py`` (so the installed package, whose modules ``model_index.json`` names) and takes the class from it.
  diffusers runs ``pipeline.py`` only with ``trust_remote_code=True``. ``InfinityPipeline.from_pretrained`` loads a
  shimmed folder without it once it has checked that ``pipeline.py`` is exactly our one-line shim of that class.
  A plain saved folder (no shim) loads through ``DiffusionPipeline`` / ``AutoPipelineForText2Image`` once
  ``diffusers_var_accel`` is imported (``pipelines/diffusers_registration.py``).
* :func:`make_model_card` / :func:`write_model_card` write the folder's ``README.md``: YAML metadata (library, tags
  with the acceleration methods, ``pipeline_tag: text-to-image``, license), the acceleration presets of the model's
  family, the measured numbers of a benchmark ``results.json`` (:func:`read_benchmark_results`) and a usage snippet.
* :func:`write_to_hub_cache` lays a folder out as a cached Hub repo, so repo-id code paths run offline.

Examples:
    ```py
    >>> from diffusers_var_accel.hub import write_model_card
    >>> from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

    >>> build_tiny_infinity_pipeline().save_pretrained("tiny-infinity")
    >>> readme = write_model_card("tiny-infinity", repo_id="my-org/tiny-infinity")   # also writes the shim
    ```
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from huggingface_hub import ModelCard, ModelCardData

from .version import __version__
from .embedded import EMBEDDED_MODEL_PATH, EMBEDDED_PRESET_MODEL
from .families import MODEL_FAMILIES
from .schedulers.presets import (
    FAMILY_PRESET_MODELS,
    available_presets,
    is_preset_name,
    load_preset_config,
    preset_folder,
    preset_models,
)
from .schedulers.scheduling_var_base import VARAccelScheduler

PathLike = Union[str, os.PathLike]

#: The shim's file name: diffusers loads ``<_class_name[0]>.py`` from the repo root.
HUB_SHIM_FILE = "pipeline.py"

#: Module name of the shim in ``model_index.json`` (``"_class_name": ["pipeline", "<class>"]``).
HUB_SHIM_MODULE = HUB_SHIM_FILE[: -len(".py")]

_SHIM_LINE = (
    "from diffusers_var_accel import {name}  # noqa: F401 - the installed package's class; nothing else runs\n"
)

#: The metrics a benchmark record may carry, in the order of the model card's table.
RESULT_FIELDS = ("speedup", "tflops", "psnr", "ssim", "accuracy")


# ---------------------------------------------------------------------------------------------------------------------
# model_index.json and the shim
# ---------------------------------------------------------------------------------------------------------------------
def _method_titles() -> str:
    from .schedulers.registry import method_titles

    return ", ".join(method_titles())


def _read_index(folder: PathLike) -> Dict[str, Any]:
    path = Path(folder) / "model_index.json"
    if not path.is_file():
        raise ValueError(
            f"{folder} has no model_index.json: save a pipeline there first (pipe.save_pretrained) or "
            "convert official checkpoints (scripts/convert_*_original.py)"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def _write_index(folder: PathLike, index: Dict[str, Any]) -> None:
    (Path(folder) / "model_index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def pipeline_class(folder: PathLike):
    """The pipeline class of a saved folder (a registered family's: ``InfinityPipeline``, ``HARTPipeline``), with or
    without the shim.

    Raises:
        ValueError: no ``model_index.json``, or it names a class this package does not provide.
    """
    stored = _read_index(folder).get("_class_name")
    name = stored[1] if isinstance(stored, (list, tuple)) and len(stored) == 2 else stored
    classes = {cls.__name__: cls for cls in (family.pipeline_class() for family in MODEL_FAMILIES.values())}
    if name not in classes:
        raise ValueError(
            f"{folder}/model_index.json names the pipeline {stored!r}; diffusers_var_accel provides {sorted(classes)}"
        )
    return classes[name]


def hub_shim_source(class_name: str) -> str:
    """The text of the one-line ``pipeline.py`` for ``class_name``."""
    return _SHIM_LINE.format(name=class_name)


def has_hub_shim(folder: PathLike) -> bool:
    """Whether ``folder`` holds exactly our shim: ``model_index.json`` names ``["pipeline", <class>]`` and
    ``pipeline.py`` is the one-line import of that class (nothing else)."""
    shim = Path(folder) / HUB_SHIM_FILE
    stored = _read_index(folder).get("_class_name")
    if not (shim.is_file() and isinstance(stored, list) and len(stored) == 2 and stored[0] == HUB_SHIM_MODULE):
        return False
    return shim.read_text(encoding="utf-8") == hub_shim_source(stored[1])


def holds_own_shim(path_or_repo: PathLike, class_name: str, **hub_kwargs) -> bool:
    """Whether a local folder or a Hub repo holds exactly our shim for ``class_name`` (byte for byte).

    ``InfinityPipeline`` / ``HARTPipeline.from_pretrained`` use it to load a shimmed folder without
    ``trust_remote_code``: the only code diffusers would run is the one-line import of the very class being loaded.
    For a repo id only ``model_index.json`` and ``pipeline.py`` are fetched (``hub_kwargs``: ``cache_dir``,
    ``revision``, ``token``, ``local_files_only``, ``subfolder``); any failure to fetch them answers ``False`` and
    leaves the error to diffusers' own loading.
    """
    folder = Path(path_or_repo)
    if folder.is_dir():
        try:
            return has_hub_shim(folder) and _read_index(folder)["_class_name"][1] == class_name
        except (ValueError, OSError):
            return False
    from huggingface_hub import hf_hub_download

    kwargs = {
        k: hub_kwargs[k]
        for k in ("cache_dir", "revision", "token", "local_files_only", "subfolder")
        if hub_kwargs.get(k) is not None
    }
    try:
        index_path = hf_hub_download(str(path_or_repo), "model_index.json", **kwargs)
        stored = json.loads(Path(index_path).read_text(encoding="utf-8")).get("_class_name")
        if stored != [HUB_SHIM_MODULE, class_name]:
            return False
        shim_path = hf_hub_download(str(path_or_repo), HUB_SHIM_FILE, **kwargs)
    except Exception:  # noqa: BLE001 - not our shim as far as we can tell; diffusers reports the real problem
        return False
    return Path(shim_path).read_text(encoding="utf-8") == hub_shim_source(class_name)


def write_hub_shim(folder: PathLike, overwrite: bool = False) -> Path:
    """Make a saved pipeline folder load with ``DiffusionPipeline.from_pretrained(folder_or_repo, trust_remote_code=True)``.

    Writes ``pipeline.py`` (one line: ``from diffusers_var_accel import <class>``) and sets ``"_class_name":
    ["pipeline", "<class>"]`` in ``model_index.json``. Call it after every ``save_pretrained`` into the folder
    (``save_pretrained`` writes the plain class name again). Idempotent.

    After it, ``DiffusionPipeline.from_pretrained(folder)`` needs ``trust_remote_code=True`` (diffusers runs
    ``pipeline.py``); ``InfinityPipeline.from_pretrained(folder)`` does not: it checks that ``pipeline.py`` is exactly
    this shim of its own class (:func:`holds_own_shim`). :func:`remove_hub_shim` undoes it.

    Args:
        folder (`str` or `os.PathLike`): a folder written by ``InfinityPipeline`` / ``HARTPipeline.save_pretrained``.
        overwrite (`bool`, *optional*, defaults to `False`): replace a ``pipeline.py`` that is not our shim.

    Returns:
        `Path`: the written ``pipeline.py``.

    Raises:
        ValueError: no ``model_index.json``, another pipeline class, or a foreign ``pipeline.py`` without ``overwrite``.

    Examples:
        ```py
        >>> from diffusers import DiffusionPipeline
        >>> from diffusers_var_accel.hub import write_hub_shim
        >>> from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

        >>> build_tiny_infinity_pipeline().save_pretrained("tiny-infinity")
        >>> write_hub_shim("tiny-infinity")
        >>> pipe = DiffusionPipeline.from_pretrained("tiny-infinity", trust_remote_code=True)   # an InfinityPipeline
        ```
    """
    cls = pipeline_class(folder)
    shim = Path(folder) / HUB_SHIM_FILE
    source = hub_shim_source(cls.__name__)
    if shim.is_file() and shim.read_text(encoding="utf-8") != source and not overwrite:
        raise ValueError(f"{shim} exists and is not the diffusers_var_accel shim; pass overwrite=True to replace it")
    shim.write_text(source, encoding="utf-8")
    index = _read_index(folder)
    index["_class_name"] = [HUB_SHIM_MODULE, cls.__name__]
    _write_index(folder, index)
    return shim


def remove_hub_shim(folder: PathLike) -> None:
    """Undo :func:`write_hub_shim`: delete our ``pipeline.py`` and store the plain class name again."""
    cls = pipeline_class(folder)
    shim = Path(folder) / HUB_SHIM_FILE
    if shim.is_file():
        if shim.read_text(encoding="utf-8") != hub_shim_source(cls.__name__):
            raise ValueError(f"{shim} is not the diffusers_var_accel shim; not removing it")
        shim.unlink()
    index = _read_index(folder)
    index["_class_name"] = cls.__name__
    _write_index(folder, index)


def write_to_hub_cache(folder: PathLike, repo_id: str, cache_dir: PathLike, commit: Optional[str] = None) -> Path:
    """Copy ``folder`` into the Hub cache ``cache_dir`` as the ``main`` revision of the model repo ``repo_id``.

    Repo-id code paths (``from_pretrained("org/name", cache_dir=cache_dir)``) then run offline (``HF_HUB_OFFLINE=1``),
    e.g. on an air-gapped machine or in tests. The layout is ``models--<org>--<name>/snapshots/<commit>/<files>`` plus
    ``refs/main``; files are plain copies (the Hub client's own downloads are symlinks into ``blobs/``, read the same).

    Returns:
        `Path`: the snapshot folder.
    """
    if repo_id.count("/") != 1:
        raise ValueError(f"repo_id must be '<org>/<name>', got {repo_id!r}")
    commit = commit or hashlib.sha1(repo_id.encode("utf-8")).hexdigest()
    repo = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    shutil.copytree(folder, snapshot, dirs_exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit, encoding="utf-8")
    return snapshot


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
    from .schedulers.registry import METHODS

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

    name, about = (MODEL_FAMILIES[family].title, MODEL_FAMILIES[family].description)
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
    index = _read_index(folder)
    rows = [
        (k, v)
        for k, v in sorted(index.items())
        if not k.startswith("_") and isinstance(v, list) and len(v) == 2 and v[0]
    ]
    lines = ["## Components", "", "| component | library | class |", "| --- | --- | --- |"]
    lines += [f"| `{k}` | `{lib}` | `{name}` |" for k, (lib, name) in rows]
    return lines + [""]


def save_presets(directory: Union[str, os.PathLike], model: str, methods: Optional[List[str]] = None) -> List[Path]:
    """Write the packaged presets of ``model`` as ``<directory>/<method>/acceleration_config.json``.

    This is the layout of a Hub repo of presets (upload ``directory``, then load with
    ``Scheduler.from_pretrained(repo_id, subfolder="<method>")``), and of the package's own ``presets/<model>/``.

    Args:
        directory (`str` or `os.PathLike`): the folder to write into (created if needed).
        model (`str`): a packaged model key, e.g. ``"infinity-2b"``.
        methods (`list[str]`, *optional*): the methods to write; all of the model's by default.

    Returns:
        `list[Path]`: the written method folders.

    Raises:
        ValueError: an unknown model or method; the message lists the available presets.
    """
    names = available_presets(model=model)
    if not names:
        raise ValueError(f"no packaged presets for model {model!r}; models with presets: {preset_models()}")
    wanted = [n.split("/")[1] for n in names] if methods is None else list(methods)
    written = []
    for method in wanted:
        target = Path(directory) / method
        VARAccelScheduler.from_pretrained(str(preset_folder(f"{model}/{method}"))).save_pretrained(target)
        written.append(target)
    return written
