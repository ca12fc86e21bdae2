"""Offline builder of a tiny, random-weight Infinity pipeline (for tests, demos, benchmarks; ``--model tiny``).

**These are random weights.** The transformer, the BSQ VAE and the T5 encoder built here have the exact module tree
of the released models (same classes, fewer and narrower layers), but their weights are drawn from a seeded random
generator: the images they generate are noise-like. The tokenizer is the word-level one of
:mod:`diffusers_var_accel.utils.tiny` (unknown words map to ``<unk>``). Nothing here touches the network.

Examples:
    ```py
    >>> import torch
    >>> from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

    >>> pipe = build_tiny_infinity_pipeline(seed=0)
    >>> image = pipe("a red fox in the snow", height=256, width=256, generator=torch.Generator().manual_seed(0)).images[0]
    >>> image.size
    (256, 256)
    ```
"""

from __future__ import annotations

import torch

from ...models.autoencoder_bsq import InfinityBSQVAE
from ...models.transformer_infinity import InfinityTransformer
from ...utils.tiny import build_tiny_tokenizer, randomize_weights_
from .pipeline_infinity import InfinityPipeline

__all__ = ["build_tiny_infinity_pipeline", "build_tiny_t5"]


def build_tiny_t5(text_channels: int = 32, seed: int = 0, model_max_length: int = 64):
    """A tiny random-weight ``T5EncoderModel`` (flan-t5 layout: gated-GELU FFN) and its word-level tokenizer.

    Args:
        text_channels (`int`, *optional*, defaults to 32): ``d_model``, the width of the features (the transformer's
            ``text_channels``); must be even.
        seed (`int`, *optional*, defaults to 0): the weights are a function of the seed only (the global RNG state
            is left untouched).
        model_max_length (`int`, *optional*, defaults to 64): the tokenizer's ``model_max_length``.

    Returns:
        `(T5EncoderModel, PreTrainedTokenizerFast)`: the encoder (eval mode, float32) and the tokenizer. Random
            weights: the features carry no meaning.
    """
    from transformers import T5Config, T5EncoderModel

    if text_channels < 2 or text_channels % 2:
        raise ValueError(f"text_channels must be an even integer >= 2, got {text_channels}")
    tokenizer = build_tiny_tokenizer(model_max_length)
    num_heads = 2
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=text_channels,
        d_kv=text_channels // num_heads,
        d_ff=2 * text_channels,
        num_layers=2,
        num_decoder_layers=0,
        num_heads=num_heads,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        dropout_rate=0.0,
        feed_forward_proj="gated-gelu",
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_encoder = T5EncoderModel(config)
    return text_encoder.eval(), tokenizer


def build_tiny_infinity_pipeline(
    seed: int = 0,
    depth: int = 2,
    embed_dim: int = 64,
    num_heads: int = 2,
    text_channels: int = 32,
    codebook_dim: int = 8,
    with_text_encoder: bool = True,
    spatial_patchify: bool = False,
) -> InfinityPipeline:
    """An :class:`InfinityPipeline` of tiny random-weight components of the real architectures (noise-like images).

    The transformer is an :class:`InfinityTransformer` with the given numbers (``text_maxlen`` 64); the VAE an
    :class:`InfinityBSQVAE` with ``base_ch`` 32, five levels of multiplier 1, one ResBlock per level and patch size
    16, so every official size (256x256 and up) works. Built in well under a second; a 256x256 image takes a few
    seconds on a CPU. The global RNG state is left untouched.

    Args:
        seed (`int`, *optional*, defaults to 0): all weights are a function of the seed and the numbers below.
        depth (`int`, *optional*, defaults to 2): transformer blocks.
        embed_dim (`int`, *optional*, defaults to 64): transformer width.
        num_heads (`int`, *optional*, defaults to 2): attention heads.
        text_channels (`int`, *optional*, defaults to 32): width of the (tiny T5) text features.
        codebook_dim (`int`, *optional*, defaults to 8): bits per token = VAE latent channels.
        with_text_encoder (`bool`, *optional*, defaults to `True`): include the tiny T5 encoder and tokenizer;
            without them the pipeline runs from ``prompt_embeds`` only.
        spatial_patchify (`bool`, *optional*, defaults to `False`): the Infinity-8B code path: the transformer
            predicts ``4 * codebook_dim`` bits per token (2x2 patches, ``apply_spatial_patchify``) of a patch-8 VAE
            with four levels (the d56 layout, ``codebook_dim`` latent channels); the same pixels per token (16).

    Returns:
        [`InfinityPipeline`]: on the CPU, float32, in eval mode.
    """
    text_maxlen = 64
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = InfinityTransformer(
            depth=depth,
            embed_dim=embed_dim,
            num_heads=num_heads,
            mlp_ratio=4.0,
            text_channels=text_channels,
            text_maxlen=text_maxlen,
            codebook_dim=4 * codebook_dim if spatial_patchify else codebook_dim,
            block_chunks=1,
            apply_spatial_patchify=spatial_patchify,
        )
        levels = 4 if spatial_patchify else 5
        vae = InfinityBSQVAE(
            codebook_dim=codebook_dim,
            base_ch=32,
            encoder_ch_mult=(1,) * levels,
            decoder_ch_mult=(1,) * levels,
            num_res_blocks=1,
            patch_size=8 if spatial_patchify else 16,
        )
    randomize_weights_(transformer, torch.Generator().manual_seed(seed))
    randomize_weights_(vae, torch.Generator().manual_seed(seed + 1))
    text_encoder = tokenizer = None
    if with_text_encoder:
        text_encoder, tokenizer = build_tiny_t5(text_channels, seed=seed + 2, model_max_length=text_maxlen)
    return InfinityPipeline(
        transformer=transformer.eval(), vae=vae.eval(), text_encoder=text_encoder, tokenizer=tokenizer
    )
