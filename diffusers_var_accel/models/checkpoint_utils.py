"""Reading official checkpoints safely and loading them strictly.

``.pth`` files are read only with ``torch.load(..., weights_only=True)``; safetensors with ``safetensors``. Loading
never ignores a key: missing, unexpected and mis-shaped keys are all listed in one error. A file that cannot be read
(empty, truncated, not a checkpoint) fails naming the file and what is wrong with it. The same strictness applies to
folders written by ``save_pretrained`` (:class:`StrictLoadingMixin`).
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch

#: The names a string ``torch_dtype`` / ``dtype`` may take (also with a ``"torch."`` prefix).
DTYPE_NAMES: Dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "half": torch.float16,
    "float": torch.float32,
}


def resolve_torch_dtype(value: Any, name: str = "torch_dtype") -> Optional[torch.dtype]:
    """``value`` as a ``torch.dtype``: a ``torch.dtype``, ``None``, or one of :data:`DTYPE_NAMES` (``"float16"``,
    ``"torch.bfloat16"``, ...). Anything else is an error (never a silent float32).

    Raises:
        ValueError: an unknown name or another type; the message lists the accepted names.
    """
    if value is None or isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        key = value.strip().lower()
        key = key[len("torch.") :] if key.startswith("torch.") else key
        if key in DTYPE_NAMES:
            return DTYPE_NAMES[key]
    raise ValueError(
        f"{name}={value!r} is not a dtype: pass a torch.dtype (torch.float16) or one of the names "
        f"{sorted(n for n in DTYPE_NAMES if n in ('float32', 'float16', 'bfloat16', 'float64'))} "
        "(optionally as 'torch.<name>')"
    )


class CheckpointFileError(ValueError):
    """A weights file that cannot be read: the message names the file and what is wrong with it."""


def check_checkpoint_file(path: Union[str, os.PathLike]) -> None:
    """Raise :class:`CheckpointFileError` (a ``ValueError``) when ``path`` is empty or not a readable checkpoint.

    A safetensors file is checked by opening it (its header and the size it announces; the tensors are not read); a
    pickle (``.pth`` / ``.bin`` / ``.pt`` / ``.ckpt``) by loading it with ``weights_only=True``.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint file not found: {path}")
    size = os.path.getsize(path)
    if size == 0:
        raise CheckpointFileError(
            f"{path} is empty (0 bytes): the download or the copy of this weights file did not finish"
        )
    if path.endswith(".safetensors"):
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(path, framework="pt") as f:
                list(f.keys())
        except (SafetensorError, OSError, ValueError, RuntimeError) as err:
            raise CheckpointFileError(
                f"{path} ({size} bytes) is not a readable safetensors file (truncated or corrupted): {err}"
            ) from None
    else:
        _load_pickle(path)


