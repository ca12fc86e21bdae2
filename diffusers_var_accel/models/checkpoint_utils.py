"""Reading official checkpoints safely and loading them strictly.

``.pth`` files are read only with ``torch.load(..., weights_only=True)``; safetensors with ``safetensors``. Loading
never ignores a key: missing, unexpected and mis-shaped keys are all listed in one error.
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, Optional, Union

import torch
import torch.nn as nn


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


def _format(keys: Iterable[str], limit: int = 50) -> str:
    keys = list(keys)
    text = ", ".join(keys[:limit])
    return text + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def check_state_dict(model: nn.Module, state_dict: Dict[str, torch.Tensor], what: str = "checkpoint") -> None:
    """Raise a ``ValueError`` listing every missing, unexpected and mis-shaped key of ``state_dict`` for ``model``."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    mis_shaped = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in expected
        if k in state_dict and tuple(state_dict[k].shape) != tuple(expected[k].shape)
    ]
    if missing or unexpected or mis_shaped:
        parts = [f"{what} does not match the model ({type(model).__name__}):"]
        if missing:
            parts.append(f"missing keys ({len(missing)}): {_format(missing)}")
        if unexpected:
            parts.append(f"unexpected keys ({len(unexpected)}): {_format(unexpected)}")
        if mis_shaped:
            parts.append(f"mis-shaped keys ({len(mis_shaped)}): {_format(mis_shaped)}")
        raise ValueError("\n  ".join(parts))


def strict_load(model: nn.Module, state_dict: Dict[str, torch.Tensor], what: str = "checkpoint") -> None:
    """:func:`check_state_dict`, then copy every tensor into the model (dtype converted to the model's)."""
    check_state_dict(model, state_dict, what)
    model.load_state_dict(state_dict, strict=True)
