"""HART's part of the FLOP meter (:mod:`diffusers_var_accel.lab.bench.flop_meter`): the released model's tokenizer
config, how :class:`~diffusers_var_accel.pipelines.hart.HARTPipeline` drives a generation, which step counts towards
which part (the residual diffusion head is a part of its own), the Qwen2 encoder's count, the papers' numbers, the
counting-conventions table and the report of ``var-accel flops --model hart-...``.

A generation: ``encode_condition`` on zero Qwen2 features of the 300 context tokens (plus the all-zero unconditional
rows), :func:`~diffusers_var_accel.next_scale.run_next_scale_loop` with a :class:`HARTScaleFamily` and the pipeline's
guidance ramp, teacher tokens, the residual diffusion head at the last scale (explicit zero noise), then the
tokenizer's decoder.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any, Dict, List, Optional, Tuple

import torch

from diffusers_var_accel.models.autoencoder_hart import HARTHybridTokenizer
from diffusers_var_accel.models.transformer_hart import HART_CONFIGS, HARTTransformer
from diffusers_var_accel.next_scale import run_next_scale_loop
from diffusers_var_accel.schedulers.specs import load_acceleration
from diffusers_var_accel.lab.bench.flop_meter import (
    convention_lines,
    UNATTRIBUTED,
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
from diffusers_var_accel.pipelines.hart.pipeline_hart import HARTPipeline, HARTScaleFamily

__all__ = [
    "HART_TOKENIZER_CONFIGS",
    "HART_DEFAULT_GUIDANCE",
    "HART_PAPER_TFLOPS",
    "HART_PAPER_SOURCE",
    "HART_SELF_ATTENTION_KEYS",
    "QWEN2_1_5B_CONFIG",
    "HART_FLOPS",
    "hart_generation",
    "count_hart_generation_flops",
    "build_hart_on_meta",
    "count_hart_flops",
    "format_hart_report",
    "compare_hart_methods",
    "format_hart_comparison",
    "hart_flops_components",
    "count_qwen2_encoder_flops",
    "hart_conventions",
    "format_hart_conventions",
]

#: The tokenizer of each HART model (ARCHITECTURE.md 1.1: VAR's defaults, 16x down: a 64x64 latent at 1024 px).
HART_TOKENIZER_CONFIGS: Dict[str, Dict[str, Any]] = {
    "hart-0.7b": dict(vocab_size=4096, z_channels=32, ch=160, ch_mult=(1, 1, 2, 2, 4)),
}

#: ``HARTPipeline``'s default guidance weight (the official scripts' ``cfg=4.5``): scale si uses t = 4.5 si / 13.
HART_DEFAULT_GUIDANCE = 4.5

#: Published TFLOPs of HART-0.7B at 1024x1024, baseline and methods (LazyVAR's table; FastVAR's own paper gives none).
HART_PAPER_TFLOPS: Dict[str, Dict[str, float]] = {"hart-0.7b": {"baseline": 45.59, "fastvar": 34.11, "lazyvar": 32.09}}
HART_PAPER_SOURCE = "LazyVAR (CVPR 2026), HART-0.7B 1024x1024"

#: ``count_hart_flops(self_attention=...)``: ``"cache"`` (the real model: the text context, every earlier scale and
#: the current pass), ``"context_and_current_pass"`` (a counting convention: the 300 context keys + the current pass)
#: or ``"current_pass"`` (only the current pass's keys).
HART_SELF_ATTENTION_KEYS = ("cache", "context_and_current_pass", "current_pass")

#: Qwen2-1.5B's shape (HART's text encoder ``mit-han-lab/Qwen2-VL-1.5B-Instruct`` is a Qwen2 1.5B LM, hidden 1536;
#: its own config.json was not available here), for the optional text-encoder count (``--qwen2-tokens``).
QWEN2_1_5B_CONFIG: Dict[str, Any] = dict(
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
)

_BLOCK_MODULE = re.compile(r"(?:^|\.)blocks\.\d+\.(attn|ffn)(?:\.(\w+))?$")
_TERA = 1e12


# ---------------------------------------------------------------------------------------------------------------------
# the generation and its parts
# ---------------------------------------------------------------------------------------------------------------------
class _ZeroNoiseHead:
    """HART's diffusion head with explicit all-zero noise, so counting draws nothing from any RNG.

    The FLOPs do not depend on the noise values. ``guidance=None`` is the head's conditional-rows-only call (N rows),
    anything else its ``[cond | uncond]`` call (2N rows); both accept ``(N, Cv)`` noises.
    """

    def __init__(self, head):
        self.head = head

    def sample(self, condition, guidance, generator=None, **kwargs):
        n = condition.shape[0] if guidance is None else condition.shape[0] // 2
        zeros = torch.zeros(n, self.head.token_channels, device=condition.device)
        return self.head.sample(
            condition, guidance, initial_noise=zeros, step_noises=[zeros] * self.head.num_steps, **kwargs
        )


class _CountedHARTFamily(HARTScaleFamily):
    """HART's loop steps for counting on meta tensors: the level ids rebuilt on the CPU, the head's noise all zero."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pending_levels: List[Tuple[int, int]] = []

    def embed_inputs(self, inputs_BLd, scale_index_L):
        pending, self._pending_levels = self._pending_levels, []
        if scale_index_L.is_meta and pending:
            # A meta tensor has no values, and HART's family reads the level ids (to pick rows of its level table).
            # The loop built them from the pass's scales, one next_inputs call per scale: rebuild them on the CPU.
            scales, lengths = zip(*pending)
            if sum(lengths) == scale_index_L.shape[0]:
                scale_index_L = torch.repeat_interleave(torch.tensor(scales), torch.tensor(lengths))
        return super().embed_inputs(inputs_BLd, scale_index_L)

    def next_inputs(self, f_hat, scale_index):
        out = super().next_inputs(f_hat, scale_index)
        self._pending_levels.append((int(scale_index), int(out.shape[1])))
        return out

    def _sample_head(self, head, z_RLC, guidance, generator, B, L):
        return super()._sample_head(_ZeroNoiseHead(head), z_RLC, guidance, generator, B, L)


