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

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diffusers_var_accel.lab.cli import convert_script_main


def main(argv=None) -> int:
    return convert_script_main("hart", argv)


if __name__ == "__main__":
    sys.exit(main())
