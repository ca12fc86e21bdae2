"""Loading and saving pipeline folders as strictly as the official checkpoints: the class ``model_index.json``
names, atomic saves, loaded keys checked against the components' configurations."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple


from ..families import MODEL_FAMILIES
from ..schedulers.presets import close_names


# loading
# ---------------------------------------------------------------------------------------------------------------------
def pipeline_class_names() -> Tuple[str, ...]:
    """The pipeline classes a saved folder's ``model_index.json`` may name: the registered families', sorted (read
    when a folder is loaded, so a family registered later counts)."""
    return tuple(sorted(family.pipeline_class_name for family in MODEL_FAMILIES.values()))


def prepare_pipeline_loading(
    cls, pretrained_model_name_or_path, kwargs: Dict[str, Any], packaged: Optional[Dict[str, Callable[[], Any]]] = None
):
    """What ``from_pretrained`` of a VAR pipeline passes on to diffusers: ``(path, kwargs)``.

    * a packaged name (``packaged``: name -> function returning its folder) becomes its folder; a name close to one
      (a typo, e.g. ``"embeded"``) that is neither a folder nor a Hub repo id (``org/name``) is an error suggesting it;
    * ``torch_dtype`` (the name diffusers 0.42 deprecates) is passed on as ``dtype``; a string dtype (``"float16"``,
      ``"torch.bfloat16"``, also in a per-component dict) becomes the ``torch.dtype``; an unknown one is refused
      (diffusers would fall back to float32);
    * a local folder's ``model_index.json`` must be valid JSON and name ``cls`` (with or without the Hub shim): a
      class that does not exist or another pipeline's class is an error naming it and the allowed ones; every
      component folder it lists must exist, with valid JSON files and readable safetensors files (an error names the
      file), so that no library fails later with a message that names no file;
    * a ``quantization_config`` must be one of the supported torchao forms
      (:func:`~diffusers_var_accel.pipelines.quantization.check_quantization_config`);
    * what a ``save_pretrained`` killed while swapping the folder in left beside it is settled first (the earlier
      pipeline or the new one, whole: :func:`~diffusers_var_accel.files.resolve_interrupted_replace`).
    """
    from ..models.checkpoint_utils import CheckpointFileError, check_folder_files, resolve_torch_dtype

    from .quantization import check_quantization_config, settle_quantized_folder_dtype

    packaged = packaged or {}
    kwargs = dict(kwargs)
    check_quantization_config(cls.__name__, kwargs.get("quantization_config"))
    if "torch_dtype" in kwargs:
        # diffusers 0.42 renamed it ``dtype`` (and warns on every load); both names are accepted here, one at a time
        if kwargs.get("dtype") is not None and kwargs["torch_dtype"] is not None:
            raise ValueError("pass dtype or torch_dtype (its older name), not both")
        torch_dtype = kwargs.pop("torch_dtype")
        if torch_dtype is not None:
            kwargs["dtype"] = torch_dtype
    if "dtype" in kwargs:
        value = kwargs["dtype"]
        kwargs["dtype"] = (
            {k: resolve_torch_dtype(v, f"dtype[{k!r}]") for k, v in value.items()}
            if isinstance(value, dict)
            else resolve_torch_dtype(value, "dtype")
        )
    path = pretrained_model_name_or_path
    if isinstance(path, str) and path in packaged:
        return packaged[path](), kwargs
    if isinstance(path, str) and not os.path.exists(path) and "/" not in path and os.sep not in path:
        hint = close_names(path, list(packaged))
        if hint:
            raise FileNotFoundError(
                f"{path!r} is not a folder, a Hub repo id ('org/name') or a packaged model name{hint}; "
                f"packaged: {sorted(packaged)}"
            )
    if isinstance(path, (str, os.PathLike)):
        from ..files import resolve_interrupted_replace

        resolve_interrupted_replace(path)  # a save killed while swapping folders: the earlier or the new, whole
    if isinstance(path, os.PathLike) and not os.path.exists(path):  # a path object names a local folder
        raise FileNotFoundError(
            f"{path}: no such folder (a pipeline folder written by {cls.__name__}.save_pretrained)"
        )
    if isinstance(path, (str, os.PathLike)) and os.path.isdir(path):
        index_file = os.path.join(os.fspath(path), "model_index.json")
        if not os.path.isfile(index_file):
            raise FileNotFoundError(
                f"{path} has no model_index.json: not a folder written by {cls.__name__}.save_pretrained"
            )
        try:
            with open(index_file, encoding="utf-8") as f:
                index = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CheckpointFileError(f"{index_file} is not valid JSON: {err}") from None
        stored = index.get("_class_name") if isinstance(index, dict) else None
        name = stored[1] if isinstance(stored, list) and len(stored) == 2 else stored
        if name not in [c.__name__ for c in cls.__mro__]:  # the class itself or a pipeline class it extends
            allowed = pipeline_class_names()
            if name in allowed:
                raise ValueError(
                    f"{index_file} holds a {name}, not a {cls.__name__}: load it with {name}.from_pretrained"
                )
            hint = close_names(name, allowed) if isinstance(name, str) else ""
            raise ValueError(
                f"{index_file} names the pipeline class {stored!r}, which does not exist{hint}; "
                f"allowed: {list(allowed)}"
            )
        # components passed to from_pretrained are not read from the folder
        stored_components = [
            k
            for k, v in index.items()
            if not k.startswith("_") and isinstance(v, list) and v[0] is not None and k not in kwargs
        ]
        missing = [k for k in stored_components if not os.path.isdir(os.path.join(os.fspath(path), k))]
        if missing:
            raise FileNotFoundError(
                f"{path}: model_index.json lists the component(s) {missing} but their folders are missing"
            )
        for component in stored_components:
            check_folder_files(os.path.join(os.fspath(path), component))
        settle_quantized_folder_dtype(cls.__name__, os.fspath(path), stored_components, kwargs)
        # a component the folder was saved without (``[null, null]``: a pipeline built with text_encoder=None) stays
        # None: diffusers loads only optional components that way, and the text encoder and tokenizer are required
        # arguments (as in diffusers' text-to-image pipelines) that a pipeline may still set to None
        for name, value in index.items():
            if (
                not name.startswith("_")
                and isinstance(value, list)
                and len(value) == 2
                and value[0] is None
                and value[1] is None
                and name not in kwargs
                and name not in cls._optional_components
            ):
                kwargs[name] = None
    return path, kwargs


@contextlib.contextmanager
def no_nested_progress_bars():
    """transformers' own "Loading weights" bar off while diffusers' "Loading pipeline components" bar runs: a bar
    nested in another writes cursor-up escapes (``\x1b[A``) that litter every log that is not a terminal."""
    from transformers.utils import logging as transformers_logging

    enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            transformers_logging.enable_progress_bar()


#: What ``var-accel convert`` leaves in a folder it finished: the command's sources and settings (hidden), so that
#: the same command again knows the folder as its own output. A later ``save_pretrained`` into the folder drops it.
CONVERSION_RECORD = ".var-accel-conversion.json"


def saved_pipeline_entries(folder) -> List[str]:
    """The entries of a saved pipeline folder that belong to the pipeline saved there: ``model_index.json``, the
    component folders it lists, and the conversion record. A new save replaces all of them (other entries, e.g. a
    README, stay)."""
    entries = ["model_index.json", CONVERSION_RECORD]
    try:
        with open(os.path.join(os.fspath(folder), "model_index.json"), encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, ValueError):
        return entries
    if isinstance(index, dict):
        entries += [k for k in index if isinstance(k, str) and not k.startswith("_")]
    return entries


def save_pipeline_folder(
    pipe, save_directory, args: Tuple[Any, ...], kwargs: Dict[str, Any], finish: Optional[Callable[[Any], None]] = None
) -> None:
    """``DiffusionPipeline.save_pretrained(save_directory, *args, **kwargs)``, all or nothing: the whole pipeline is
    written into a temporary sibling folder and swapped in by two renames (:func:`~diffusers_var_accel.files.
    replace_folder`), so a process killed at any point leaves the earlier pipeline or the new one, never a mix of two
    saves and never neither; a save into a new folder that is killed leaves no folder there. Entries of the earlier
    folder that are not part of its pipeline (a README, the Hub shim's ``pipeline.py``) stay, as with diffusers.
    ``finish(tmp)`` runs on the written folder before the swap (e.g. the Hub shim). With ``push_to_hub`` diffusers'
    own saving runs unchanged (it uploads from the folder it wrote)."""
    from diffusers.pipelines.pipeline_utils import DiffusionPipeline

    from ..files import replace_folder
    from .quantization import check_quantized_components_saveable

    check_quantized_components_saveable(type(pipe).__name__, pipe.components.items())
    if kwargs.get("push_to_hub"):
        DiffusionPipeline.save_pretrained(pipe, save_directory, *args, **kwargs)
        return

    def write(tmp):
        DiffusionPipeline.save_pretrained(pipe, tmp, *args, **kwargs)
        if finish is not None:
            finish(tmp)

    replace_folder(save_directory, write, owned=saved_pipeline_entries)


def check_loaded_pipeline(pipe, path, passed: Sequence[str] = ()) -> None:
    """After ``from_pretrained`` of a local folder: the transformers components (text encoders) it read held exactly
    their model's weights (our own models check themselves when they load; transformers would fill missing weights at
    random with only a log line). Components in ``passed`` were given to ``from_pretrained``, not read."""
    if not (isinstance(path, (str, os.PathLike)) and os.path.isdir(path)):
        return
    from transformers import PreTrainedModel

    from ..models.checkpoint_utils import check_loaded_keys

    for name, component in pipe.components.items():
        if isinstance(component, PreTrainedModel) and name not in passed:
            check_loaded_keys(component, os.path.join(os.fspath(path), name))


def load_embedded_pipeline(**kwargs):
    """The embedded pipeline (the packaged shapes model, :mod:`diffusers_var_accel.embedded`), offline; ``kwargs`` go
    to ``from_pretrained`` (e.g. ``dtype``). Its class is the one its ``model_index.json`` names."""
    from ..embedded import embedded_model_path
    from ..hub import pipeline_class

    folder = embedded_model_path()
    return pipeline_class(folder).from_pretrained(folder, **kwargs)
