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
