"""Infinity's part of the FLOP meter (:mod:`diffusers_var_accel.lab.bench.flop_meter`): the released models' specs,
how :class:`~diffusers_var_accel.pipelines.infinity.InfinityPipeline` drives a generation, which step counts towards
which part, the flan-t5-xl encoder's count, the papers' numbers and the report of ``var-accel flops --model
infinity-...``.

A generation: ``encode_condition`` on the text features (the prompt rows, then ``cfg_uncond`` rows under CFG),
:func:`~diffusers_var_accel.next_scale.run_next_scale_loop` with an :class:`InfinityScaleFamily` (teacher tokens
replace the sampling), then ``vae.decode`` of the summed codes.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from diffusers_var_accel.models.autoencoder_bsq import (
    INFINITY_VAE_D32_CONFIG,
    INFINITY_VAE_D56_PATCHIFY_CONFIG,
    InfinityBSQVAE,
)
from diffusers_var_accel.models.infinity_resolutions import rope_grid_hw, schedule_for_size
from diffusers_var_accel.models.transformer_infinity import INFINITY_CONFIGS, InfinityTransformer
from diffusers_var_accel.next_scale import run_next_scale_loop
from diffusers_var_accel.schedulers.specs import load_acceleration
from diffusers_var_accel.lab.bench.flop_meter import (
    convention_lines,
    FamilyFlops,
    GenerationRun,
    add_tflops,
    attend_to_current_pass,
    build_on_meta,
    compare_methods,
    make_flop_counter,
    meter_generation,
    per_scale_lines,
    sublayer_flops,
)
from diffusers_var_accel.pipelines.infinity.pipeline_infinity import InfinityScaleFamily, check_token_layout

__all__ = [
    "DEFAULT_TEXT_TOKENS",
    "DEFAULT_GUIDANCE_SCALE",
    "INFINITY_VAE_D14_PATCHIFY_CONFIG",
    "InfinityFlopSpec",
    "MODEL_SPECS",
    "PAPER_REFERENCES",
    "PAPER_METHOD_TFLOPS",
    "FLAN_T5_XL_ENCODER_CONFIG",
    "SELF_ATTENTION_KEYS",
    "INFINITY_FLOPS",
    "infinity_generation",
    "count_infinity_flops",
    "count_t5_encoder_flops",
    "flops_components",
    "PADDED_TEXT_TOKENS",
    "infinity_conventions",
    "infinity_gap_to_paper",
    "infinity_per_scale_conventions",
    "format_infinity_conventions",
    "count_infinity_conventions",
    "format_report",
    "format_comparison",
]

#: Default text length: a typical prompt of ~25 words is ~32 flan-t5 tokens. The count depends on it only through the
#: text projections (once per call) and the cross-attention K/V projections and QK^T/PV (every block, every scale).
DEFAULT_TEXT_TOKENS = 32

#: Guidance value used for the CFG count (any value != 1 gives the same FLOPs); 1.0 disables CFG.
DEFAULT_GUIDANCE_SCALE = 4.0

#: The 8B model's VAE (``infinity_vae_d56_f8_14_patchify.pth``): codebook_dim 14, patch 8, ch_mult [1, 2, 4, 4]. A
#: transformer token is a 2x2 patch of 14-bit latents (56 bits, "d56"); the 8B transformer config sets
#: ``apply_spatial_patchify``, so the loop runs the real 8B path (codes on the VAE latent, decoded as they are).
INFINITY_VAE_D14_PATCHIFY_CONFIG: Dict[str, Any] = INFINITY_VAE_D56_PATCHIFY_CONFIG


@dataclass(frozen=True)
class InfinityFlopSpec:
    """The transformer config, the decoding VAE config and whether tokens are 2x2 patches of the VAE latent."""

    transformer: Dict[str, Any]
    vae: Dict[str, Any]
    spatial_patchify: bool


MODEL_SPECS: Dict[str, InfinityFlopSpec] = {
    "infinity-2b": InfinityFlopSpec(INFINITY_CONFIGS["infinity-2b"], INFINITY_VAE_D32_CONFIG, spatial_patchify=False),
    "infinity-8b": InfinityFlopSpec(
        INFINITY_CONFIGS["infinity-8b"], INFINITY_VAE_D14_PATCHIFY_CONFIG, spatial_patchify=True
    ),
}

#: Published totals of the unaccelerated model, keyed by (model, height, width).
PAPER_REFERENCES: Dict[Tuple[str, int, int], Tuple[str, float]] = {
    ("infinity-2b", 1024, 1024): ("LazyVAR (CVPR 2026), Infinity-2B 1024x1024 baseline", 101.58),
}

#: Published TFLOPs of accelerated Infinity-2B at 1024x1024 (LazyVAR paper's table; baseline 101.58).
PAPER_METHOD_TFLOPS = {("infinity-2b", 1024, 1024): {"fastvar": 44.15, "lazyvar": 34.32}}

#: flan-t5-xl encoder (Infinity's text encoder), for the optional T5 count.
FLAN_T5_XL_ENCODER_CONFIG: Dict[str, Any] = dict(
    vocab_size=32128,
    d_model=2048,
    d_kv=64,
    d_ff=5120,
    num_layers=24,
    num_heads=32,
    feed_forward_proj="gated-gelu",
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
    is_encoder_decoder=False,
    use_cache=False,
)

#: ``count_infinity_flops(self_attention=...)``: ``"cache"`` (the real model: attend to the KV cache of all earlier
#: scales plus the current pass) or ``"current_pass"`` (a counting convention: only the current pass's keys).
SELF_ATTENTION_KEYS = ("cache", "current_pass")

_BLOCK_MODULE = re.compile(r"(?:^|\.)blocks\.\d+\.(sa|ca|ffn)(?:\.(\w+))?$")
_TERA = 1e12


# ---------------------------------------------------------------------------------------------------------------------
# the generation and its parts
# ---------------------------------------------------------------------------------------------------------------------
class _CountedInfinityFamily(InfinityScaleFamily):
    """Infinity's loop steps, unchanged but for one device move: with meta models the loop's code bookkeeping runs on
    small real tensors (see :func:`infinity_generation`), and the transformer takes its inputs on its own device."""

    def embed_inputs(self, inputs_BLd, scale_index_L):
        device = self.transformer.word_embed.weight.device
        return super().embed_inputs(inputs_BLd.to(device), scale_index_L.to(device))


def infinity_generation(
    transformer: InfinityTransformer,
    vae: InfinityBSQVAE,
    scale_schedule: Sequence[Tuple[int, ...]],
    grid_hw: Tuple[int, int],
    cfg: bool = True,
    batch_size: int = 1,
    text_tokens: Optional[int] = None,
    decode_vae: Optional[InfinityBSQVAE] = None,
    spatial_patchify: bool = False,
    scheduler=None,
    kv_cache_dtype: Optional[str] = None,
) -> GenerationRun:
    """One generation as ``InfinityPipeline`` runs it (``count_generation_flops(transformer, vae, ...)`` counts it).

    Args:
        transformer / vae: the models; ``vae`` supplies the code bookkeeping of the loop (its ``codebook_dim`` must fit
            the transformer's bits per token: equal, or a quarter with ``apply_spatial_patchify``) and, unless
            ``decode_vae`` is given, the decoder.
        scale_schedule / grid_hw: the ``(1, h, w)`` schedule and its RoPE grid (``schedule_for_size``, ``rope_grid_hw``).
        cfg: classifier-free guidance (2B rows: conditional + learned unconditional text) or not (B rows).
        batch_size: images B.
        text_tokens: T5 tokens per prompt (the unconditional rows use as many ``cfg_uncond`` rows, as the pipeline);
            ``None``: {DEFAULT_TEXT_TOKENS} (a typical prompt), at most the model's ``text_maxlen`` (the embedded
            model's text is shorter).
        decode_vae: a different decoder (default: ``vae``).
        spatial_patchify: must equal the transformer's ``apply_spatial_patchify`` (kept for callers that state it; the
            loop reads the token layout from the transformer config).
        scheduler: an acceleration scheduler (``None``: the baseline).
        kv_cache_dtype: the KV cache's storage form (``"int8"``; ``None``: the attention's dtype), as the loop takes it.
    """
    device = transformer.pos_start.device
    if text_tokens is None:  # the model in hand decides: a typical prompt, capped by the text it takes
        text_tokens = min(DEFAULT_TEXT_TOKENS, transformer.config.text_maxlen)
    decode_vae = vae if decode_vae is None else decode_vae
    D, d = transformer.config.text_channels, transformer.config.codebook_dim
    check_token_layout(transformer, vae)
    if bool(spatial_patchify) != (transformer.token_patch_size != 1):
        raise ValueError(
            f"spatial_patchify={spatial_patchify} but the transformer has apply_spatial_patchify="
            f"{transformer.token_patch_size != 1}"
        )
    num_scales = len(scale_schedule)
    guidance = [DEFAULT_GUIDANCE_SCALE if cfg else 1.0] * num_scales
    B = batch_size
    family = _CountedInfinityFamily(transformer, vae, scale_schedule, grid_hw, top_k=900, top_p=0.97)

    def encode():
        # As InfinityPipeline.__call__: prompt rows, then cfg_uncond[:T] rows under CFG. (A full attention mask is
        # turned into ``None`` by encode_condition; padding would not change the FLOPs.)
        text_BTD = torch.zeros(B, text_tokens, D, device=device)
        if cfg:
            text_BTD = torch.cat(
                (text_BTD, transformer.null_text_embeds(torch.ones(B, text_tokens, dtype=torch.bool)))
            )
        return transformer.encode_condition(text_BTD, None)

    def loop(condition, on_scale_end):
        # Sampling replaced by teacher tokens (all zero bits).
        teacher = [torch.zeros(B, 1, s[-2], s[-1], d, device=device) for s in scale_schedule]
        return run_next_scale_loop(
            family,
            condition,
            scale_schedule,
            B,
            guidance,
            [0.5] * num_scales,
            scheduler=scheduler,
            teacher_tokens=teacher,
            on_scale_end=on_scale_end,
            kv_cache_dtype=kv_cache_dtype,
        )

    def decode(state):
        return decode_vae.decode(state.f_hat.to(decode_vae.device, decode_vae.dtype))  # the VAE latent (un-patchified)

    sides = [(int(s[-2]), int(s[-1])) for s in scale_schedule]
    return GenerationRun(
        steps=family,
        encode=encode,
        loop=loop,
        decode=decode,
        rows=2 * B if cfg else B,
        scales=[dict(h=h, w=w, tokens=h * w) for h, w in sides],
        kv_tokens=[h * w for h, w in sides],
    )


def _sublayers(flop_counts: Dict[str, Dict[Any, int]]) -> Dict[str, int]:
    """The blocks' sublayers (self-attention, cross-attention, FFN), summed over blocks."""
    per = sublayer_flops(flop_counts, _BLOCK_MODULE)
    sa, ca, ffn = per[("sa", None)], per[("ca", None)], per[("ffn", None)]
    ca_q_out = per[("ca", "mat_q")]["linear"] + per[("ca", "proj")]["linear"]
    return {
        "self_attn_qkv_proj": sa["linear"],
        "self_attn_core": sa["attention"],
        "cross_attn_q_proj": ca_q_out,
        "cross_attn_text_kv": ca["linear"] - ca_q_out,
        "cross_attn_core": ca["attention"],
        "ffn": ffn["linear"] + ffn["attention"],
    }


