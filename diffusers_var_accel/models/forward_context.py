"""Moved to :mod:`diffusers_var_accel.next_scale.context` (the loop's contract); kept as an alias for imports."""

from ..next_scale.context import (  # noqa: F401
    PassRecords,
    VARForwardContext,
    block_causal_mask,
    gather_rope,
    gather_scale_ids,
    gather_tokens,
    scatter_tokens,
)
