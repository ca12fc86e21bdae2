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
        raise FileNotFoundError(f"no HART llm/config.json under {path}: expected the official folder (llm/, tokenizer/) or its llm/")
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
    if (vae.config.vocab_size, vae.config.z_channels) != (transformer.config.vocab_size, transformer.config.token_channels):
        raise ValueError(f"the tokenizer (V={vae.config.vocab_size}, Cv={vae.config.z_channels}) does not match the transformer "
                         f"(V={transformer.config.vocab_size}, Cv={transformer.config.token_channels})")
    return HARTPipeline(transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer)