# ---------------------------------------------------------------------------------------------------------------------
# named models
# ---------------------------------------------------------------------------------------------------------------------
def count_infinity_flops(
    model_name: str = "infinity-2b",
    height: int = 1024,
    width: int = 1024,
    cfg: bool = True,
    batch_size: int = 1,
    text_tokens: int = DEFAULT_TEXT_TOKENS,
    accel: Optional[str] = None,
    self_attention: str = "cache",
) -> Dict[str, Any]:
    """FLOPs of one generation of ``batch_size`` images with a released Infinity model, on meta tensors.

    ``accel`` is an acceleration spec for :func:`~diffusers_var_accel.schedulers.scheduling_var_base.load_acceleration`
    (``None``/``"baseline"``, ``"fastvar"``, ``"lazyvar"``, ``"fastvar:skip_last_scales=false"``, a config folder).
    ``self_attention="current_pass"`` counts under a convention that drops the attention to the cached prefix
    (:func:`~diffusers_var_accel.lab.bench.flop_meter.attend_to_current_pass`); the default ``"cache"`` is the real
    model.

    Returns the dict of :func:`~diffusers_var_accel.lab.bench.flops.count_generation_flops` plus TFLOPs fields
    (``total_tflops``, ``transformer_tflops``, ``vae_tflops``, ``text_tflops``; ``tflops`` and ``percent`` in every
    ``per_scale`` entry), the arguments, and ``reference`` (a published total for this model and size, with our ratio
    to it, or ``None``).

    Raises:
        ValueError: unknown model, or a size that is not an official Infinity resolution (the message lists them).
    """
    if model_name not in MODEL_SPECS:
        raise ValueError(f"unknown model {model_name!r}; choose one of {sorted(MODEL_SPECS)}")
    if self_attention not in SELF_ATTENTION_KEYS:
        raise ValueError(f"self_attention must be one of {SELF_ATTENTION_KEYS}, got {self_attention!r}")
    if batch_size < 1 or text_tokens < 1:
        raise ValueError(f"batch_size and text_tokens must be >= 1, got {batch_size} and {text_tokens}")
    schedule, template = schedule_for_size(height, width)
    spec = MODEL_SPECS[model_name]
    transformer = build_on_meta(InfinityTransformer, **spec.transformer)
    if self_attention == "current_pass":
        attend_to_current_pass(transformer)
    vae = build_on_meta(InfinityBSQVAE, **spec.vae)
    scheduler = load_acceleration(accel, "infinity")
    run = infinity_generation(
        transformer,
        vae,
        schedule,
        rope_grid_hw(template),
        cfg=cfg,
        batch_size=batch_size,
        text_tokens=text_tokens,
        spatial_patchify=spec.spatial_patchify,
        scheduler=scheduler,
    )
    result = add_tflops(meter_generation(INFINITY_FLOPS, run), INFINITY_FLOPS, accel)
    reference = PAPER_REFERENCES.get((model_name, height, width))
    result.update(
        model=model_name,
        height=height,
        width=width,
        cfg=cfg,
        batch_size=batch_size,
        text_tokens=text_tokens,
        scale_schedule=[[int(s[-2]), int(s[-1])] for s in schedule],
        total_macs_tera=result["total_flops"] / 2 / _TERA,
        counting="torch.utils.flop_counter.FlopCounterMode on meta tensors: FLOPs = 2 x MACs of matmul/linear/conv/"
        "attention; element-wise ops not counted; T5 encoder not included",
        vae_note=(
            "8B: official VAE infinity_vae_d56_f8_14_patchify (codebook_dim 14, patch 8, ch_mult [1,2,4,4]) decoding "
            "the un-patchified summed codes (B, 14, 2h, 2w)"
            if spec.spatial_patchify
            else "released d32 VAE (INFINITY_VAE_D32_CONFIG)"
        ),
        reference=None
        if reference is None
        else dict(source=reference[0], total_tflops=reference[1], ratio=result["total_flops"] / _TERA / reference[1]),
    )
    return result


