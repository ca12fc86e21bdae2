"""Moved to :mod:`diffusers_var_accel.next_scale` (the loop's contract); kept as an alias for imports."""

from ..next_scale.loop import identity_plans, run_next_scale_loop  # noqa: F401
from ..next_scale.state import NextScaleState, ScaleModelFamily  # noqa: F401