def hart_generation(
    transformer: HARTTransformer,
    vae: HARTHybridTokenizer,
    cfg: bool = True,
    batch_size: int = 1,
    guidance_scale: float = HART_DEFAULT_GUIDANCE,
    scheduler=None,
    use_diffusion_head: bool = True,
    kv_cache_dtype: Optional[str] = None,
) -> GenerationRun:
    """One HART generation with these (meta or real) models, driven as :class:`HARTPipeline` drives them.

    Text: ``encode_condition`` on ``B`` rows of zero Qwen2 features ``(B, T, D)`` with positions ``arange(T)`` (the
    pipeline's ``prompt_embeds`` path) plus, under CFG, the ``B`` all-zero unconditional rows of ``null_context``.
    Loop: :func:`run_next_scale_loop` with a :class:`HARTScaleFamily` (``top_k`` None, ``top_p`` 0,
    ``more_smooth=False``), guidance ``1 + HARTPipeline.guidance_schedule(guidance_scale, n)`` (scale 0 has t = 0
    and runs its head on the B conditional rows only), teacher tokens (all zero ids) instead of sampling, and the
    residual diffusion head at the last scale with explicit zero noise. Decode: ``vae.decode(f_hat)``.
    ``kv_cache_dtype``: the KV cache's storage form (``"int8"``; ``None``: the attention's dtype).
    """
    config = transformer.config
    device = transformer.context_embed.weight.device
    T, D = config.context_tokens, config.context_dim
    patch_nums = tuple(config.patch_nums)
    num_scales = len(patch_nums)
    weights = HARTPipeline.guidance_schedule(float(guidance_scale) if cfg else 0.0, num_scales)
    use_cfg = any(t != 0 for t in weights)
    B = batch_size
    family = _CountedHARTFamily(
        transformer,
        vae,
        top_k=None,
        top_p=0.0,
        more_smooth=False,
        diffusion_generator=None,
        use_diffusion_head=use_diffusion_head,
    )

    def encode():
        # As HARTPipeline.__call__ with prompt_embeds: prompt rows, then null_context rows.
        text = torch.zeros(B, T, D, device=device)
        positions = torch.arange(T, device=device).expand(B, T)
        if use_cfg:
            neg, neg_positions = transformer.null_context(B, device=device)
            text, positions = torch.cat((text, neg)), torch.cat((positions, neg_positions))
        return transformer.encode_condition(text, positions)

    def loop(condition, on_scale_end):
        teacher = [torch.zeros(B, pn * pn, dtype=torch.long, device=device) for pn in patch_nums]  # token ids 0
        return run_next_scale_loop(
            family,
            condition,
            family.scale_schedule,
            B,
            list(weights),
            [1.0] * num_scales,
            None,
            scheduler,
            teacher,
            on_scale_end,
            kv_cache_dtype=kv_cache_dtype,
        )

    def decode(state):
        return vae.decode(state.f_hat.to(vae.dtype))

    # scale 0's pass runs the context tokens (cached); its 1x1 token is not cached
    inputs = [T if si == 0 else pn * pn for si, pn in enumerate(patch_nums)]
    return GenerationRun(
        steps=family,
        encode=encode,
        loop=loop,
        decode=decode,
        rows=2 * B if use_cfg else B,
        scales=[dict(h=pn, w=pn, tokens=pn * pn, input_tokens=n) for pn, n in zip(patch_nums, inputs)],
        kv_tokens=inputs,
    )