@torch.no_grad()
def count_t5_encoder_flops(num_tokens: int, batch_size: int = 1) -> int:
    """FLOPs of the flan-t5-xl encoder on ``batch_size`` prompts of ``num_tokens`` tokens (meta tensors).

    The official runner pads every prompt to 512 tokens before T5 (and keeps only the real tokens afterwards); our
    pipeline pads to the longest prompt. Only the prompts go through T5 (the unconditional rows are learned).
    """
    from transformers import T5Config, T5EncoderModel

    with torch.device("meta"):
        model = T5EncoderModel(T5Config(**FLAN_T5_XL_ENCODER_CONFIG)).eval()
        ids = torch.zeros(batch_size, num_tokens, dtype=torch.long)
    with make_flop_counter() as mode:
        model(input_ids=ids)
    return mode.get_total_flops()


def flops_components(
    model_name: str = "infinity-2b",
    height: int = 1024,
    width: int = 1024,
    accel: Optional[str] = None,
    cfg: bool = True,
    text_tokens: int = DEFAULT_TEXT_TOKENS,
    batch_size: int = 1,
) -> Dict[str, Any]:
    """TFLOPs of one generation split into the parts that FLOPs-counting conventions treat differently.

    Counts twice (``self_attention="cache"``, the real model, and ``"current_pass"``) and returns, in TFLOPs:
    ``linear`` (every counted op of the transformer and the text conditioning that is not an attention kernel:
    projections, FFN, head, input embedding), ``self_attn_cache`` (QK^T and PV over the KV cache of the earlier scales
    plus the current pass), ``self_attn_current_pass`` (the same over the current pass's keys only),
    ``cross_attn_core`` (QK^T and PV over the text), ``vae_decode`` (convolutions; the VAE has no attention),
    ``total`` (the real count: linear + self_attn_cache + cross_attn_core + vae_decode), ``text`` (the text
    conditioning, part of ``linear``), ``transformer`` (the real count of the transformer alone), ``text_kv`` (every
    block's cross-attention text K/V projection of one pass: our runtime runs it once per call, the official code in
    every pass), ``passes`` (transformer passes run: skipped scales run none, a grouped pass counts once) and
    ``per_scale`` (scale_index, h, w, tokens, ``tflops``: the real count, ``attention``: its attention kernels,
    ``current_pass``: the count under that convention). Every part is exact for the counted shapes; a convention is
    a sum of parts (e.g. "attention kernels not counted" = linear + vae_decode).
    """
    counted = dict(cfg=cfg, batch_size=batch_size, text_tokens=text_tokens, accel=accel)
    real = count_infinity_flops(model_name, height, width, **counted)
    local = count_infinity_flops(model_name, height, width, self_attention="current_pass", **counted)
    ca = real["transformer_breakdown_tflops"]["cross_attn_core"]
    return dict(
        accel=real["accel"],
        cfg=cfg,
        text_tokens=text_tokens,
        linear=real["transformer_tflops"] - real["attention_core_tflops"] + real["text_tflops"],
        self_attn_cache=real["attention_core_tflops"] - ca,
        self_attn_current_pass=local["attention_core_tflops"]
        - local["transformer_breakdown_tflops"]["cross_attn_core"],
        cross_attn_core=ca,
        vae_decode=real["vae_tflops"],
        total=real["total_tflops"],
        text=real["text_tflops"],
        transformer=real["transformer_tflops"],
        text_kv=real["transformer_breakdown_tflops"]["cross_attn_text_kv"],
        passes=sum(1 for s in real["per_scale"] if s["flops"] > 0),
        per_scale=[
            dict(
                scale_index=s["scale_index"],
                h=s["h"],
                w=s["w"],
                tokens=s["tokens"],
                tflops=s["tflops"],
                attention=s["attention_flops"] / _TERA,
                current_pass=t["tflops"],
            )
            for s, t in zip(real["per_scale"], local["per_scale"])
        ],
    )


