"""Offline builders of tiny, random-weight components of the real Infinity architecture (for tests, demos, benchmarks).

**These are random weights.** The transformer, the BSQ VAE and the T5 encoder built here have the exact module tree
of the released models (same classes, fewer and narrower layers), but their weights are drawn from a seeded random
generator: the images they generate are noise-like. They exist so that the whole pipeline (text encoding, the
next-scale loop, decoding, ``save_pretrained`` / ``from_pretrained``) can be exercised on a CPU in seconds, without a
download, until a trained embedded model exists. Nothing here touches the network.

The tokenizer is a word-level tokenizer over a small fixed English vocabulary (:data:`TINY_VOCABULARY`), built with
the ``tokenizers`` library: text is NFKC-normalised and lower-cased, split on whitespace and punctuation, and ``</s>``
is appended as T5 does. **Any word that is not in the vocabulary maps to ``<unk>``** (id 2), so two prompts that
differ only in unknown words encode identically. Ids: ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2.

Examples:
    ```py
    >>> import torch
    >>> from diffusers_var_accel.utils.tiny import build_tiny_infinity_pipeline

    >>> pipe = build_tiny_infinity_pipeline(seed=0)
    >>> image = pipe("a red fox in the snow", height=256, width=256, generator=torch.Generator().manual_seed(0)).images[0]
    >>> image.size
    (256, 256)
    ```
"""

from __future__ import annotations

import math
from typing import Tuple

import torch
from torch import nn

from ..models.autoencoder_bsq import InfinityBSQVAE
from ..models.transformer_infinity import InfinityTransformer
from ..pipelines.infinity.pipeline_infinity import InfinityPipeline

__all__ = ["TINY_VOCABULARY", "build_tiny_infinity_pipeline", "build_tiny_t5", "build_tiny_tokenizer", "randomize_weights_"]

#: The special tokens of the tiny tokenizer, in id order (T5's ids: pad 0, eos 1, unk 2).
TINY_SPECIAL_TOKENS: Tuple[str, ...] = ("<pad>", "</s>", "<unk>")

#: The fixed word list of the tiny tokenizer (ids 3, 4, ... in this order). Other words map to ``<unk>``.
TINY_VOCABULARY: Tuple[str, ...] = tuple(
    """
    , . ! ? ' - : ; ( ) " &
    a an the of in on at with and or by from to into over under above below near behind beside between through
    is are was be being its his her their this that these those it he she they we you i my your our
    one two three four five many few some several lots all each every no not very
    red orange yellow green blue purple pink brown black white gray grey gold golden silver dark light bright pale
    colorful vivid neon pastel warm cool
    big small large tiny huge little tall short long wide old young new ancient modern futuristic
    beautiful cute happy sad angry calm quiet busy empty cozy
    cat cats dog dogs fox bird birds fish horse cow sheep lion tiger bear rabbit owl eagle dragon robot
    man woman boy girl child children person people astronaut king queen knight wizard
    tree trees flower flowers grass forest mountain mountains river lake sea ocean beach island desert field garden
    sky cloud clouds sun moon star stars rain snow fog storm night day sunset sunrise morning evening winter summer
    spring autumn
    house houses castle city street road bridge tower building room kitchen window door table chair bed car
    cars train boat ship plane bicycle book cup bottle lamp clock
    apple apples banana bread cake coffee tea pizza
    water fire ice stone wood glass metal paper
    sitting standing running walking flying swimming sleeping eating reading playing holding wearing looking
    painting photo photograph picture portrait landscape illustration drawing sketch render poster
    style art oil watercolor digital cinematic realistic detailed high quality 4k 8k hd lighting shadow
    background foreground close up view top side front
    """.split()
)