def _sublayers(flop_counts: Dict[str, Dict[Any, int]]) -> Dict[str, int]:
    """HART's block sublayers (self-attention projections and core, FFN), summed over blocks."""
    per = sublayer_flops(flop_counts, _BLOCK_MODULE)
    attn, ffn = per[("attn", None)], per[("ffn", None)]
    out_proj = per[("attn", "proj")]["linear"]
    return {
        "self_attn_qkv_proj": attn["linear"] - out_proj,
        "self_attn_core": attn["attention"],
        "self_attn_out_proj": out_proj,
        "ffn": ffn["linear"] + ffn["attention"],
    }


#: HART's part of the meter (``ModelFamily.flop_breakdown``). Parts: ``embed`` (start tokens, word + level
#: embeddings), ``blocks``, ``head`` (head AdaLN + codebook logits), ``diffusion`` (``diffusion_residual``: the
#: per-token condition ``decoder_norm(x + word_embed(code))`` and the sampler's ``net`` evaluations; it runs inside
#: ``tokens_to_codes`` and is attributed to itself), ``codes`` (the tokenizer's f_hat update: the Phi convolutions);
#: a scheduler's own work is ``scheduler``, and the transformer is blocks + head + embed + scheduler.
_STEP_PARTS = {
    "start": "embed",
    "embed_inputs": "embed",
    "run_blocks": "blocks",
    "guided_logits": "head",
    "tokens_to_codes": "codes",
    "diffusion_residual": "diffusion",
    "add_codes": "codes",
    "next_inputs": "codes",
}


def _summary(r: Dict[str, Any]) -> Dict[str, float]:
    return {
        "total_tflops": r["total_tflops"],
        "transformer_tflops": r["transformer_tflops"],
        "diffusion_tflops": r["diffusion_tflops"],
        "vae_tflops": r["vae_tflops"],
        "other_tflops": r["text_tflops"] + r["codes_tflops"],
    }


def _published(baseline: Dict[str, Any]) -> Dict[str, float]:
    return HART_PAPER_TFLOPS.get(baseline["model"], {}) if baseline.get("reference") else {}