# ---------------------------------------------------------------------------------------------------------------------
# counting conventions (docs/flops.md, "Accelerated presets": the papers' numbers and how they may have been counted)
# ---------------------------------------------------------------------------------------------------------------------
#: The length the official runner pads every prompt to before T5 (``--conventions``' padded-text rows count the
#: cross-attention over that many tokens and the T5 encoder on it).
PADDED_TEXT_TOKENS = 512

_Components = Dict[str, Dict[str, Any]]


def _real(c: Dict[str, Any]) -> float:
    return c["total"]


def _current_pass(c: Dict[str, Any]) -> float:
    """(a): self-attention within the current pass only (cross-attention and everything else as counted)."""
    return c["linear"] + c["self_attn_current_pass"] + c["cross_attn_core"] + c["vae_decode"]


def _no_attention(c: Dict[str, Any]) -> float:
    """(a'): no attention kernel counted: linear layers and the decoder's convolutions."""
    return c["linear"] + c["vae_decode"]


def _per_pass_text_kv(c: Dict[str, Any]) -> float:
    """What the official code adds by recomputing every block's text K/V in every pass: (passes - 1) x one pass's."""
    return (c["passes"] - 1) * c["text_kv"]


def infinity_conventions(
    components: _Components, padded_text: _Components, no_cfg: _Components, t5_tflops: Dict[int, float]
) -> List[Dict[str, Any]]:
    """Totals of every method under the candidate counting conventions, from :func:`flops_components` results.

    ``components``, ``padded_text`` and ``no_cfg`` map method names (``"baseline"`` first) to their components with
    CFG at the default text length, with CFG at :data:`PADDED_TEXT_TOKENS` and without CFG; ``t5_tflops`` maps rows
    (1: the prompt, 2: also an encoded negative prompt) to the flan-t5-xl encoder's TFLOPs on
    :data:`PADDED_TEXT_TOKENS` tokens. Each row has ``key``, ``convention``, ``totals`` (method -> TFLOPs),
    ``ratios`` (baseline / method) and ``saved`` (baseline - method).
    """
    tokens, padded = components["baseline"]["text_tokens"], PADDED_TEXT_TOKENS
    t5_1, t5_2 = t5_tflops[1], t5_tflops[2]
    rules = [
        (
            "real",
            f"real count: attention over the KV cache, VAE decode, {tokens} text tokens",
            lambda c, p, n: _real(c),
        ),
        ("b", "(b) same, VAE decode excluded", lambda c, p, n: c["total"] - c["vae_decode"]),
        ("a", "(a) self-attention within the current pass only", lambda c, p, n: _current_pass(c)),
        ("a+b", "(a) + (b) VAE decode excluded", lambda c, p, n: _current_pass(c) - c["vae_decode"]),
        ("a'", "(a') attention kernels not counted (linear + conv only)", lambda c, p, n: _no_attention(c)),
        ("a'+b", "(a') + (b) VAE decode excluded", lambda c, p, n: c["linear"]),
        ("a'+t5", "(a') + (c) T5 encoder, 1 row", lambda c, p, n: _no_attention(c) + t5_1),
        (
            "a'+padded",
            f"(a') + cross-attention over {padded} (padded) text tokens",
            lambda c, p, n: _no_attention(p),
        ),
        ("a'+padded+t5", f"(a') + {padded} text tokens + (c) T5, 1 row", lambda c, p, n: _no_attention(p) + t5_1),
        ("a'+padded+t5x2", f"(a') + {padded} text tokens + (c) T5, 2 rows", lambda c, p, n: _no_attention(p) + t5_2),
        ("a+padded+t5x2", f"(a) + {padded} text tokens + (c) T5, 2 rows", lambda c, p, n: _current_pass(p) + t5_2),
        ("real+padded", f"real attention + {padded} text tokens", lambda c, p, n: _real(p)),
        (
            "real+padded+t5x2",
            f"real attention + {padded} text tokens + (c) T5, 2 rows",
            lambda c, p, n: _real(p) + t5_2,
        ),
        ("no_cfg", "no CFG (1 row), real attention", lambda c, p, n: _real(n)),
        ("no_cfg+a", "no CFG (1 row), (a)", lambda c, p, n: _current_pass(n)),
        ("macs", "real count in MACs", lambda c, p, n: _real(c) / 2),
        (
            "a'+kv",
            "(a') with the text K/V recomputed in every pass (official code)",
            lambda c, p, n: _no_attention(c) + _per_pass_text_kv(c),
        ),
        (
            "a'+kv+padded+t5",
            f"(a') + per-pass text K/V + {padded} text tokens + (c) T5, 1 row",
            lambda c, p, n: _no_attention(p) + _per_pass_text_kv(p) + t5_1,
        ),
        (
            "a'+kv+padded+t5x2",
            f"(a') + per-pass text K/V + {padded} text tokens + (c) T5, 2 rows",
            lambda c, p, n: _no_attention(p) + _per_pass_text_kv(p) + t5_2,
        ),
    ]
    rows = []
    for key, label, rule in rules:
        totals = {m: rule(components[m], padded_text[m], no_cfg[m]) for m in components}
        rows.append(
            dict(
                key=key,
                convention=label,
                totals=totals,
                ratios={m: totals["baseline"] / t for m, t in totals.items()},
                saved={m: totals["baseline"] - t for m, t in totals.items()},
            )
        )
    return rows