# ---------------------------------------------------------------------------------------------------------------------
# weights
# ---------------------------------------------------------------------------------------------------------------------
def randomize_weights_(module: nn.Module, generator: torch.Generator) -> nn.Module:
    """Overwrite every parameter of ``module`` in place with seeded random values that keep activations in range.

    Weights of rank >= 2 are ``N(0, 1 / fan_in)`` (``fan_in`` = elements of one output row: input features, or
    ``in_channels * kh * kw`` for a convolution); 1-D ``*weight`` parameters (norm gains) are ``1 + N(0, 0.05^2)``;
    other 1-D parameters (biases) ``N(0, 0.02^2)``. Infinity's special parameters get the official scales, all
    non-zero: ``scale_mul_1H11 = log(4) + N(0, 0.1^2)``, ``ada_gss`` and ``pos_start`` ``N(0, 1 / C)`` and
    ``N(0, 1 / (3C))``, ``cfg_uncond`` ``N(0, 1)`` (T5-feature scale). Buffers (e.g. the all-zero key biases) are
    left alone. Parameters are visited in ``named_parameters`` order, so a seed always gives the same weights.
    """
    with torch.no_grad():
        for name, param in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            shape, C = param.shape, param.shape[-1]
            noise = torch.randn(shape, generator=generator, dtype=torch.float32)
            if leaf == "scale_mul_1H11":
                value = math.log(4.0) + 0.1 * noise
            elif leaf == "ada_gss":
                value = noise / math.sqrt(C)
            elif leaf == "pos_start":
                value = noise / math.sqrt(3 * C)
            elif leaf == "cfg_uncond":
                value = noise
            elif param.ndim >= 2:
                value = noise / math.sqrt(param[0].numel())
            elif leaf.endswith("weight"):
                value = 1.0 + 0.05 * noise
            else:
                value = 0.02 * noise
            param.copy_(value.to(param.dtype))
    return module


# ---------------------------------------------------------------------------------------------------------------------
# text encoder
# ---------------------------------------------------------------------------------------------------------------------
def build_tiny_tokenizer(model_max_length: int = 64):
    """A T5-like word-level tokenizer over :data:`TINY_VOCABULARY`, as a ``transformers`` fast tokenizer.

    Lower-cases, splits on whitespace and punctuation, appends ``</s>``; unknown words become ``<unk>``. It saves with
    ``save_pretrained`` and loads back offline with ``AutoTokenizer.from_pretrained(folder)``.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(TINY_SPECIAL_TOKENS)}
    for word in TINY_VOCABULARY:
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    eos_id = vocab["</s>"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", eos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=model_max_length,
        padding_side="right",
    )


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


# ---------------------------------------------------------------------------------------------------------------------
# pipeline
# ---------------------------------------------------------------------------------------------------------------------
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
    return InfinityPipeline(transformer=transformer.eval(), vae=vae.eval(), text_encoder=text_encoder, tokenizer=tokenizer)


# ---------------------------------------------------------------------------------------------------------------------
# HART
# ---------------------------------------------------------------------------------------------------------------------
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
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=model_max_length,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
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
    from ..models.autoencoder_hart import HARTHybridTokenizer
    from ..models.transformer_hart import HARTTransformer
    from ..pipelines.hart.pipeline_hart import HARTPipeline

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = HARTTransformer(
            depth=depth, embed_dim=embed_dim, num_heads=num_heads, context_tokens=context_tokens, context_dim=context_dim,
            patch_nums=tuple(patch_nums), vocab_size=vocab_size, token_channels=token_channels, diffusion_width=32,
            diffusion_depth=2, num_sampling_steps="8",
        )
        vae = HARTHybridTokenizer(vocab_size=vocab_size, z_channels=token_channels, ch=32, ch_mult=tuple(tokenizer_ch_mult),
                                  v_patch_nums=tuple(patch_nums))
    randomize_weights_(transformer, torch.Generator().manual_seed(seed))
    randomize_weights_(vae, torch.Generator().manual_seed(seed + 1))
    text_encoder = tokenizer = None
    if with_text_encoder:
        text_encoder, tokenizer = build_tiny_qwen2(context_dim, seed=seed + 2)
        # the text model's own limit is the context length, as the official 300 for HART-0.7B: a pipeline built from
        # these text components alone (encode_prompt without a transformer) pads to the same T
        tokenizer.model_max_length = context_tokens
    return HARTPipeline(transformer=transformer.eval(), vae=vae.eval(), text_encoder=text_encoder, tokenizer=tokenizer)
