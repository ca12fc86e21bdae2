"""Offline builder of a tiny, random-weight HART pipeline (for tests, demos, benchmarks; ``--model tiny-hart``).

**These are random weights**, in the exact module tree of the released model (fewer and narrower layers): the images
are noise-like. The text encoder is a tiny ``Qwen2Model`` with the word-level tokenizer of
:mod:`diffusers_var_accel.utils.tiny`. Nothing here touches the network.
"""

from __future__ import annotations

from typing import Tuple

import torch

from ...models.autoencoder_hart import HARTHybridTokenizer
from ...models.transformer_hart import HARTTransformer
from ...utils.tiny import build_tiny_tokenizer, randomize_weights_
from .pipeline_hart import HARTPipeline

__all__ = ["build_tiny_hart_pipeline", "build_tiny_qwen2"]


def build_tiny_qwen2(hidden_size: int = 32, seed: int = 0, model_max_length: int = 512):
    """A tiny random-weight ``Qwen2Model`` (HART's text encoder family) and the word-level tokenizer.

    Qwen2's own tokenizer is a byte-level BPE that cannot be built offline; the tiny word-level tokenizer stands in
    (pad id 0, right padding), which is all HART's prompt encoding relies on.

    Returns:
        `(Qwen2Model, PreTrainedTokenizerFast)`: the model and the tokenizer, in eval mode, float32. Random weights.
    """
    from transformers import Qwen2Config, Qwen2Model

    if hidden_size < 4 or hidden_size % 4:
        raise ValueError(f"hidden_size must be a multiple of 4, got {hidden_size}")
    tokenizer = build_tiny_tokenizer(model_max_length)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=model_max_length,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_encoder = Qwen2Model(config)
    return text_encoder.eval(), tokenizer


def build_tiny_hart_pipeline(
    seed: int = 0,
    depth: int = 2,
    embed_dim: int = 64,
    num_heads: int = 2,
    context_dim: int = 32,
    context_tokens: int = 16,
    patch_nums: Tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16),
    vocab_size: int = 64,
    token_channels: int = 8,
    tokenizer_ch_mult: Tuple[int, ...] = (1, 1, 2),
    with_text_encoder: bool = True,
):
    """A :class:`~diffusers_var_accel.HARTPipeline` of tiny random-weight components of the real architecture.

    The transformer is a :class:`~diffusers_var_accel.HARTTransformer` (llama blocks, diffusion head of width 32,
    depth 2, 8 steps); the tokenizer a :class:`~diffusers_var_accel.HARTHybridTokenizer` with ``ch`` 32 and
    ``tokenizer_ch_mult`` (default (1, 1, 2): 4x downsampling, 64x64 images for the default last patch number 16).
    ``patch_nums=HART_CONFIGS["hart-0.7b"]["patch_nums"]`` gives the real 14-scale schedule. Random weights:
    noise-like images. The global RNG state is left untouched.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = HARTTransformer(
            depth=depth,
            embed_dim=embed_dim,
            num_heads=num_heads,
            context_tokens=context_tokens,
            context_dim=context_dim,
            patch_nums=tuple(patch_nums),
            vocab_size=vocab_size,
            token_channels=token_channels,
            diffusion_width=32,
            diffusion_depth=2,
            num_sampling_steps="8",
        )
        vae = HARTHybridTokenizer(
            vocab_size=vocab_size,
            z_channels=token_channels,
            ch=32,
            ch_mult=tuple(tokenizer_ch_mult),
            v_patch_nums=tuple(patch_nums),
        )
    randomize_weights_(transformer, torch.Generator().manual_seed(seed))
    randomize_weights_(vae, torch.Generator().manual_seed(seed + 1))
    text_encoder = tokenizer = None
    if with_text_encoder:
        text_encoder, tokenizer = build_tiny_qwen2(context_dim, seed=seed + 2)
        # the text model's own limit is the context length, as the official 300 for HART-0.7B: a pipeline built from
        # these text components alone (encode_prompt without a transformer) pads to the same T
        tokenizer.model_max_length = context_tokens
    return HARTPipeline(transformer=transformer.eval(), vae=vae.eval(), text_encoder=text_encoder, tokenizer=tokenizer)