def _load_pickle(path: str):
    size = os.path.getsize(path)
    if size == 0:
        raise CheckpointFileError(
            f"{path} is empty (0 bytes): the download or the copy of this checkpoint did not finish"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        # weights_only refuses objects that are not tensors or plain containers (e.g. a malicious pickle), and bytes
        # that are no pickle at all
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        reason = next((line for line in lines if "WeightsUnpickler error" in line), lines[0] if lines else "")
        raise CheckpointFileError(
            f"{path} ({size} bytes) is not a readable PyTorch checkpoint for torch.load(weights_only=True) "
            f"(corrupted, or it holds objects other than tensors, which are refused): {reason}"
        ) from None
    except (EOFError, RuntimeError, OSError, ValueError, TypeError, KeyError) as err:
        raise CheckpointFileError(
            f"{path} ({size} bytes) is not a readable PyTorch checkpoint (truncated or corrupted): "
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        ) from None


def load_original_state_dict(
    path_or_state_dict: Union[str, os.PathLike, Dict[str, torch.Tensor]], entry: Optional[str] = None
) -> Dict[str, torch.Tensor]:
    """A plain ``name -> tensor`` dict from a state dict, a ``.safetensors`` file or a ``.pth`` / ``.bin`` pickle.

    Args:
        path_or_state_dict: the file, or an already loaded dict.
        entry: for pickles that wrap the state dict (e.g. ``{'vae': ...}``), the entry to take when it is present.
    """
    if isinstance(path_or_state_dict, dict):
        state_dict = path_or_state_dict
    else:
        path = os.fspath(path_or_state_dict)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"checkpoint file not found: {path}")
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            check_checkpoint_file(path)
            state_dict = load_file(path)
        else:
            state_dict = _load_pickle(path)
        if not isinstance(state_dict, dict):
            raise CheckpointFileError(f"{path} holds a {type(state_dict).__name__}, not a state dict (name -> tensor)")
    if entry is not None and isinstance(state_dict.get(entry), dict):
        state_dict = state_dict[entry]
    bad = [k for k, v in state_dict.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise ValueError(f"checkpoint entries are not tensors: {bad[:10]}{' ...' if len(bad) > 10 else ''}")
    return dict(state_dict)


def check_state_dict(
    expected_shapes: Mapping[str, Tuple[int, ...]], state_dict: Mapping[str, torch.Tensor], what: str
) -> None:
    """Raise one ``ValueError`` listing every missing, unexpected and mis-shaped key (with shapes), if any."""
    missing = sorted(k for k in expected_shapes if k not in state_dict)
    unexpected = sorted(k for k in state_dict if k not in expected_shapes)
    mis_shaped = sorted(
        k for k in state_dict if k in expected_shapes and tuple(state_dict[k].shape) != tuple(expected_shapes[k])
    )
    if not (missing or unexpected or mis_shaped):
        return
    lines = [f"{what} does not match the model:"]
    if missing:
        lines.append(f"missing keys ({len(missing)}):")
        lines += [f"  {k} {tuple(expected_shapes[k])}" for k in missing]
    if unexpected:
        lines.append(f"unexpected keys ({len(unexpected)}):")
        lines += [f"  {k} {tuple(state_dict[k].shape)}" for k in unexpected]
    if mis_shaped:
        lines.append(f"mis-shaped keys ({len(mis_shaped)}):")
        lines += [
            f"  {k}: checkpoint {tuple(state_dict[k].shape)}, model {tuple(expected_shapes[k])}" for k in mis_shaped
        ]
    raise ValueError("\n".join(lines))


def build_and_load_strict(
    cls,
    config: Dict[str, Any],
    state_dict: Dict[str, torch.Tensor],
    what: str,
    torch_dtype: Optional[torch.dtype] = None,
    convert=None,
):
    """Build ``cls(**config)`` without initialising weights (meta device), then load ``state_dict`` strictly.

    ``convert(state_dict, expected_shapes)`` renames official keys first. Tensors of the given dict are copied, so the
    model never shares storage with the caller's dict.
    """
    torch_dtype = resolve_torch_dtype(torch_dtype)
    with torch.device("meta"):
        model = cls(**config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if convert is not None:
        state_dict = convert(state_dict, expected)
    check_state_dict(expected, state_dict, what)
    dtype = torch_dtype or torch.float32
    loaded = {
        k: v.to(dtype=dtype if v.is_floating_point() else v.dtype, copy=True).contiguous()
        for k, v in state_dict.items()
    }
    model.load_state_dict(loaded, strict=True, assign=True)
    return model.eval()


#: The index file of a sharded safetensors checkpoint (transformers' / the released Infinity-8B layout).
SHARDED_INDEX_NAME = "model.safetensors.index.json"


def read_shard_index(folder: Union[str, os.PathLike]) -> Dict[str, list]:
    """``{shard file: [keys]}`` of a sharded folder's ``model.safetensors.index.json`` (``{"weight_map": {key: file}}``).

    Raises:
        FileNotFoundError: no index in the folder, or a shard it names is missing (the file is named).
        ValueError: an index that is not valid JSON or has no ``weight_map`` of key -> file name.
    """
    import json

    folder = os.fspath(folder)
    index_path = os.path.join(folder, SHARDED_INDEX_NAME)
    if not os.path.isfile(index_path):
        found = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        raise FileNotFoundError(
            f"sharded checkpoint folder {folder} has no {SHARDED_INDEX_NAME} (found: {found[:10]})"
        )
    try:
        with open(index_path, encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, ValueError) as err:
        raise ValueError(f"{index_path} is not a readable JSON index: {err}") from err
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index_path} has no 'weight_map' of key -> shard file name")
    shards: Dict[str, list] = {}
    for key, shard in weight_map.items():
        if os.path.basename(shard) != shard:
            raise ValueError(f"{index_path}: shard name {shard!r} of key {key!r} is not a file name in the folder")
        shards.setdefault(shard, []).append(key)
    for shard in shards:
        if not os.path.isfile(os.path.join(folder, shard)):
            raise FileNotFoundError(f"shard {os.path.join(folder, shard)} named by {index_path} does not exist")
    return shards


def _open_shard(path: str):
    from safetensors import safe_open

    try:
        return safe_open(path, framework="pt", device="cpu")
    except Exception as err:  # safetensors raises its own error type for a bad header or a truncated file
        raise ValueError(f"shard {path} is not a readable safetensors file: {err}") from err


def sharded_checkpoint_shapes(folder: Union[str, os.PathLike]) -> Dict[str, torch.Tensor]:
    """Every key of a sharded folder as an empty ``meta`` tensor of its shape, read from the shard headers only.

    Raises:
        ValueError: a shard that is not safetensors, or whose keys differ from the index's (file and keys named).
    """
    folder = os.fspath(folder)
    out: Dict[str, torch.Tensor] = {}
    for shard, keys in read_shard_index(folder).items():
        path = os.path.join(folder, shard)
        with _open_shard(path) as f:
            present = set(f.keys())
            absent, extra = sorted(set(keys) - present), sorted(present - set(keys))
            if absent or extra:
                raise ValueError(
                    f"shard {path} does not hold the keys its index assigns to it: missing {absent[:10]}, "
                    f"not in the index {extra[:10]}"
                )
            for key in keys:
                out[key] = torch.empty(tuple(f.get_slice(key).get_shape()), device="meta")
    return out


def build_and_load_sharded_strict(
    cls,
    config: Dict[str, Any],
    folder: Union[str, os.PathLike],
    what: str,
    torch_dtype: Optional[torch.dtype] = None,
    convert=None,
):
    """:func:`build_and_load_strict` for a sharded safetensors folder, one shard at a time.

    The model is built on the meta device; every key and shape is checked against the shard headers before any
    weight is read (one error lists all missing, unexpected and mis-shaped keys); then each shard's tensors are read,
    cast and assigned into the model, so the weights are held once (plus at most one shard being read).
    """
    if torch_dtype is not None and not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"torch_dtype must be a torch.dtype or None, got {torch_dtype!r}")
    folder = os.fspath(folder)
    shapes = sharded_checkpoint_shapes(folder)
    with torch.device("meta"):
        model = cls(**config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    renamed = convert(shapes, expected) if convert is not None else dict(shapes)
    check_state_dict(expected, renamed, f"{what} {folder}")
    # the renaming is decided once on the full key set (it may depend on all keys, e.g. blocks per chunk)
    source_of = {id(v): k for k, v in shapes.items()}
    new_name = {source_of[id(v)]: k for k, v in renamed.items()}
    dtype = torch_dtype or torch.float32
    for shard, keys in read_shard_index(folder).items():
        path = os.path.join(folder, shard)
        part: Dict[str, torch.Tensor] = {}
        with _open_shard(path) as f:
            for key in keys:
                if key not in new_name:  # dropped by the renaming (no such key in the model)
                    continue
                try:
                    tensor = f.get_tensor(key)
                except Exception as err:
                    raise ValueError(f"shard {path}: cannot read tensor {key!r}: {err}") from err
                part[new_name[key]] = tensor.to(dtype) if tensor.is_floating_point() else tensor
        result = model.load_state_dict(part, strict=False, assign=True)
        if result.unexpected_keys:  # pragma: no cover - excluded by check_state_dict above
            raise ValueError(f"{what}: shard {path} holds unexpected keys {result.unexpected_keys[:10]}")
        del part
    still_meta = [k for k, v in model.state_dict().items() if v.is_meta]
    if still_meta:  # pragma: no cover - excluded by check_state_dict above
        raise ValueError(f"{what} {folder}: keys never loaded: {still_meta[:10]}")
    return model.eval()


def check_folder_files(folder: Union[str, os.PathLike]) -> None:
    """Check every file a component folder of a saved pipeline holds, before any library reads it: ``*.json`` must be
    valid JSON, ``*.safetensors`` readable (header and announced size), and no weights file empty.

    Raises:
        CheckpointFileError: naming the file and what is wrong with it.
    """
    folder = os.fspath(folder)
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        try:
            with open(path, encoding="utf-8") as f:
                json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CheckpointFileError(f"{path} is not valid JSON (truncated or corrupted?): {err}") from None
    _check_shard_indexes(folder)
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        check_checkpoint_file(path)
    if os.path.isfile(os.path.join(folder, "tokenizer_config.json")):
        _check_tokenizer_files(folder)
    for pattern in ("*.bin", "*.pth", "*.pt", "*.ckpt"):
        for path in sorted(glob.glob(os.path.join(folder, pattern))):
            if os.path.getsize(path) == 0:
                raise CheckpointFileError(
                    f"{path} is empty (0 bytes): the download or the copy of this file did not finish"
                )


#: A shard of a sharded checkpoint: ``<stem>-00001-of-00003.<ext>`` (diffusers' and transformers' naming).
_SHARD_NAME = re.compile(r"^(?P<stem>.+)-\d{5}-of-\d{5}\.(?P<ext>safetensors|bin)$")


def _check_shard_indexes(folder: str) -> None:
    """Every shard an index (``*.index.json``) names is there, and shards are never there without their index (the
    libraries would report a missing single weights file instead)."""
    indexed = set()
    for index_path in sorted(glob.glob(os.path.join(folder, "*.index.json"))):
        with open(index_path, encoding="utf-8") as f:
            index = json.load(f)  # valid JSON: checked before
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointFileError(f"{index_path} is not a shard index: it has no weight_map of tensor -> file")
        for shard in sorted(set(weight_map.values())):
            indexed.add(shard)
            if not os.path.isfile(os.path.join(folder, shard)):
                raise FileNotFoundError(
                    f"{os.path.join(folder, shard)} is missing: {index_path} names it as a shard of the weights"
                )
    for path in sorted(glob.glob(os.path.join(folder, "*-of-*.*"))):
        match = _SHARD_NAME.match(os.path.basename(path))
        if match and os.path.basename(path) not in indexed:
            expected = os.path.join(folder, f"{match['stem']}.{match['ext']}.index.json")
            raise FileNotFoundError(
                f"{expected} is missing: {path} is a shard of sharded weights, which cannot load without their index"
            )


#: Files a transformers tokenizer folder can build its tokenizer from when it has no ``tokenizer.json``.
_SLOW_TOKENIZER_FILES = ("*.model", "vocab.json", "vocab.txt", "*.tiktoken")


def _check_tokenizer_files(folder: str) -> None:
    """A tokenizer folder (``tokenizer_config.json``) holds a readable ``tokenizer.json``, or the vocabulary files a
    slow tokenizer reads; else transformers fails with a message that names no file."""
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        if not any(glob.glob(os.path.join(folder, pattern)) for pattern in _SLOW_TOKENIZER_FILES):
            raise FileNotFoundError(
                f"{path} is missing: the tokenizer folder holds neither it nor a vocabulary file "
                f"({', '.join(_SLOW_TOKENIZER_FILES)})"
            )
        return
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover - transformers' tokenizers need it
        return
    try:
        Tokenizer.from_file(path)
    except Exception as err:  # noqa: BLE001 - the Rust library raises a bare Exception
        raise CheckpointFileError(
            f"{path} is not a readable tokenizer file (truncated or corrupted?): {err}"
        ) from None


def check_loaded_keys(model: torch.nn.Module, folder: Union[str, os.PathLike]) -> None:
    """After a library loaded ``model`` from ``folder`` (a transformers text encoder), check that the folder's
    safetensors files held exactly the model's weights: transformers initialises missing weights at random with only a
    log line. Weights tied to another (``all_tied_weights_keys``) and keys the class declares ignorable are not
    required. Folders with pickled weights only are not checked (their keys cannot be read without loading them).

    Raises:
        ValueError: listing the missing and unexpected keys, naming the files.
    """

    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(os.fspath(folder), "*.safetensors")))
    if not files:
        return
    stored = set()
    for path in files:
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
            if "tensor_names" in metadata:  # torchao's flattened tensors: the file lists the weights they make up
                stored.update(json.loads(metadata["tensor_names"]))
            else:
                stored.update(f.keys())
    expected = set(model.state_dict())
    tied = dict(getattr(model, "all_tied_weights_keys", None) or {})
    ignore_missing = list(getattr(model, "_keys_to_ignore_on_load_missing", None) or [])
    ignore_unexpected = list(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])
    missing = sorted(
        k
        for k in expected - stored
        if not (k in tied and tied[k] in stored) and not any(re.search(p, k) for p in ignore_missing)
    )
    unexpected = sorted(k for k in stored - expected if not any(re.search(p, k) for p in ignore_unexpected))
    if missing or unexpected:
        lines = [
            f"{', '.join(files)} do not match {type(model).__name__} as {os.path.join(os.fspath(folder), 'config.json')} "
            "describes it:"
        ]
        if missing:
            lines += [f"missing keys ({len(missing)}):"] + [f"  {k}" for k in missing[:50]]
        if unexpected:
            lines += [f"unexpected keys ({len(unexpected)}):"] + [f"  {k}" for k in unexpected[:50]]
        raise ValueError("\n".join(lines))


