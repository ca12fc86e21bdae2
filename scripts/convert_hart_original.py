#!/usr/bin/env python
"""Convert an official HART folder (``hart-0.7b-1024px/``: ``llm/`` + ``tokenizer/``) into a diffusers-format folder
that ``HARTPipeline.from_pretrained`` loads.

Example (with Qwen2-VL-1.5B-Instruct downloaded beforehand into a local folder):

    python scripts/convert_hart_original.py --checkpoint weights/hart-0.7b-1024px \\
        --text-encoder weights/Qwen2-VL-1.5B-Instruct --output hart-0.7b-diffusers

The EMA weights (``llm/ema_model.bin``, what the official scripts generate with) are used unless ``--no-ema``.
Loading is strict: missing, unexpected or mis-shaped keys stop the conversion (exit status 1) with every offending key
listed on stderr; the discriminator (``disc.*``) and unused training buffers are dropped by name. The logic lives in
``diffusers_var_accel.pipelines.hart.convert.load_original_hart_pipeline``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DTYPES = ("float32", "bfloat16", "float16")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="official HART folder (with llm/ and tokenizer/) or its llm/ folder")
    parser.add_argument("--no-ema", action="store_true", help="use the main weights instead of llm/ema_model.bin")
    parser.add_argument("--text-encoder", default=None, help="local transformers folder of the Qwen2 text encoder; omit to convert without one")
    parser.add_argument("--tokenizer", default=None, help="local tokenizer folder (defaults to --text-encoder)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="dtype of the saved weights (default: float32)")
    parser.add_argument("--output", required=True, help="output folder (created)")
    return parser.parse_args(argv)


def load_tokenizer(folder: str):
    """The tokenizer class the folder's ``tokenizer_config.json`` names, else ``AutoTokenizer``'s choice.

    transformers 5 makes ``AutoTokenizer`` pick the tokenizer of the model type in ``config.json`` (Qwen2's) even
    when ``tokenizer_config.json`` names another class; honouring the saved class keeps such tokenizers intact.
    """
    import transformers

    config = Path(folder) / "tokenizer_config.json"
    name = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    cls = getattr(transformers, name, None) if name else None
    return (cls or transformers.AutoTokenizer).from_pretrained(folder, local_files_only=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.tokenizer is not None and args.text_encoder is None:
        print("error: --tokenizer needs --text-encoder", file=sys.stderr)
        return 2

    import torch

    from diffusers_var_accel.pipelines.hart.convert import load_original_hart_pipeline

    dtype = getattr(torch, args.dtype)
    text_encoder = tokenizer = None
    try:
        if args.text_encoder is not None:
            from transformers import AutoModel

            text_encoder = AutoModel.from_pretrained(args.text_encoder, torch_dtype=dtype, local_files_only=True)
            tokenizer = load_tokenizer(args.tokenizer or args.text_encoder)
        pipe = load_original_hart_pipeline(args.checkpoint, use_ema=not args.no_ema, torch_dtype=dtype,
                                           text_encoder=text_encoder, tokenizer=tokenizer)
    except (ValueError, FileNotFoundError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    pipe.save_pretrained(args.output, safe_serialization=True)
    components = [name for name in ("transformer", "vae", "text_encoder", "tokenizer") if getattr(pipe, name, None) is not None]
    print(f"wrote {args.output} ({', '.join(components)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