def infinity_gap_to_paper(
    baseline: Dict[str, Any], padded_text: Dict[str, Any], no_cfg: Dict[str, Any], t5_tflops: Dict[int, float]
) -> List[Dict[str, Any]]:
    """The baseline's total with one assumption changed per row (docs/flops.md, "Gap to the paper's 101.58 TFLOPs"),
    from the baseline's :func:`flops_components` with CFG, with CFG at :data:`PADDED_TEXT_TOKENS` and without CFG.
    Each row has ``key``, ``convention`` and ``tflops``."""
    c = baseline
    attention = c["self_attn_cache"] + c["cross_attn_core"]
    rules = [
        ("real", f"real count: CFG, {c['text_tokens']} text tokens, transformer + VAE decode + text", c["total"]),
        ("macs", "same, counted in MACs", c["total"] / 2),
        ("no_cfg", "without CFG", no_cfg["total"]),
        ("transformer", "transformer only (no VAE decode, no text)", c["transformer"]),
        ("padded", f"cross-attention over {PADDED_TEXT_TOKENS} text tokens", padded_text["total"]),
        ("t5", f"+ T5 encoder on {PADDED_TEXT_TOKENS} padded tokens, 1 row", c["total"] + t5_tflops[1]),
        ("kv", "cross-attention text K/V recomputed in every pass", c["total"] + _per_pass_text_kv(c)),
        ("a'", "attention matmuls not counted (linear + conv only)", _no_attention(c)),
        ("attention_macs", "attention matmuls counted as MACs", c["total"] - attention / 2),
        ("a", "self-attention only within the current pass", _current_pass(c)),
        ("a_transformer", "same, transformer only", _current_pass(c) - c["vae_decode"] - c["text"]),
    ]
    return [dict(key=key, convention=label, tflops=tflops) for key, label, tflops in rules]


