"""Reading official checkpoints safely and loading them strictly.

``.pth`` files are read only with ``torch.load(..., weights_only=True)``; safetensors with ``safetensors``. Loading
never ignores a key: missing, unexpected and mis-shaped keys are all listed in one error.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import torch


def load_original_state_dict(path_or_state_dict: Union[str, os.PathLike, Dict[str, torch.Tensor]], entry: Optional[str] = None) -> Dict[str, torch.Tensor]:
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

            state_dict = load_file(path)
        else:
            state_dict = torch.load(path, map_location="cpu", weights_only=True)
    if entry is not None and isinstance(state_dict.get(entry), dict):
        state_dict = state_dict[entry]
    bad = [k for k, v in state_dict.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise ValueError(f"checkpoint entries are not tensors: {bad[:10]}{' ...' if len(bad) > 10 else ''}")
    return dict(state_dict)


def check_state_dict(expected_shapes: Mapping[str, Tuple[int, ...]], state_dict: Mapping[str, torch.Tensor], what: str) -> None:
    """Raise one ``ValueError`` listing every missing, unexpected and mis-shaped key (with shapes), if any."""
    missing = sorted(k for k in expected_shapes if k not in state_dict)
    unexpected = sorted(k for k in state_dict if k not in expected_shapes)
    mis_shaped = sorted(k for k in state_dict if k in expected_shapes and tuple(state_dict[k].shape) != tuple(expected_shapes[k]))
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
        lines += [f"  {k}: checkpoint {tuple(state_dict[k].shape)}, model {tuple(expected_shapes[k])}" for k in mis_shaped]
    raise ValueError("\n".join(lines))


def build_and_load_strict(cls, config: Dict[str, Any], state_dict: Dict[str, torch.Tensor], what: str,
                          torch_dtype: Optional[torch.dtype] = None, convert=None):
    """Build ``cls(**config)`` without initialising weights (meta device), then load ``state_dict`` strictly.

    ``convert(state_dict, expected_shapes)`` renames official keys first. Tensors of the given dict are copied, so the
    model never shares storage with the caller's dict.
    """
    if torch_dtype is not None and not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"torch_dtype must be a torch.dtype or None, got {torch_dtype!r}")
    with torch.device("meta"):
        model = cls(**config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if convert is not None:
        state_dict = convert(state_dict, expected)
    check_state_dict(expected, state_dict, what)
    dtype = torch_dtype or torch.float32
    loaded = {k: v.to(dtype=dtype if v.is_floating_point() else v.dtype, copy=True).contiguous() for k, v in state_dict.items()}
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
        raise FileNotFoundError(f"sharded checkpoint folder {folder} has no {SHARDED_INDEX_NAME} (found: {found[:10]})")
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
                raise ValueError(f"shard {path} does not hold the keys its index assigns to it: missing {absent[:10]}, "
                                 f"not in the index {extra[:10]}")
            for key in keys:
                out[key] = torch.empty(tuple(f.get_slice(key).get_shape()), device="meta")
    return out


def build_and_load_sharded_strict(cls, config: Dict[str, Any], folder: Union[str, os.PathLike], what: str,
                                  torch_dtype: Optional[torch.dtype] = None, convert=None):
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
