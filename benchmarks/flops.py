"""``python benchmarks/flops.py ...``: the FLOP counter of the package (:mod:`diffusers_var_accel.bench.flops`).

The counter lives in the package so that ``var-accel flops`` works from an installed wheel; this script and
``from benchmarks.flops import ...`` keep working in a source checkout and re-export its public API.
"""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the checkout's package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from diffusers_var_accel.bench.flops import *  # noqa: E402,F401,F403
from diffusers_var_accel.bench.flops import main  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
