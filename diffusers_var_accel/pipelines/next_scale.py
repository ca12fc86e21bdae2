"""Moved to :mod:`diffusers_var_accel.next_scale`; this alias is kept only for ``bench/flops.py`` (owned by another
change of issue 29, which imports the loop from here). Delete it when that import is gone:
``tests/test_package_layers.py`` fails once nothing imports it, and when anything else does."""

from ..next_scale.loop import run_next_scale_loop  # noqa: F401