@torch.no_grad()
def count_hart_generation_flops(
    transformer: HARTTransformer,
    vae: HARTHybridTokenizer,
    cfg: bool = True,
    batch_size: int = 1,
    guidance_scale: float = HART_DEFAULT_GUIDANCE,
    scheduler=None,
    use_diffusion_head: bool = True,
) -> Dict[str, Any]:
    """FLOPs of :func:`hart_generation` (the meter's ``count_generation_flops`` on HART models).

    Returns a dict with integer FLOPs: ``text_flops`` (context_norm + context_embed), ``transformer_flops`` (blocks,
    heads and embeddings of every scale, plus any scheduler work outside the family's steps), ``diffusion_flops``
    (condition + ``net`` x sampling steps), ``codes_flops`` (Phi convolutions of the f_hat updates), ``vae_flops``
    (``post_quant_conv`` + decoder), ``total_flops``, ``attention_core_flops`` (QK^T and PV in the loop),
    ``per_scale`` (one dict per scale), ``transformer_breakdown`` and ``rows``.
    """
    return meter_generation(
        HART_FLOPS, hart_generation(transformer, vae, cfg, batch_size, guidance_scale, scheduler, use_diffusion_head)
    )


# ---------------------------------------------------------------------------------------------------------------------
# named models
# ---------------------------------------------------------------------------------------------------------------------
def build_hart_on_meta(
    name: str = "hart-0.7b",
    transformer_config: Optional[Dict[str, Any]] = None,
    tokenizer_config: Optional[Dict[str, Any]] = None,
):
    """``(HARTTransformer, HARTHybridTokenizer)`` of a released HART config on meta, with optional overrides."""
    if name not in HART_CONFIGS or name not in HART_TOKENIZER_CONFIGS:
        raise ValueError(f"unknown HART model {name!r}; choose one of {sorted(HART_TOKENIZER_CONFIGS)}")
    t_cfg = {**HART_CONFIGS[name], **(transformer_config or {})}
    v_cfg = {**HART_TOKENIZER_CONFIGS[name], **(tokenizer_config or {})}
    v_cfg.setdefault("v_patch_nums", tuple(t_cfg["patch_nums"]))
    return build_on_meta(HARTTransformer, **t_cfg), build_on_meta(HARTHybridTokenizer, **v_cfg)


