"""The dtype a module computes in, also under diffusers' layerwise casting."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

# diffusers.hooks.layerwise_casting names its hook so (a private constant there, pinned with diffusers' version)
_LAYERWISE_CASTING_HOOK = "layerwise_casting"


def compute_dtype(module: nn.Module) -> torch.dtype:
    """The dtype ``module``'s weights have while its forward runs.

    That is its weight dtype, except under ``ModelMixin.enable_layerwise_casting``: the weights are then stored in
    ``storage_dtype`` (e.g. float8) between calls and cast to ``compute_dtype`` only inside the forward, so inputs
    must be cast to the compute dtype, never to the stored one (no float8 kernels exist for SiLU, GELU, ...).
    """
    registry = getattr(module, "_diffusers_hook", None)
    hook = registry.get_hook(_LAYERWISE_CASTING_HOOK) if registry is not None else None
    if hook is not None:
        return hook.compute_dtype
    return module.weight.dtype


def linear_input_dtype(module: nn.Module, device: torch.device) -> torch.dtype:
    """The dtype a ``Linear`` reads its input in on ``device``: the autocast dtype where autocast is on (it would cast
    its input to it), else :func:`compute_dtype`. Ops that feed a Linear write their result in this dtype directly
    (``out=``), which fuses the cast into them: one kernel instead of two."""
    device_type = device.type
    if device_type != "meta" and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return compute_dtype(module)


def fused_cast_out(shape, result_dtype: torch.dtype, dtype: Optional[torch.dtype], device: torch.device):
    """The ``out=`` tensor that makes an op whose result dtype is ``result_dtype`` write ``dtype`` instead (the cast
    fused into the op), or ``None`` where there is nothing to cast (``dtype`` is ``None`` or ``result_dtype``) or the
    tensors are meta (shape-only FLOP counting keeps the op's own dtype)."""
    if dtype is None or dtype == result_dtype or device.type == "meta":
        return None
    return torch.empty(shape, dtype=dtype, device=device)