def _weights_files(folder: str) -> List[str]:
    """The weights files ``ModelMixin.from_pretrained`` reads from a saved model folder."""
    names = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    return names or sorted(glob.glob(os.path.join(folder, "*.bin")))


class StrictLoadingMixin:
    """``from_pretrained`` of a saved model folder as strict as loading the official checkpoints.

    Mixed in before ``ModelMixin``. The weights files are checked first (an empty or truncated file is named); then
    every missing, unexpected or mis-shaped key is an error that lists the keys and names the folder's weights and
    ``config.json`` (a config that disagrees with its weights, e.g. another depth, shows as missing or unexpected
    blocks). diffusers itself only logs unexpected keys and initialises missing ones (or leaves them on the meta
    device). A string ``torch_dtype`` / ``dtype`` (``"float16"``) is honoured, an unknown one refused.
    """

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        for key in ("torch_dtype", "dtype"):
            if key in kwargs:
                kwargs[key] = resolve_torch_dtype(kwargs[key], key)
        return_info = kwargs.pop("output_loading_info", False)
        folder = (
            os.fspath(pretrained_model_name_or_path)
            if isinstance(pretrained_model_name_or_path, (str, os.PathLike))
            else None
        )
        if folder is not None and kwargs.get("subfolder"):
            folder = os.path.join(folder, kwargs["subfolder"])
        local = folder is not None and os.path.isdir(folder)
        if local:
            config_file = os.path.join(folder, "config.json")
            if not os.path.isfile(config_file):
                raise FileNotFoundError(
                    f"{folder} has no config.json: not a folder written by {cls.__name__}.save_pretrained"
                )
            try:
                with open(config_file, encoding="utf-8") as f:
                    json.load(f)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise CheckpointFileError(f"{config_file} is not valid JSON: {err}") from None
            weights = _weights_files(folder)
            if not weights:
                raise FileNotFoundError(f"{folder} has no weights file (diffusion_pytorch_model.safetensors or .bin)")
            for path in weights:
                check_checkpoint_file(path)
        where = (
            f"{', '.join(_weights_files(folder))} (with {os.path.join(folder, 'config.json')})"
            if local
            else str(pretrained_model_name_or_path)
        )
        try:
            model, info = super().from_pretrained(pretrained_model_name_or_path, output_loading_info=True, **kwargs)
        except ValueError as err:
            if "expected shape" not in str(err):
                raise
            # diffusers stops at the first mis-shaped key and names no file
            raise ValueError(
                f"{where} does not match {cls.__name__} as its config describes it:\nmis-shaped keys: "
                f"{str(err).split(' If you want')[0]}"
            ) from None
        problems = []
        for label, keys in (
            ("missing keys", info.get("missing_keys")),
            ("unexpected keys", info.get("unexpected_keys")),
            ("mis-shaped keys", info.get("mismatched_keys")),
            ("load errors", info.get("error_msgs")),
        ):
            keys = sorted(str(k) for k in (keys or []))
            if keys:
                problems.append(
                    f"{label} ({len(keys)}):\n"
                    + "\n".join(f"  {k}" for k in keys[:50])
                    + (f"\n  ... and {len(keys) - 50} more" if len(keys) > 50 else "")
                )
        if problems:
            raise ValueError(
                f"{where} does not match {cls.__name__} as its config describes it:\n" + "\n".join(problems)
            )
        return (model, info) if return_info else model
