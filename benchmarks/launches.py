"""``python benchmarks/launches.py ...``: the kernel-launch and sync counter of the package
(:mod:`diffusers_var_accel.bench.launches`, also ``var-accel launches``).

The counter lives in the package so that ``var-accel launches`` works from an installed wheel; this script and
``from benchmarks.launches import ...`` keep working in a source checkout and re-export its public API.
"""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the checkout's package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from diffusers_var_accel.bench.launches import *  # noqa: E402,F401,F403
from diffusers_var_accel.bench.launches import main  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main(prog="benchmarks/launches.py"))