def infinity_per_scale_conventions(components: _Components) -> Dict[str, Any]:
    """Transformer TFLOPs per scale and in all of every method under the real count, (a) (self-attention within the
    current pass) and (a') (no attention kernels), from :func:`flops_components` results: ``per_scale`` (scale_index,
    h, w, tokens, then ``real`` / ``current_pass`` / ``no_attention``: method -> TFLOPs) and ``transformer`` (the
    same keys: the totals, text conditioning excluded)."""
    methods = list(components)
    scales = zip(*(components[m]["per_scale"] for m in methods))
    per_scale = []
    for row in scales:
        first = row[0]
        entry = {k: first[k] for k in ("scale_index", "h", "w", "tokens")}
        entry["real"] = {m: s["tflops"] for m, s in zip(methods, row)}
        entry["current_pass"] = {m: s["current_pass"] for m, s in zip(methods, row)}
        entry["no_attention"] = {m: s["tflops"] - s["attention"] for m, s in zip(methods, row)}
        per_scale.append(entry)
    transformer = {
        "real": {m: c["transformer"] for m, c in components.items()},
        "current_pass": {
            m: c["transformer"] - c["self_attn_cache"] + c["self_attn_current_pass"] for m, c in components.items()
        },
        "no_attention": {m: c["linear"] - c["text"] for m, c in components.items()},
    }
    return dict(per_scale=per_scale, transformer=transformer)


def count_infinity_conventions(
    model_name: str = "infinity-2b",
    height: int = 1024,
    width: int = 1024,
    methods: Sequence[str] = (),
    text_tokens: int = DEFAULT_TEXT_TOKENS,
    batch_size: int = 1,
) -> Dict[str, Any]:
    """What ``var-accel flops --model infinity-... --conventions [--json]`` prints: the baseline and ``methods``
    counted with CFG at ``text_tokens`` and at :data:`PADDED_TEXT_TOKENS` and without CFG (each twice, see
    :func:`flops_components`), and the T5 encoder on the padded text; then the ``conventions`` rows
    (:func:`infinity_conventions`), the ``gap`` rows (:func:`infinity_gap_to_paper`), the per-scale parts
    (:func:`infinity_per_scale_conventions`), each method's ``passes`` and the ``paper`` totals at this size."""
    methods = ["baseline", *methods]
    size = dict(model_name=model_name, height=height, width=width, batch_size=batch_size)

    def count(**kwargs):
        return {m: flops_components(accel=None if m == "baseline" else m, **size, **kwargs) for m in methods}

    components = count(text_tokens=text_tokens)
    padded = count(text_tokens=PADDED_TEXT_TOKENS)
    no_cfg = count(text_tokens=text_tokens, cfg=False)
    t5 = {rows: count_t5_encoder_flops(PADDED_TEXT_TOKENS, rows * batch_size) / _TERA for rows in (1, 2)}
    reference = PAPER_REFERENCES.get((model_name, height, width))
    paper = dict(baseline=reference[1], **PAPER_METHOD_TFLOPS[(model_name, height, width)]) if reference else {}
    return dict(
        model=model_name,
        height=height,
        width=width,
        cfg=True,
        batch_size=batch_size,
        text_tokens=text_tokens,
        padded_text_tokens=PADDED_TEXT_TOKENS,
        t5_tflops={str(rows): tf for rows, tf in t5.items()},
        passes={m: c["passes"] for m, c in components.items()},
        paper=paper,
        conventions=infinity_conventions(components, padded, no_cfg, t5),
        gap=infinity_gap_to_paper(components["baseline"], padded["baseline"], no_cfg["baseline"], t5),
        **infinity_per_scale_conventions(components),
    )


