"""Official HART checkpoint folders -> :class:`HARTPipeline` (and a diffusers-format folder via ``save_pretrained``).

The released layout (``hart-0.7b-1024px/``)::

    llm/config.json            HARTForT2IConfig
    llm/ema_model.bin          EMA weights (what the official scripts generate with), torch.save'd state dict
    llm/model.safetensors      main weights (same keys)
    tokenizer/config.json      HARTAutoEncoderWithDiscConfig
    tokenizer/model.safetensors  vae.* (+ disc.*, ignored)

The text encoder (Qwen2, ``mit-han-lab/Qwen2-VL-1.5B-Instruct`` for 0.7B) is not part of the folder; pass it (and
its tokenizer) when you have them locally, or generate from ``prompt_embeds``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Optional, Union

import torch

from ...models.autoencoder_hart import HARTHybridTokenizer
from ...models.transformer_hart import HARTTransformer
from .pipeline_hart import HARTPipeline


def resolve_hart_folders(path: Union[str, os.PathLike]):
    """``(llm_dir, tokenizer_dir)`` of an official folder: its root, or its ``llm/`` folder (as the official
    ``--model_path``). The tokenizer is ``config.vae_path`` when set, else ``tokenizer/`` beside ``llm/``."""
    path = Path(path)
    llm = path / "llm" if (path / "llm" / "config.json").is_file() else path
    if not (llm / "config.json").is_file():
        raise FileNotFoundError(
            f"no HART llm/config.json under {path}: expected the official folder (llm/, tokenizer/) or its llm/"
        )
    vae_path = json.loads((llm / "config.json").read_text()).get("vae_path")
    tokenizer = Path(vae_path) if vae_path else llm.parent / "tokenizer"
    if not (tokenizer / "config.json").is_file():
        raise FileNotFoundError(f"HART tokenizer folder not found at {tokenizer} (config.vae_path={vae_path!r})")
    return llm, tokenizer


def load_original_hart_pipeline(
    path: Union[str, os.PathLike],
    use_ema: bool = True,
    torch_dtype: Optional[torch.dtype] = None,
    text_encoder=None,
    tokenizer=None,
) -> HARTPipeline:
    """Build a :class:`HARTPipeline` from an official folder, loading every weight strictly.

    Args:
        path: the official folder (with ``llm/`` and ``tokenizer/``) or its ``llm/`` folder.
        use_ema: use ``ema_model.bin`` (the official default) rather than the main weights.
        torch_dtype: dtype of the transformer and tokenizer weights (fp32 by default).
        text_encoder / tokenizer: an optional Qwen2 model and its tokenizer.
    """
    llm, tok = resolve_hart_folders(path)
    transformer = HARTTransformer.from_original_checkpoint(llm, use_ema=use_ema, torch_dtype=torch_dtype)
    vae = HARTHybridTokenizer.from_original_folder(tok, torch_dtype=torch_dtype)
    if (vae.config.vocab_size, vae.config.z_channels) != (
        transformer.config.vocab_size,
        transformer.config.token_channels,
    ):
        raise ValueError(
            f"the tokenizer (V={vae.config.vocab_size}, Cv={vae.config.z_channels}) does not match the transformer "
            f"(V={transformer.config.vocab_size}, Cv={transformer.config.token_channels})"
        )
    return HARTPipeline(transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer)


# ---------------------------------------------------------------------------------------------------------------------
# the command line: ``var-accel convert hart`` (the shared options and the saving are the CLI's)
# ---------------------------------------------------------------------------------------------------------------------
def add_convert_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``var-accel convert hart``: the official folder and which of its weights."""
    parser.add_argument(
        "--checkpoint", required=True, help="official HART folder (with llm/ and tokenizer/) or its llm/ folder"
    )
    parser.add_argument("--no-ema", action="store_true", help="use the main weights instead of llm/ema_model.bin")


def _load_local_tokenizer(folder: str):
    """The tokenizer class named by the folder's ``tokenizer_config.json`` (else ``AutoTokenizer``), offline."""
    import transformers

    config = Path(folder) / "tokenizer_config.json"
    name = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    cls = getattr(transformers, name, None) if name else None
    return (cls or transformers.AutoTokenizer).from_pretrained(folder, local_files_only=True)


def convert_from_arguments(args: argparse.Namespace, torch_dtype: torch.dtype) -> HARTPipeline:
    """``var-accel convert hart``: the pipeline of ``args.checkpoint`` (+ the Qwen2 ``args.text_encoder``)."""
    if not Path(args.checkpoint).is_dir():
        raise FileNotFoundError(
            f"--checkpoint {args.checkpoint}: not a folder; give the official HART folder "
            "(hart-0.7b-1024px/ with llm/config.json and tokenizer/) or its llm/ folder"
        )
    text_encoder = tokenizer = None
    if args.text_encoder is not None:
        from transformers import AutoModel

        text_encoder = AutoModel.from_pretrained(args.text_encoder, torch_dtype=torch_dtype, local_files_only=True)
        tokenizer = _load_local_tokenizer(args.tokenizer or args.text_encoder)
    return load_original_hart_pipeline(
        args.checkpoint,
        use_ema=not args.no_ema,
        torch_dtype=torch_dtype,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
    )


#: The ``var-accel convert hart`` sub-command (registered as the family's ``converter``).
