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
) -> Dict[str, Any]:
    """TFLOPs of one generation split into the parts that FLOPs-counting conventions treat differently.

    Counts twice (``self_attention="cache"``, the real model, and ``"current_pass"``) and returns, in TFLOPs:
    ``linear`` (every counted op of the transformer and the text conditioning that is not an attention kernel:
    projections, FFN, head, input embedding), ``self_attn_cache`` (QK^T and PV over the KV cache of the earlier scales
    plus the current pass), ``self_attn_current_pass`` (the same over the current pass's keys only),
    ``cross_attn_core`` (QK^T and PV over the text), ``vae_decode`` (convolutions; the VAE has no attention),
    ``total`` (the real count: linear + self_attn_cache + cross_attn_core + vae_decode), ``passes`` (transformer
    passes run: skipped scales run none, a grouped pass counts once) and ``per_scale`` (scale_index, tokens,
    ``tflops``: the real count, ``attention``: its attention kernels, ``current_pass``: the count under that
    convention). Every part is exact for the counted shapes; a convention is a sum of parts (e.g. "attention kernels
    not counted" = linear + vae_decode).
    """
    real = count_infinity_flops(model_name, height, width, cfg=cfg, text_tokens=text_tokens, accel=accel)
    local = count_infinity_flops(
        model_name, height, width, cfg=cfg, text_tokens=text_tokens, accel=accel, self_attention="current_pass"
    )
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
        passes=sum(1 for s in real["per_scale"] if s["flops"] > 0),
        per_scale=[
            dict(
                scale_index=s["scale_index"],
                tokens=s["tokens"],
                tflops=s["tflops"],
                attention=s["attention_flops"] / _TERA,
                current_pass=t["tflops"],
            )
            for s, t in zip(real["per_scale"], local["per_scale"])
        ],
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


def _run_cli(args: argparse.Namespace, methods: List[str]) -> int:
    """``var-accel flops --model infinity-...``: the table, the comparison with ``--accel``, the T5 count."""
    height, width = args.height or 1024, args.width or 1024
    text_tokens = DEFAULT_TEXT_TOKENS if args.text_tokens is None else args.text_tokens
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
)