def count_hart_flops(
    name: str = "hart-0.7b",
    batch_size: int = 1,
    guidance: bool = True,
    accel: Optional[str] = None,
    self_attention: str = "cache",
    guidance_scale: float = HART_DEFAULT_GUIDANCE,
    transformer_config: Optional[Dict[str, Any]] = None,
    tokenizer_config: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """FLOPs of one generation of ``batch_size`` images with a HART model, on meta tensors.

    Args:
        name: ``"hart-0.7b"`` (``HART_CONFIGS`` + ``HART_TOKENIZER_CONFIGS``).
        guidance: CFG on (2B rows, weight ``guidance_scale`` ramped per scale as ``HARTPipeline``) or off (B rows).
        accel: an acceleration spec for ``load_acceleration(accel, "hart")`` (the methods' ``"hart"`` presets).
        self_attention: ``"cache"`` (the real model) or a counting convention of ``HART_SELF_ATTENTION_KEYS``.
        transformer_config / tokenizer_config: overrides of the configs (e.g. a tiny model for tests).

    Returns the dict of :func:`count_hart_generation_flops` plus ``*_tflops`` fields (``tflops``/``percent`` in each
    ``per_scale`` entry), the arguments, ``height``/``width`` (the model's one size) and ``reference`` (the published
    baseline total and our ratio to it, or ``None``). The Qwen2 text encoder is not in the total.
    """
    if self_attention not in HART_SELF_ATTENTION_KEYS:
        raise ValueError(f"self_attention must be one of {HART_SELF_ATTENTION_KEYS}, got {self_attention!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    transformer, vae = build_hart_on_meta(name, transformer_config, tokenizer_config)
    T = transformer.config.context_tokens
    if self_attention != "cache":
        attend_to_current_pass(transformer, keep_prefix=T if self_attention == "context_and_current_pass" else 0)
    scheduler = load_acceleration(accel, "hart")
    result = count_hart_generation_flops(
        transformer, vae, cfg=guidance, batch_size=batch_size, guidance_scale=guidance_scale, scheduler=scheduler
    )
    add_tflops(result, HART_FLOPS, accel)
    patch_nums = tuple(transformer.config.patch_nums)
    size = patch_nums[-1] * 2 ** (len(vae.config.ch_mult) - 1)
    paper = HART_PAPER_TFLOPS.get(name, {}) if not (transformer_config or tokenizer_config) else {}
    head = transformer.diffusion_head
    result.update(
        model=name,
        family="hart",
        height=size,
        width=size,
        cfg=guidance,
        batch_size=batch_size,
        text_tokens=T,
        guidance_scale=guidance_scale if guidance else 0.0,
        self_attention=self_attention,
        scale_schedule=[[pn, pn] for pn in patch_nums],
        diffusion_steps=head.num_steps,
        total_macs_tera=result["total_flops"] / 2 / _TERA,
        counting="torch.utils.flop_counter.FlopCounterMode on meta tensors: FLOPs = 2 x MACs of matmul/linear/conv/"
        "attention; element-wise ops not counted; Qwen2 text encoder not included",
        vae_note=(
            f"HART tokenizer decoder: post_quant_conv + conv decoder ch={vae.config.ch} "
            f"ch_mult={list(vae.config.ch_mult)} on the {patch_nums[-1]}x{patch_nums[-1]}x{vae.config.z_channels} latent"
        ),
        reference=None
        if "baseline" not in paper
        else dict(
            source=HART_PAPER_SOURCE, total_tflops=paper["baseline"], ratio=result["total_tflops"] / paper["baseline"]
        ),
    )
    return result


def hart_flops_components(
    name: str = "hart-0.7b", accel: Optional[str] = None, guidance: bool = True, batch_size: int = 1
) -> Dict[str, Any]:
    """TFLOPs of one HART generation split into the parts that FLOPs-counting conventions treat differently.

    Counts three times (``self_attention`` = each of ``HART_SELF_ATTENTION_KEYS``) and returns, in TFLOPs:
    ``linear`` (every counted op of the transformer and the text conditioning that is not an attention kernel),
    ``self_attn_cache`` (QK^T and PV over the whole KV cache: context + earlier scales + this pass),
    ``self_attn_context_and_current_pass`` and ``self_attn_current_pass`` (the same under those conventions),
    ``diffusion`` (the diffusion head: condition + ``net`` x steps), ``vae_decode`` (decoder + Phi convolutions; the
    Phi part is ``codes``), ``total`` (the real count), ``passes`` and ``per_scale``. A convention is a sum of parts
    (e.g. "no attention kernels, no diffusion head" = linear + vae_decode).
    """
    real = count_hart_flops(name, batch_size, guidance, accel)
    ctx = count_hart_flops(name, batch_size, guidance, accel, self_attention="context_and_current_pass")
    cur = count_hart_flops(name, batch_size, guidance, accel, self_attention="current_pass")
    return dict(
        accel=real["accel"],
        cfg=guidance,
        linear=real["transformer_tflops"] - real["attention_core_tflops"] + real["text_tflops"],
        self_attn_cache=real["attention_core_tflops"],
        self_attn_context_and_current_pass=ctx["attention_core_tflops"],
        self_attn_current_pass=cur["attention_core_tflops"],
        diffusion=real["diffusion_tflops"],
        vae_decode=real["vae_tflops"] + real["codes_tflops"],
        codes=real["codes_tflops"],
        total=real["total_tflops"],
        passes=sum(1 for s in real["per_scale"] if s["flops"] > 0),
        per_scale=[
            dict(
                scale_index=s["scale_index"],
                tokens=s["tokens"],
                tflops=s["tflops"],
                attention=s["attention_flops"] / _TERA,
                context_and_current_pass=c["tflops"],
                current_pass=t["tflops"],
            )
            for s, c, t in zip(real["per_scale"], ctx["per_scale"], cur["per_scale"])
        ],
    )


@torch.no_grad()
def count_qwen2_encoder_flops(num_tokens: int, batch_size: int = 1) -> int:
    """FLOPs of the Qwen2-1.5B encoder (``Qwen2Model``, no LM head) on ``batch_size`` sequences of ``num_tokens``.

    HART's official prompt encoding runs the system instruction (``HART_LLM_SYSTEM_PROMPT``) plus the prompt padded
    to 300 tokens through it, once per prompt (the unconditional rows are all-zero features, not encoded).
    """
    from transformers import Qwen2Config, Qwen2Model

    with torch.device("meta"):
        model = Qwen2Model(Qwen2Config(**QWEN2_1_5B_CONFIG)).eval()
        ids = torch.zeros(batch_size, num_tokens, dtype=torch.long)
    with make_flop_counter() as mode:
        model(input_ids=ids)  # keep the model's KV cache on: without it transformers inspects position ids (.item())
    return mode.get_total_flops()


# ---------------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------------
def format_hart_report(result: Dict[str, Any]) -> str:
    """HART's per-scale table and totals, as printed by the script."""
    rows, B = result["rows"], result["batch_size"]
    cfg_text = (
        f"CFG on ({rows} rows: {B} cond + {B} uncond, guidance {result['guidance_scale']:g} ramped)"
        if rows == 2 * B
        else f"CFG off ({rows} rows)"
    )
    lines = [
        f"{result['model']}  {result['height']}x{result['width']}  batch {B}  {cfg_text}  "
        f"context tokens {result['text_tokens']}  diffusion steps {result['diffusion_steps']}",
        "FLOPs = 2 x MAC (torch.utils.flop_counter, meta tensors); element-wise ops and the Qwen2 text encoder not counted",
        "",
        f"{'scale':>5} | {'h x w':>7} | {'tokens':>6} | {'kv tokens':>9} | {'transformer':>11} | {'attn core':>9} | "
        f"{'diff. head':>10} | {'% of total':>10}",
        f"{'-' * 5}-+-{'-' * 7}-+-{'-' * 6}-+-{'-' * 9}-+-{'-' * 11}-+-{'-' * 9}-+-{'-' * 10}-+-{'-' * 10}",
    ]
    for s in result["per_scale"]:
        lines.append(
            f"{s['scale_index']:>5} | {str(s['h']) + 'x' + str(s['w']):>7} | {s['tokens']:>6} | {s['kv_tokens']:>9} | "
            f"{s['transformer_flops'] / _TERA:>11.3f} | {s['attention_flops'] / _TERA:>9.3f} | "
            f"{s['diffusion_flops'] / _TERA:>10.3f} | {s['percent']:>9.2f}%"
        )
    total_tokens = sum(s["tokens"] for s in result["per_scale"])
    loop = sum(s["flops"] for s in result["per_scale"])
    lines.append(
        f"{'sum':>5} | {'':>7} | {total_tokens:>6} | {'':>9} | {result['transformer_tflops']:>11.3f} | "
        f"{result['attention_core_tflops']:>9.3f} | {result['diffusion_tflops']:>10.3f} | "
        f"{100 * loop / result['total_flops']:>9.2f}%"
    )
    lines += [
        "(scale 0's pass runs the context tokens; the transformer column includes blocks, heads and embeddings)",
        "",
        "totals (TFLOPs):",
    ]
    for label, key in (
        ("transformer (blocks + head + embed)", "transformer"),
        (f"diffusion head ({result['diffusion_steps']} steps)", "diffusion"),
        ("tokenizer decoder", "vae"),
        ("tokenizer Phi convs (f_hat updates)", "codes"),
        ("text conditioning (context_embed)", "text"),
        ("total", "total"),
    ):
        tf = result[f"{key}_tflops"]
        lines.append(f"  {label:<38} {tf:>9.3f}  ({100 * tf / result['total_tflops']:6.2f}%)")
    lines.append(f"  {'total in MACs (tera)':<38} {result['total_macs_tera']:>9.3f}")
    lines += ["", "transformer by sublayer (TFLOPs, all blocks and scales):"]
    for key, tf in result["transformer_breakdown_tflops"].items():
        if key != "scheduler" or tf:
            lines.append(f"  {key:<38} {tf:>9.3f}")
    ref = result.get("reference")
    if ref is not None:
        lines += [
            "",
            f"{ref['source']}: {ref['total_tflops']:.2f} TFLOPs; ours {result['total_tflops']:.2f} TFLOPs; "
            f"ours / paper = {ref['ratio']:.3f} (counting conventions differ: docs/flops.md)",
        ]
    lines.append(f"Tokenizer: {result['vae_note']}")
    return "\n".join(lines)


#: HART's name for the meter's comparison (totals split into transformer / diffusion head / decoder / other).
compare_hart_methods = compare_methods


def format_hart_comparison(comparison: Dict[str, Any]) -> str:
    lines = [
        f"{comparison['model']} {comparison['height']}x{comparison['width']}, cfg={comparison['cfg']}: TFLOPs per generation "
        "(Qwen2 text encoder not included)",
        f"{'method':<32} {'total':>8} {'transformer':>12} {'diff. head':>10} {'decoder':>8} {'other':>6} {'ratio':>7} "
        f"{'paper':>7} {'paper ratio':>12}",
    ]
    for row in comparison["summary"]:
        paper = f"{row['paper_tflops']:.2f}" if row["paper_tflops"] else "-"
        paper_ratio = f"{row['paper_ratio']:.2f}x" if row["paper_ratio"] else "-"
        lines.append(
            f"{row['method']:<32} {row['total_tflops']:>8.2f} {row['transformer_tflops']:>12.2f} "
            f"{row['diffusion_tflops']:>10.2f} {row['vae_tflops']:>8.2f} {row['other_tflops']:>6.3f} "
            f"{row['ratio']:>6.2f}x {paper:>7} {paper_ratio:>12}"
        )
    lines += [
        "(other = text conditioning + the tokenizer's Phi convolutions; papers' counting conventions differ, "
        "see docs/flops.md)",
        "",
        "loop TFLOPs per scale (transformer + diffusion head; a grouped pass is counted on its first scale; "
        "skipped scales are 0):",
        *per_scale_lines(comparison, hw_width=7),
    ]
    return "\n".join(lines)


def hart_conventions(components: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Totals of every method under several counting conventions, from :func:`hart_flops_components` results.

    ``components`` maps method names (``"baseline"`` first) to their components. Each returned row has ``convention``,
    ``totals`` (method -> TFLOPs), ``ratios`` (baseline / method) and ``saved`` (baseline - method).
    """
    rules = [
        ("real count: attention over the KV cache + diffusion head + decoder", lambda c: c["total"]),
        ("transformer only (real attention)", lambda c: c["linear"] + c["self_attn_cache"]),
        ("transformer + diffusion head (no decoder)", lambda c: c["linear"] + c["self_attn_cache"] + c["diffusion"]),
        (
            "self-attention to the context + current pass only",
            lambda c: c["total"] - c["self_attn_cache"] + c["self_attn_context_and_current_pass"],
        ),
        (
            "self-attention within the current pass only",
            lambda c: c["total"] - c["self_attn_cache"] + c["self_attn_current_pass"],
        ),
        ("attention kernels at half weight (1 per MAC)", lambda c: c["total"] - c["self_attn_cache"] / 2),
        (
            "no attention kernels (linear + conv): diffusion head + decoder",
            lambda c: c["linear"] + c["diffusion"] + c["vae_decode"],
        ),
        ("no attention kernels, no decoder", lambda c: c["linear"] + c["diffusion"]),
        ("no attention kernels, transformer only", lambda c: c["linear"]),
        ("real count in MACs", lambda c: c["total"] / 2),
    ]
    base = components["baseline"]
    rows = []
    for label, rule in rules:
        totals = {m: rule(c) for m, c in components.items()}
        rows.append(
            dict(
                convention=label,
                totals=totals,
                ratios={m: totals["baseline"] / t for m, t in totals.items()},
                saved={m: rule(base) - t for m, t in totals.items()},
            )
        )
    return rows


def format_hart_conventions(model: str, rows: List[Dict[str, Any]]) -> str:
    shown = [m for m in rows[0]["totals"] if m != "baseline"]
    lines = [f"{model}: one generation under counting conventions (Qwen2 text encoder not included)"]
    paper = HART_PAPER_TFLOPS.get(model) or None
    lines += convention_lines(rows, shown, 66, paper, f"papers ({HART_PAPER_SOURCE})")
    return "\n".join(lines)


def _run_cli(args: argparse.Namespace, methods: List[str]) -> int:
    """``var-accel flops --model hart-...``: the table, the comparison with ``--accel``, the conventions, Qwen2."""
    cfg = not args.no_cfg
    config = HART_CONFIGS[args.model]
    size = config["patch_nums"][-1] * 2 ** (len(HART_TOKENIZER_CONFIGS[args.model]["ch_mult"]) - 1)
    if (args.height or size, args.width or size) != (size, size):
        raise ValueError(f"{args.model} generates {size}x{size} images only; got {args.height}x{args.width}")
    if args.text_tokens is not None and args.text_tokens != config["context_tokens"]:
        raise ValueError(
            f"HART pads every prompt to its {config['context_tokens']} context tokens; --text-tokens does not apply"
        )
    methods = [m for m in methods if m.lower() not in ("baseline", "none")]
    for m in methods:  # fail on a bad spec before counting anything
        load_acceleration(m, "hart")
    if args.conventions:
        components = {"baseline": hart_flops_components(args.model, None, cfg, args.batch_size)}
        components.update({m: hart_flops_components(args.model, m, cfg, args.batch_size) for m in methods})
        rows = hart_conventions(components)
        print(
            json.dumps({"model": args.model, "cfg": cfg, "conventions": rows})
            if args.json
            else format_hart_conventions(args.model, rows)
        )
        return 0
    result = count_hart_flops(args.model, args.batch_size, cfg)
    if methods:
        accelerated = {m: count_hart_flops(args.model, args.batch_size, cfg, accel=m) for m in methods}
        comparison = compare_methods(result, accelerated)
        print(json.dumps(comparison) if args.json else format_hart_comparison(comparison))
        return 0
    report = format_hart_report(result)
    if args.qwen2_tokens > 0:
        result["qwen2_tokens"] = args.qwen2_tokens
        result["qwen2_encoder_tflops"] = count_qwen2_encoder_flops(args.qwen2_tokens, args.batch_size) / _TERA
        report += (
            f"\nQwen2-1.5B text encoder on {args.qwen2_tokens} tokens x {args.batch_size} prompt(s) "
            f"(not in the total): {result['qwen2_encoder_tflops']:.3f} TFLOPs"
        )
    print(json.dumps(result) if args.json else report)
    return 0


HART_FLOPS = FamilyFlops(
    models=tuple(HART_TOKENIZER_CONFIGS),
    transformer_class=HARTTransformer,
    prepare=hart_generation,
    step_parts=_STEP_PARTS,
    scale_fields=(
        ("blocks", ("blocks",)),
        ("head", ("head",)),
        ("embed", ("embed",)),
        ("scheduler", (UNATTRIBUTED,)),
        ("transformer", ("blocks", "head", "embed", UNATTRIBUTED)),
        ("diffusion", ("diffusion",)),
        ("codes", ("codes",)),
    ),
    loop_totals=(("transformer", "transformer_flops"), ("diffusion", "diffusion_flops"), ("codes", "codes_flops")),
    sublayers=_sublayers,
    breakdown_fields=("head", "embed", "scheduler"),
    summary=_summary,
    published=_published,
    run_cli=_run_cli,
    cli_help={"size": "HART: its one size", "text_tokens": "HART always uses its 300 context tokens"},
    text_encoder=(
        "qwen2",
        "HART: also count the Qwen2-1.5B text encoder on this many tokens per prompt (not in the "
        "total; the official encoding is the system instruction + the prompt padded to 300)",
    ),
    conventions=True,
)
