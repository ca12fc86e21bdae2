#!/usr/bin/env python
"""Convert the official Infinity checkpoints into a diffusers-format folder that ``InfinityPipeline.from_pretrained`` loads.

Example (Infinity-2B, with flan-t5-xl downloaded beforehand into a local folder):

    python scripts/convert_infinity_original.py \\
        --transformer weights/infinity_2b_reg.pth --vae weights/infinity_vae_d32reg.pth \\
        --text-encoder weights/flan-t5-xl --config infinity-2b --dtype bfloat16 --output infinity-2b-diffusers

Loading is strict: a checkpoint with missing, unexpected or mis-shaped keys stops the conversion (exit status 1) with
every offending key listed on stderr. The logic lives in
``diffusers_var_accel.pipelines.infinity.convert.convert_infinity_original``; this script is
``var-accel convert infinity`` (same flags) and, as before, replaces an existing output folder.
"""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diffusers_var_accel.lab.cli import convert_script_main


def main(argv=None) -> int:
    return convert_script_main("infinity", argv)


if __name__ == "__main__":
    sys.exit(main())
