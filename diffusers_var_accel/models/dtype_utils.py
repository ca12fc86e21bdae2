"""The dtype a module computes in, also under diffusers' layerwise casting."""

from __future__ import annotations

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
