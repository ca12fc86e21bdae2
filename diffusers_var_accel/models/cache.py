"""Moved to :mod:`diffusers_var_accel.next_scale.cache` (the loop's contract); kept as an alias for imports."""

from ..next_scale.cache import ScaleKVCache  # noqa: F401