# ---------------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------------
def format_report(result: Dict[str, Any]) -> str:
    """The per-scale table and the totals, as printed by the script."""
    rows = result["rows"]
    cfg_text = (
        f"CFG on ({rows} rows: {result['batch_size']} cond + {result['batch_size']} uncond)"
        if result["cfg"]
        else f"CFG off ({rows} rows)"
    )
    lines = [
        f"{result['model']}  {result['height']}x{result['width']}  batch {result['batch_size']}  {cfg_text}  "
        f"text tokens {result['text_tokens']}",
        "FLOPs = 2 x MAC (torch.utils.flop_counter, meta tensors); element-wise ops and the T5 encoder not counted",
        "",
        f"{'scale':>5} | {'h x w':>9} | {'tokens':>6} | {'kv tokens':>9} | {'transformer TFLOPs':>18} | {'attn core':>9} | {'% of total':>10}",
        f"{'-' * 5}-+-{'-' * 9}-+-{'-' * 6}-+-{'-' * 9}-+-{'-' * 18}-+-{'-' * 9}-+-{'-' * 10}",
    ]
    for s in result["per_scale"]:
        lines.append(
            f"{s['scale_index']:>5} | {str(s['h']) + 'x' + str(s['w']):>9} | {s['tokens']:>6} | {s['kv_tokens']:>9} | "
            f"{s['tflops']:>18.3f} | {s['attention_flops'] / _TERA:>9.3f} | {s['percent']:>9.2f}%"
        )
    total_tokens = sum(s["tokens"] for s in result["per_scale"])
    lines.append(
        f"{'sum':>5} | {'':>9} | {total_tokens:>6} | {'':>9} | {result['transformer_tflops']:>18.3f} | "
        f"{result['attention_core_tflops']:>9.3f} | {100 * result['transformer_flops'] / result['total_flops']:>9.2f}%"
    )
    lines += ["", "totals (TFLOPs):"]
    for label, key in (
        ("transformer (blocks + head + embed)", "transformer"),
        ("VAE decode", "vae"),
        ("text conditioning", "text"),
        ("total", "total"),
    ):
        tf = result[f"{key}_tflops"]
        lines.append(f"  {label:<36} {tf:>9.3f}  ({100 * tf / result['total_tflops']:5.2f}%)")
    lines.append(f"  {'total in MACs (tera)':<36} {result['total_macs_tera']:>9.3f}")
    if "t5_encoder_tflops" in result:
        lines.append(
            f"  {'T5 encoder (not in total), ' + str(result['t5_tokens']) + ' tok':<36} {result['t5_encoder_tflops']:>9.3f}"
        )
    lines += ["", "transformer by sublayer (TFLOPs, all blocks and scales):"]
    for name, tf in result["transformer_breakdown_tflops"].items():
        lines.append(f"  {name:<36} {tf:>9.3f}")
    ref = result.get("reference")
    if ref is not None:
        lines += [
            "",
            f"{ref['source']}: {ref['total_tflops']:.2f} TFLOPs; ours {result['total_tflops']:.2f} TFLOPs; "
            f"ours / paper = {ref['ratio']:.3f}",
        ]
    lines.append(f"VAE: {result['vae_note']}")
    return "\n".join(lines)


def format_comparison(comparison: Dict[str, Any]) -> str:
    """The table of :func:`~diffusers_var_accel.lab.bench.flops.compare_methods` for Infinity counts."""
    lines = [
        f"{comparison['model']} {comparison['height']}x{comparison['width']}, cfg={comparison['cfg']}: TFLOPs per generation",
        f"{'method':<32} {'total':>9} {'transformer':>12} {'ratio':>7} {'paper':>8} {'paper ratio':>12}",
    ]
    for row in comparison["summary"]:
        paper = f"{row['paper_tflops']:.2f}" if row["paper_tflops"] else "-"
        paper_ratio = f"{row['paper_ratio']:.2f}x" if row["paper_ratio"] else "-"
        lines.append(
            f"{row['method']:<32} {row['total_tflops']:>9.2f} {row['transformer_tflops']:>12.2f} {row['ratio']:>6.2f}x {paper:>8} {paper_ratio:>12}"
        )
    lines += [
        "",
        "transformer TFLOPs per scale (a grouped pass is counted on its first scale; skipped scales are 0):",
        *per_scale_lines(comparison, hw_width=9),
    ]
    return "\n".join(lines)


