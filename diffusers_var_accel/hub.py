"""Publishing converted pipelines on the Hugging Face Hub: the ``pipeline.py`` shim, presets, a local Hub cache.

* :func:`write_hub_shim` makes a saved pipeline folder load through diffusers' generic entry point:
  ``DiffusionPipeline.from_pretrained(repo_id, trust_remote_code=True)`` returns our :class:`InfinityPipeline` /
  :class:`HARTPipeline`. It writes the one-line ``pipeline.py`` (``from diffusers_var_accel import InfinityPipeline``)
  and sets ``"_class_name": ["pipeline", "InfinityPipeline"]`` in ``model_index.json``; diffusers then imports
  ``pipeline.py`` (so the installed package, whose modules ``model_index.json`` names) and takes the class from it.
  diffusers runs ``pipeline.py`` only with ``trust_remote_code=True``. ``InfinityPipeline.from_pretrained`` loads a
  shimmed folder without it once it has checked that ``pipeline.py`` is exactly our one-line shim of that class.
  A plain saved folder (no shim) loads through ``DiffusionPipeline`` / ``AutoPipelineForText2Image`` once
  ``diffusers_var_accel`` is imported (``pipelines/diffusers_registration.py``).
* :func:`save_presets` writes the packaged presets of a model in the layout of a Hub repo of presets.
* :func:`write_to_hub_cache` lays a folder out as a cached Hub repo, so repo-id code paths run offline.

Model cards (``README.md`` with YAML metadata, presets and measured numbers) are written by the lab:
:mod:`diffusers_var_accel.lab.cards`.

Examples:
    ```py
    >>> from diffusers_var_accel.hub import write_hub_shim
    >>> from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

    >>> build_tiny_infinity_pipeline().save_pretrained("tiny-infinity")
    >>> shim = write_hub_shim("tiny-infinity")
    ```
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Union


from .families import MODEL_FAMILIES
from .files import resolve_interrupted_replace, write_text_atomic
from .schedulers.presets import (
    available_presets,
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


# ---------------------------------------------------------------------------------------------------------------------
# model_index.json and the shim
# ---------------------------------------------------------------------------------------------------------------------
def read_index(folder: PathLike) -> Dict[str, Any]:
    resolve_interrupted_replace(folder)  # a save killed while swapping the folder in: the earlier or the new, whole
    path = Path(folder) / "model_index.json"
    if not path.is_file():
        raise ValueError(
            f"{folder} has no model_index.json: save a pipeline there first (pipe.save_pretrained) or "
            "convert official checkpoints (scripts/convert_*_original.py)"
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path} is not valid JSON (truncated or corrupted?): {err}") from None


def write_index(folder: PathLike, index: Dict[str, Any]) -> None:
    write_text_atomic(Path(folder) / "model_index.json", json.dumps(index, indent=2) + "\n")


def pipeline_class(folder: PathLike):
    """The pipeline class of a saved folder (a registered family's: ``InfinityPipeline``, ``HARTPipeline``), with or
    without the shim.

    Raises:
        ValueError: no ``model_index.json``, or it names a class this package does not provide.
    """
    stored = read_index(folder).get("_class_name")
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
    stored = read_index(folder).get("_class_name")
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
            return has_hub_shim(folder) and read_index(folder)["_class_name"][1] == class_name
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
    write_text_atomic(shim, source)
    index = read_index(folder)
    index["_class_name"] = [HUB_SHIM_MODULE, cls.__name__]
    write_index(folder, index)
    return shim


def remove_hub_shim(folder: PathLike) -> None:
    """Undo :func:`write_hub_shim`: delete our ``pipeline.py`` and store the plain class name again."""
    cls = pipeline_class(folder)
    shim = Path(folder) / HUB_SHIM_FILE
    if shim.is_file():
        if shim.read_text(encoding="utf-8") != hub_shim_source(cls.__name__):
            raise ValueError(f"{shim} is not the diffusers_var_accel shim; not removing it")
        shim.unlink()
    index = read_index(folder)
    index["_class_name"] = cls.__name__
    write_index(folder, index)


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
