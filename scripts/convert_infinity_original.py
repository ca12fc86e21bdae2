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

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: Optional[List[str]] = None) -> int:
    from diffusers_var_accel.cli import main as cli_main

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--overwrite" not in argv and not any(a in ("-h", "--help") for a in argv):
        argv.append("--overwrite")  # the script has always replaced an existing output folder
    return cli_main(["convert", "infinity", *argv])


if __name__ == "__main__":
    sys.exit(main())