def format_infinity_conventions(result: Dict[str, Any]) -> str:
    """The text of ``var-accel flops --model infinity-... --conventions``: the gap rows, the candidate conventions
    (with the papers' totals where published) and the per-scale parts."""
    methods = list(result["conventions"][0]["totals"])
    shown = [m for m in methods if m != "baseline"]
    paper = result["paper"]
    lines = [
        f"{result['model']} {result['height']}x{result['width']}: one generation under counting conventions "
        f"(TFLOPs, 2 FLOPs per MAC unless stated)",
        "",
        "baseline, one assumption changed per row" + (f" (paper: {paper['baseline']:.2f}):" if paper else ":"),
    ]
    for row in result["gap"]:
        vs = f"  {row['tflops'] / paper['baseline']:.3f} of the paper's" if paper else ""
        lines.append(f"  {row['convention'][:74]:<74} {row['tflops']:>8.2f}{vs}")
    lines += ["", *convention_lines(result["conventions"], shown, 74, paper, head="convention (CFG unless stated)")]
    kinds = (("real", "real"), ("current_pass", "(a)"), ("no_attention", "(a')"))
    lines += [
        "",
        "transformer TFLOPs per scale: real, (a) self-attention within the current pass, (a') no attention kernels",
        f"{'scale':>5} | {'h x w':>9} | {'tokens':>6} | "
        + " | ".join(f"{(m[:10] + ' ' + k):>16}" for m in methods for _, k in kinds),
    ]
    for s in result["per_scale"]:
        lines.append(
            f"{s['scale_index']:>5} | {str(s['h']) + 'x' + str(s['w']):>9} | {s['tokens']:>6} | "
            + " | ".join(f"{s[key][m]:>16.3f}" for m in methods for key, _ in kinds)
        )
    total = result["transformer"]
    lines.append(
        f"{'sum':>5} | {'':>9} | {'':>6} | "
        + " | ".join(f"{total[key][m]:>16.3f}" for m in methods for key, _ in kinds)
    )
    return "\n".join(lines)


def _run_conventions(args: argparse.Namespace, methods: List[str], height: int, width: int, text_tokens: int) -> int:
    """``--conventions``: counts with and without CFG and the T5 encoder on the padded text by itself, so the options
    that would change those are refused rather than ignored."""
    if args.no_cfg:
        raise ValueError("--conventions counts both with and without CFG (its no-CFG rows); --no-cfg does not apply")
    if args.t5_tokens:
        raise ValueError(
            f"--conventions counts the T5 encoder on {PADDED_TEXT_TOKENS} padded tokens; --t5-tokens "
            f"{args.t5_tokens} does not apply"
        )
    methods = [m for m in methods if m.lower() not in ("baseline", "none")]
    for m in methods:  # fail on a bad spec before counting anything
        load_acceleration(m, "infinity")
    result = count_infinity_conventions(args.model, height, width, methods, text_tokens, args.batch_size)
    print(json.dumps(result) if args.json else format_infinity_conventions(result))
    return 0


def _run_cli(args: argparse.Namespace, methods: List[str]) -> int:
    """``var-accel flops --model infinity-...``: the table, the comparison with ``--accel``, the conventions, the T5
    count."""
    height, width = args.height or 1024, args.width or 1024
    text_tokens = DEFAULT_TEXT_TOKENS if args.text_tokens is None else args.text_tokens
    if args.conventions:
        return _run_conventions(args, methods, height, width, text_tokens)
    result = count_infinity_flops(
        args.model, height, width, cfg=not args.no_cfg, batch_size=args.batch_size, text_tokens=text_tokens
    )
    accelerated = {
        m: count_infinity_flops(
            args.model,
            height,
            width,
            cfg=not args.no_cfg,
            batch_size=args.batch_size,
            text_tokens=text_tokens,
            accel=m,
        )
        for m in methods
    }
    if methods:
        comparison = compare_methods(result, accelerated)
        print(json.dumps(comparison) if args.json else format_comparison(comparison))
        return 0
    if args.t5_tokens > 0:
        result["t5_tokens"] = args.t5_tokens
        result["t5_encoder_tflops"] = count_t5_encoder_flops(args.t5_tokens, args.batch_size) / _TERA
    print(json.dumps(result) if args.json else format_report(result))
    return 0


#: Infinity's part of the meter (``ModelFamily.flop_breakdown``). The FLOPs of each loop step go to one part of the
#: scale: the embeddings (start token, word embedding of the next scale's input), the blocks, the head (head AdaLN +
#: bit logits) and the code bookkeeping (no counted FLOPs: interpolations); every scale reports blocks, head and
#: embed, and the whole loop is the transformer's.
INFINITY_FLOPS = FamilyFlops(
    models=tuple(MODEL_SPECS),
    transformer_class=InfinityTransformer,
    prepare=infinity_generation,
    step_parts={
        "start": "embed",
        "embed_inputs": "embed",
        "run_blocks": "blocks",
        "guided_logits": "head",
        "tokens_to_codes": "codes",
        "add_codes": "codes",
        "next_inputs": "codes",
    },
    scale_fields=(("blocks", ("blocks",)), ("head", ("head",)), ("embed", ("embed",))),
    loop_totals=(("transformer", "flops"),),
    sublayers=_sublayers,
    breakdown_fields=("head", "embed"),
    summary=lambda r: {"total_tflops": r["total_tflops"], "transformer_tflops": r["transformer_tflops"]},
    published=lambda baseline: PAPER_METHOD_TFLOPS.get((baseline["model"], baseline["height"], baseline["width"]), {}),
    run_cli=_run_cli,
    cli_help={
        "size": "Infinity default 1024",
        "text_tokens": f"Infinity: T5 tokens per prompt (default {DEFAULT_TEXT_TOKENS}, a typical prompt)",
    },
    text_encoder=(
        "t5",
        "Infinity: also count the flan-t5-xl encoder on this many tokens per prompt (not in the "
        "total; the official runner pads to 512)",
    ),
    conventions=True,
)
