#!/usr/bin/env python
"""Convert an official HART folder (``hart-0.7b-1024px/``: ``llm/`` + ``tokenizer/``) into a diffusers-format folder
that ``HARTPipeline.from_pretrained`` loads.

Example (with Qwen2-VL-1.5B-Instruct downloaded beforehand into a local folder):

    python scripts/convert_hart_original.py --checkpoint weights/hart-0.7b-1024px \\
        --text-encoder weights/Qwen2-VL-1.5B-Instruct --output hart-0.7b-diffusers

The EMA weights (``llm/ema_model.bin``, what the official scripts generate with) are used unless ``--no-ema``.
Loading is strict: missing, unexpected or mis-shaped keys stop the conversion (exit status 1) with every offending key
listed on stderr; the discriminator (``disc.*``) and unused training buffers are dropped by name. The logic lives in
``diffusers_var_accel.pipelines.hart.convert.load_original_hart_pipeline``; this script is
``var-accel convert hart`` (same flags) and, as before, replaces an existing output folder.
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
    return cli_main(["convert", "hart", *argv])


if __name__ == "__main__":
    sys.exit(main())
