#!/usr/bin/env python
"""Convert the official Infinity checkpoints into a diffusers-format folder that ``InfinityPipeline.from_pretrained`` loads.

Example (Infinity-2B, with flan-t5-xl downloaded beforehand into a local folder):

    python scripts/convert_infinity_original.py \\
        --transformer weights/infinity_2b_reg.pth --vae weights/infinity_vae_d32reg.pth \\
        --text-encoder weights/flan-t5-xl --config infinity-2b --dtype bfloat16 --output infinity-2b-diffusers

Loading is strict: a checkpoint with missing, unexpected or mis-shaped keys stops the conversion (exit status 1) with
every offending key listed on stderr. The logic lives in
``diffusers_var_accel.pipelines.infinity.convert.convert_infinity_original``.
"""

from __future__ import annotations

import argparse
import sys

DTYPES = ("float32", "bfloat16", "float16")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transformer", required=True, help="official transformer .pth (plain state dict) or .safetensors with official keys")
    parser.add_argument("--vae", required=True, help="official VAE .pth (with a 'vae' entry, or plain) or .safetensors")
    parser.add_argument("--text-encoder", default=None, help="local transformers folder of the T5 encoder (e.g. flan-t5-xl); omit to convert without one")
    parser.add_argument("--tokenizer", default=None, help="local tokenizer folder (defaults to --text-encoder)")
    parser.add_argument("--config", default=None, choices=("infinity-2b", "infinity-8b"), help="named config (inferred from the shapes when omitted)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="dtype of the saved weights (default: float32)")
    parser.add_argument("--output", required=True, help="output folder (created)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.tokenizer is not None and args.text_encoder is None:
        print("error: --tokenizer needs --text-encoder", file=sys.stderr)
        return 2

    import torch

    from diffusers_var_accel.pipelines.infinity.convert import convert_infinity_original

    try:
        pipe = convert_infinity_original(
            args.transformer,
            args.vae,
            text_encoder_path=args.text_encoder,
            tokenizer_path=args.tokenizer,
            config=args.config,
            torch_dtype=getattr(torch, args.dtype),
        )
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    pipe.save_pretrained(args.output, safe_serialization=True)
    components = [name for name in ("transformer", "vae", "text_encoder", "tokenizer") if getattr(pipe, name, None) is not None]
    print(f"wrote {args.output} ({', '.join(components)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
