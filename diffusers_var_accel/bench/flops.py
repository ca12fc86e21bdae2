"""FLOPs of one Infinity or HART text-to-image generation, counted on the real code path without allocating any weight.

The transformer and the VAE / tokenizer are built on the ``meta`` device from their real configurations and driven
exactly as the pipelines drive them. Infinity (:class:`~diffusers_var_accel.pipelines.infinity.InfinityPipeline`):
``encode_condition`` on the text features, :func:`~diffusers_var_accel.pipelines.next_scale.run_next_scale_loop` with
an :class:`~diffusers_var_accel.pipelines.infinity.pipeline_infinity.InfinityScaleFamily` (teacher tokens replace the
sampling, which is the only step that needs values), then ``vae.decode``. HART
(:class:`~diffusers_var_accel.pipelines.hart.HARTPipeline`): ``encode_condition`` on zero Qwen2 features of the
300 context tokens (plus the all-zero unconditional rows), the loop with a
:class:`~diffusers_var_accel.pipelines.hart.pipeline_hart.HARTScaleFamily` and the pipeline's guidance ramp, teacher
tokens, the residual diffusion head at the last scale (explicit zero noise), then the tokenizer's decoder.
``torch.utils.flop_counter.FlopCounterMode`` counts every matmul, linear, convolution and attention kernel by its
shape; on meta tensors scaled-dot-product attention decomposes into ``bmm`` and is counted too (checked against the
analytic counts in ``tests/test_flops.py``).

Counting convention (``FlopCounterMode``'s): **FLOPs = 2 x multiply-accumulates** of matmuls, linear layers,
convolutions and attention (QK^T and PV). Element-wise work (norms, softmax, GELU, RoPE, interpolation, sampling) is
not counted (estimated below 1 % of the total). The text encoders (T5 for Infinity, Qwen2 for HART) are not part of
the total (see ``--t5-tokens`` / ``--qwen2-tokens``).

Usage (``var-accel flops`` runs :func:`main`; so does ``python benchmarks/flops.py`` in a source checkout)::

    var-accel flops --model infinity-2b --height 1024 --width 1024 [--json] [--no-cfg]
                    [--text-tokens 32] [--batch-size 1] [--t5-tokens 512] [--accel fastvar lazyvar]
    var-accel flops --model hart-0.7b [--accel fastvar lazyvar depthvar arvar] [--no-cfg] [--json]
                    [--conventions] [--qwen2-tokens 450]

Importable API: :func:`count_infinity_flops` (a model name) and :func:`count_generation_flops` (any models, e.g. a tiny
config on meta or CPU tensors), :func:`count_t5_encoder_flops`, :func:`format_report`, :func:`flops_components`
(the parts that FLOPs-counting conventions treat differently, for comparisons with published totals); for HART
:func:`count_hart_flops` (a model name, optional config overrides), :func:`count_hart_generation_flops` (any models),
:func:`hart_flops_components`, :func:`count_qwen2_encoder_flops`, :func:`format_hart_report`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from diffusers_var_accel.models.attention_processor import HARTAttnProcessor, VARAttnProcessor
from diffusers_var_accel.models.autoencoder_bsq import INFINITY_VAE_D32_CONFIG, INFINITY_VAE_D56_PATCHIFY_CONFIG, InfinityBSQVAE
from diffusers_var_accel.models.autoencoder_hart import HARTHybridTokenizer
from diffusers_var_accel.models.infinity_resolutions import rope_grid_hw, schedule_for_size
from diffusers_var_accel.models.transformer_hart import HART_CONFIGS, HARTAttention, HARTTransformer
from diffusers_var_accel.models.transformer_infinity import INFINITY_CONFIGS, InfinitySelfAttention, InfinityTransformer
from diffusers_var_accel.pipelines.hart.pipeline_hart import HARTPipeline, HARTScaleFamily
from diffusers_var_accel.pipelines.infinity.pipeline_infinity import InfinityScaleFamily, check_token_layout
from diffusers_var_accel.pipelines.next_scale import run_next_scale_loop
from diffusers_var_accel.schedulers.registry import method_names
from diffusers_var_accel.schedulers.specs import load_acceleration, split_acceleration_specs

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
    "infinity-8b": InfinityFlopSpec(INFINITY_CONFIGS["infinity-8b"], INFINITY_VAE_D14_PATCHIFY_CONFIG, spatial_patchify=True),
}

#: Published totals of the unaccelerated model, keyed by (model, height, width).
PAPER_REFERENCES: Dict[Tuple[str, int, int], Tuple[str, float]] = {
    ("infinity-2b", 1024, 1024): ("LazyVAR (CVPR 2026), Infinity-2B 1024x1024 baseline", 101.58),
}

#: flan-t5-xl encoder (Infinity's text encoder), for the optional T5 count.
FLAN_T5_XL_ENCODER_CONFIG: Dict[str, Any] = dict(
    vocab_size=32128, d_model=2048, d_kv=64, d_ff=5120, num_layers=24, num_heads=32, feed_forward_proj="gated-gelu",
    relative_attention_num_buckets=32, relative_attention_max_distance=128, is_encoder_decoder=False, use_cache=False,
)

_ATTENTION_OPS = ("bmm", "baddbmm", "scaled_dot_product", "flash_attention", "efficient_attention")
_BLOCK_MODULE = re.compile(r"(?:^|\.)blocks\.\d+\.(sa|ca|ffn)(?:\.(\w+))?$")
_TERA = 1e12


# ---------------------------------------------------------------------------------------------------------------------
# counter and model construction
# ---------------------------------------------------------------------------------------------------------------------
def _cpu_flash_sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """CPU SDPA has no formula in torch: count it like the CUDA kernels (QK^T and PV, 2 FLOPs per MAC)."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def make_flop_counter() -> FlopCounterMode:
    """A silent ``FlopCounterMode`` that also counts CPU SDPA (on meta tensors SDPA is already counted as ``bmm``)."""
    mapping = {}
    if hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_flash_sdpa_flop
    return FlopCounterMode(display=False, custom_mapping=mapping)


def build_on_meta(cls, **config) -> torch.nn.Module:
    """``cls(**config)`` with every parameter and buffer on the meta device (nothing is allocated).

    ``InfinityTransformer.__init__`` calls ``.item()`` on a freshly built tensor, which fails under
    ``with torch.device("meta")``; so parameters are moved to meta as they are registered (accelerate's
    ``init_empty_weights``) and the few small buffers afterwards.
    """
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        model = cls(**config)
    return model.to("meta").eval()


def _is_attention_op(op) -> bool:
    name = str(op)
    return any(key in name for key in _ATTENTION_OPS)


class _Meter:
    """Reads the running totals of a ``FlopCounterMode``: all FLOPs, and the attention-kernel part."""

    def __init__(self, mode: FlopCounterMode):
        self.mode = mode

    def read(self) -> Tuple[int, int]:
        ops = self.mode.get_flop_counts().get("Global", {})
        return sum(ops.values()), sum(v for op, v in ops.items() if _is_attention_op(op))


class _MeteredFamily(InfinityScaleFamily):
    """Infinity's loop steps, unchanged, with the FLOPs of each step added to the current scale's record."""

    _PARTS = {"start_tokens": "embed", "embed_inputs": "embed", "run_blocks": "blocks", "guided_logits": "head",
              "tokens_to_codes": "codes", "add_codes": "codes", "next_inputs": "codes"}

    def __init__(self, *args, meter: _Meter, **kwargs):
        super().__init__(*args, **kwargs)
        self.meter = meter
        self.current: Dict[str, int] = defaultdict(int)

    def _metered(self, name: str, *args):
        before, _ = self.meter.read()
        out = getattr(super(), name)(*args)
        self.current[self._PARTS[name]] += self.meter.read()[0] - before
        return out

    def start_tokens(self, *a):
        return self._metered("start_tokens", *a)

    def embed_inputs(self, inputs_BLd, scale_index_L):
        # The loop's code bookkeeping runs on small real tensors when the transformer is on meta (see
        # count_generation_flops); the transformer takes its inputs on its own device.
        device = self.transformer.word_embed.weight.device
        return self._metered("embed_inputs", inputs_BLd.to(device), scale_index_L.to(device))

    def run_blocks(self, *a):
        return self._metered("run_blocks", *a)

    def guided_logits(self, *a):
        return self._metered("guided_logits", *a)

    def tokens_to_codes(self, *a):
        return self._metered("tokens_to_codes", *a)

    def add_codes(self, *a):
        return self._metered("add_codes", *a)

    def next_inputs(self, *a):
        return self._metered("next_inputs", *a)


def _block_breakdown(flop_counts: Dict[str, Dict[Any, int]]) -> Dict[str, int]:
    """FLOPs of the blocks' sublayers, summed over blocks, from the counter's per-module table."""
    per = defaultdict(lambda: defaultdict(int))  # (sublayer, child) -> {"linear", "attention"}
    for name, ops in flop_counts.items():
        m = _BLOCK_MODULE.search(name)
        if m is None:
            continue
        key = (m.group(1), m.group(2))
        for op, v in ops.items():
            per[key]["attention" if _is_attention_op(op) else "linear"] += v
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


class _CurrentPassKV:
    """A ``ScaleKVCache`` seen by one self-attention call: it stores as usual but hands back only this pass's keys."""

    def __init__(self, cache):
        self.cache = cache

    def update(self, key_RHLc, value_RHLc, layer_idx, cache_rows=None, row_start=0):
        self.cache.update(key_RHLc, value_RHLc, layer_idx, cache_rows=cache_rows, row_start=row_start)
        return key_RHLc, value_RHLc

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


class _PrefixPlusCurrentPassKV(_CurrentPassKV):
    """Like :class:`_CurrentPassKV`, but the first ``prefix`` cached keys (HART's text context) stay visible."""

    def __init__(self, cache, prefix: int):
        super().__init__(cache)
        self.prefix = prefix

    def update(self, key_RHLc, value_RHLc, layer_idx, cache_rows=None, row_start=0):
        k_all, v_all = self.cache.update(key_RHLc, value_RHLc, layer_idx, cache_rows=cache_rows, row_start=row_start)
        before = k_all.shape[-2] - key_RHLc.shape[-2]  # keys cached by earlier passes
        keep = min(self.prefix, before)
        if keep == 0:
            return key_RHLc, value_RHLc
        return (torch.cat((k_all[..., :keep, :], key_RHLc), dim=-2), torch.cat((v_all[..., :keep, :], value_RHLc), dim=-2))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return min(self.prefix, self.cache.get_seq_length(layer_idx))


class _CurrentPassMixin:
    """Counting convention only: self-attention attends to the keys of the current pass, not to the cached prefix.

    The KV cache is still filled (so every later pass sees the same shapes as the real run), but each query attends only
    to the keys computed in its own pass: the ``h x w`` tokens of a dense scale, the kept tokens of a pruned scale, the
    kept tokens of all scales of a grouped pass (dense ``L x L``: the counter ignores masks anyway). With
    ``keep_prefix=n`` the first ``n`` cached keys stay visible too (HART: its 300 text-context tokens). The output shape
    is unchanged. This is not a valid model; it reproduces a FLOPs count that leaves the cross-scale attention out.
    """

    keep_prefix = 0

    def _self_attention(self, attn, hidden_states_RLC, context, rope_cos_sin, scale_ids):
        if context.kv_cache is not None:
            kv = (_PrefixPlusCurrentPassKV(context.kv_cache, self.keep_prefix) if self.keep_prefix
                  else _CurrentPassKV(context.kv_cache))
            context = dataclasses.replace(context, kv_cache=kv)
        return super()._self_attention(attn, hidden_states_RLC, context, rope_cos_sin, scale_ids)


class CurrentPassSelfAttnProcessor(_CurrentPassMixin, VARAttnProcessor):
    __doc__ = _CurrentPassMixin.__doc__


class CurrentPassHARTAttnProcessor(_CurrentPassMixin, HARTAttnProcessor):
    """:class:`CurrentPassSelfAttnProcessor` for HART's llama attention (``keep_prefix``: text tokens kept visible)."""

    def __init__(self, keep_prefix: int = 0):
        super().__init__()
        self.keep_prefix = keep_prefix


#: ``count_infinity_flops(self_attention=...)``: ``"cache"`` (the real model: attend to the KV cache of all earlier
#: scales plus the current pass) or ``"current_pass"`` (a counting convention: only the current pass's keys).
SELF_ATTENTION_KEYS = ("cache", "current_pass")


# ---------------------------------------------------------------------------------------------------------------------
# counting
# ---------------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def count_generation_flops(
    transformer: InfinityTransformer,
    vae: InfinityBSQVAE,
    scale_schedule: Sequence[Tuple[int, ...]],
    grid_hw: Tuple[int, int],
    cfg: bool = True,
    batch_size: int = 1,
    text_tokens: int = DEFAULT_TEXT_TOKENS,
    decode_vae: Optional[InfinityBSQVAE] = None,
    spatial_patchify: bool = False,
    scheduler=None,
) -> Dict[str, Any]:
    """FLOPs of one generation with these (meta or real) models, split into text conditioning, scales and decode.

    With an acceleration ``scheduler`` the loop runs its plans: skipped scales count 0, and a grouped pass is counted
    on the first scale of its group.

    Args:
        transformer / vae: the models; ``vae`` supplies the code bookkeeping of the loop (its ``codebook_dim`` must fit
            the transformer's bits per token: equal, or a quarter with ``apply_spatial_patchify``) and, unless
            ``decode_vae`` is given, the decoder.
        scale_schedule / grid_hw: the ``(1, h, w)`` schedule and its RoPE grid (``schedule_for_size``, ``rope_grid_hw``).
        cfg: classifier-free guidance (2B rows: conditional + learned unconditional text) or not (B rows).
        batch_size: images B.
        text_tokens: T5 tokens per prompt (the unconditional rows use as many ``cfg_uncond`` rows, as the pipeline).
        decode_vae: a different decoder (default: ``vae``).
        spatial_patchify: must equal the transformer's ``apply_spatial_patchify`` (kept for callers that state it; the
            loop reads the token layout from the transformer config).

    Returns:
        ``dict`` with integer FLOPs: ``text_flops``, ``transformer_flops``, ``vae_flops``, ``total_flops``,
        ``per_scale`` (one dict per scale: scale_index, h, w, tokens, kv_tokens, flops, blocks/head/embed/attention
        FLOPs), ``transformer_breakdown`` (per sublayer kind, summed over blocks and scales), ``rows``.
    """
    device = transformer.pos_start.device
    decode_vae = vae if decode_vae is None else decode_vae
    D, d = transformer.config.text_channels, transformer.config.codebook_dim
    check_token_layout(transformer, vae)
    if bool(spatial_patchify) != (transformer.token_patch_size != 1):
        raise ValueError(f"spatial_patchify={spatial_patchify} but the transformer has apply_spatial_patchify="
                         f"{transformer.token_patch_size != 1}")
    num_scales = len(scale_schedule)
    guidance = [DEFAULT_GUIDANCE_SCALE if cfg else 1.0] * num_scales
    B = batch_size

    mode = make_flop_counter()
    meter = _Meter(mode)
    family = _MeteredFamily(transformer, vae, scale_schedule, grid_hw, top_k=900, top_p=0.97, meter=meter)
    per_scale: List[Dict[str, Any]] = []
    with mode:
        # 1. Text conditioning, as InfinityPipeline.__call__: prompt rows, then cfg_uncond[:T] rows under CFG.
        #    (A full attention mask is turned into ``None`` by encode_condition; padding would not change the FLOPs.)
        text_BTD = torch.zeros(B, text_tokens, D, device=device)
        if cfg:
            text_BTD = torch.cat((text_BTD, transformer.null_text_embeds(torch.ones(B, text_tokens, dtype=torch.bool))))
        condition = transformer.encode_condition(text_BTD, None)
        text_flops, _ = meter.read()

        # 2. The next-scale loop, sampling replaced by teacher tokens (all zero bits). With meta models the tokens and
        #    the summed codes f_hat live on the CPU (a few MB; interpolation has no counted FLOPs): the loop builds
        #    the level index with repeat_interleave, which meta tensors do not support.
        codes_device = device
        teacher = [torch.zeros(B, 1, s[-2], s[-1], d, device=codes_device) for s in scale_schedule]
        mark = list(meter.read())
        kv_tokens = 0

        def on_scale_end(si, state):
            nonlocal kv_tokens
            total, attention = meter.read()
            h, w = int(scale_schedule[si][-2]), int(scale_schedule[si][-1])
            kv_tokens += h * w
            parts = dict(family.current)
            family.current.clear()
            per_scale.append(dict(
                scale_index=si, h=h, w=w, tokens=h * w, kv_tokens=kv_tokens, flops=total - mark[0],
                blocks_flops=parts.get("blocks", 0), head_flops=parts.get("head", 0), embed_flops=parts.get("embed", 0),
                attention_flops=attention - mark[1],
            ))
            mark[:] = [total, attention]

        state = run_next_scale_loop(family, condition, scale_schedule, B, guidance, [0.5] * num_scales,
                                    scheduler=scheduler, teacher_tokens=teacher, on_scale_end=on_scale_end)
        after_loop, _ = meter.read()

        # 3. Decode the summed codes.
        decode_vae.decode(state.f_hat.to(decode_vae.device, decode_vae.dtype))  # on the VAE latent (un-patchified)
        total_flops, _ = meter.read()

    transformer_flops = after_loop - text_flops
    if sum(s["flops"] for s in per_scale) != transformer_flops:  # pragma: no cover - loop bookkeeping guard
        raise RuntimeError("per-scale FLOPs do not add up to the loop's FLOPs")
    breakdown = _block_breakdown(mode.get_flop_counts())
    breakdown["head"] = sum(s["head_flops"] for s in per_scale)
    breakdown["embed"] = sum(s["embed_flops"] for s in per_scale)
    return dict(
        rows=2 * B if cfg else B,
        text_flops=text_flops,
        transformer_flops=transformer_flops,
        vae_flops=total_flops - after_loop,
        total_flops=total_flops,
        attention_core_flops=sum(s["attention_flops"] for s in per_scale),
        per_scale=per_scale,
        transformer_breakdown=breakdown,
    )


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

    ``accel`` is an acceleration spec for :func:`~diffusers_var_accel.schedulers.specs.load_acceleration`
    (``None``/``"baseline"``, ``"fastvar"``, ``"lazyvar"``, ``"fastvar:skip_last_scales=false"``, a config folder).
    ``self_attention="current_pass"`` counts under a convention that drops the attention to the cached prefix
    (:class:`CurrentPassSelfAttnProcessor`); the default ``"cache"`` is the real model.

    Returns the dict of :func:`count_generation_flops` plus TFLOPs fields (``total_tflops``, ``transformer_tflops``,
    ``vae_tflops``, ``text_tflops``; ``tflops`` and ``percent`` in every ``per_scale`` entry), the arguments, and
    ``reference`` (a published total for this model and size, with our ratio to it, or ``None``).

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
        for module in transformer.modules():
            if isinstance(module, InfinitySelfAttention):
                module.set_processor(CurrentPassSelfAttnProcessor())
    decode_vae = loop_vae = build_on_meta(InfinityBSQVAE, **spec.vae)
    scheduler = load_acceleration(accel, "infinity")
    result = count_generation_flops(transformer, loop_vae, schedule, rope_grid_hw(template), cfg=cfg, batch_size=batch_size,
                                    text_tokens=text_tokens, decode_vae=decode_vae, spatial_patchify=spec.spatial_patchify,
                                    scheduler=scheduler)
    result["accel"] = accel or "baseline"
    for key in ("text", "transformer", "vae", "total", "attention_core"):
        result[f"{key}_tflops"] = result[f"{key}_flops"] / _TERA
    for s in result["per_scale"]:
        s["tflops"] = s["flops"] / _TERA
        s["percent"] = 100.0 * s["flops"] / result["total_flops"]
    result["transformer_breakdown_tflops"] = {k: v / _TERA for k, v in result.pop("transformer_breakdown").items()}
    reference = PAPER_REFERENCES.get((model_name, height, width))
    result.update(
        model=model_name, height=height, width=width, cfg=cfg, batch_size=batch_size, text_tokens=text_tokens,
        scale_schedule=[[int(s[-2]), int(s[-1])] for s in schedule],
        total_macs_tera=result["total_flops"] / 2 / _TERA,
        counting="torch.utils.flop_counter.FlopCounterMode on meta tensors: FLOPs = 2 x MACs of matmul/linear/conv/"
                 "attention; element-wise ops not counted; T5 encoder not included",
        vae_note=("8B: official VAE infinity_vae_d56_f8_14_patchify (codebook_dim 14, patch 8, ch_mult [1,2,4,4]) decoding "
                  "the un-patchified summed codes (B, 14, 2h, 2w)" if spec.spatial_patchify else "released d32 VAE (INFINITY_VAE_D32_CONFIG)"),
        reference=None if reference is None else dict(
            source=reference[0], total_tflops=reference[1], ratio=result["total_flops"] / _TERA / reference[1]),
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
    local = count_infinity_flops(model_name, height, width, cfg=cfg, text_tokens=text_tokens, accel=accel,
                                 self_attention="current_pass")
    ca = real["transformer_breakdown_tflops"]["cross_attn_core"]
    return dict(
        accel=real["accel"], cfg=cfg, text_tokens=text_tokens,
        linear=real["transformer_tflops"] - real["attention_core_tflops"] + real["text_tflops"],
        self_attn_cache=real["attention_core_tflops"] - ca,
        self_attn_current_pass=local["attention_core_tflops"] - local["transformer_breakdown_tflops"]["cross_attn_core"],
        cross_attn_core=ca,
        vae_decode=real["vae_tflops"],
        total=real["total_tflops"],
        passes=sum(1 for s in real["per_scale"] if s["flops"] > 0),
        per_scale=[dict(scale_index=s["scale_index"], tokens=s["tokens"], tflops=s["tflops"],
                        attention=s["attention_flops"] / _TERA, current_pass=t["tflops"])
                   for s, t in zip(real["per_scale"], local["per_scale"])],
    )


# ---------------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------------
def format_report(result: Dict[str, Any]) -> str:
    """The per-scale table and the totals, as printed by the script."""
    rows = result["rows"]
    cfg_text = f"CFG on ({rows} rows: {result['batch_size']} cond + {result['batch_size']} uncond)" if result["cfg"] \
        else f"CFG off ({rows} rows)"
    lines = [
        f"{result['model']}  {result['height']}x{result['width']}  batch {result['batch_size']}  {cfg_text}  "
        f"text tokens {result['text_tokens']}",
        "FLOPs = 2 x MAC (torch.utils.flop_counter, meta tensors); element-wise ops and the T5 encoder not counted",
        "",
        f"{'scale':>5} | {'h x w':>9} | {'tokens':>6} | {'kv tokens':>9} | {'transformer TFLOPs':>18} | {'attn core':>9} | {'% of total':>10}",
        f"{'-' * 5}-+-{'-' * 9}-+-{'-' * 6}-+-{'-' * 9}-+-{'-' * 18}-+-{'-' * 9}-+-{'-' * 10}",
    ]
    for s in result["per_scale"]:
        lines.append(f"{s['scale_index']:>5} | {str(s['h']) + 'x' + str(s['w']):>9} | {s['tokens']:>6} | {s['kv_tokens']:>9} | "
                     f"{s['tflops']:>18.3f} | {s['attention_flops'] / _TERA:>9.3f} | {s['percent']:>9.2f}%")
    total_tokens = sum(s["tokens"] for s in result["per_scale"])
    lines.append(f"{'sum':>5} | {'':>9} | {total_tokens:>6} | {'':>9} | {result['transformer_tflops']:>18.3f} | "
                 f"{result['attention_core_tflops']:>9.3f} | {100 * result['transformer_flops'] / result['total_flops']:>9.2f}%")
    lines += ["", "totals (TFLOPs):"]
    for label, key in (("transformer (blocks + head + embed)", "transformer"), ("VAE decode", "vae"),
                       ("text conditioning", "text"), ("total", "total")):
        tf = result[f"{key}_tflops"]
        lines.append(f"  {label:<36} {tf:>9.3f}  ({100 * tf / result['total_tflops']:5.2f}%)")
    lines.append(f"  {'total in MACs (tera)':<36} {result['total_macs_tera']:>9.3f}")
    if "t5_encoder_tflops" in result:
        lines.append(f"  {'T5 encoder (not in total), ' + str(result['t5_tokens']) + ' tok':<36} {result['t5_encoder_tflops']:>9.3f}")
    lines += ["", "transformer by sublayer (TFLOPs, all blocks and scales):"]
    for name, tf in result["transformer_breakdown_tflops"].items():
        lines.append(f"  {name:<36} {tf:>9.3f}")
    ref = result.get("reference")
    if ref is not None:
        lines += ["", f"{ref['source']}: {ref['total_tflops']:.2f} TFLOPs; ours {result['total_tflops']:.2f} TFLOPs; "
                      f"ours / paper = {ref['ratio']:.3f}"]
    lines.append(f"VAE: {result['vae_note']}")
    return "\n".join(lines)


#: Published TFLOPs of accelerated Infinity-2B at 1024x1024 (LazyVAR paper's table; baseline 101.58).
PAPER_METHOD_TFLOPS = {("infinity-2b", 1024, 1024): {"fastvar": 44.15, "lazyvar": 34.32}}


def compare_methods(baseline: Dict[str, Any], accelerated: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Baseline vs methods: totals, ratios (ours and the papers' where published) and per-scale transformer TFLOPs."""
    key = (baseline["model"], baseline["height"], baseline["width"])
    paper = PAPER_METHOD_TFLOPS.get(key, {})
    paper_base = (baseline.get("reference") or {}).get("total_tflops")
    summary = [{"method": "baseline", "total_tflops": baseline["total_tflops"], "transformer_tflops": baseline["transformer_tflops"],
                "ratio": 1.0, "paper_tflops": paper_base, "paper_ratio": 1.0 if paper_base else None}]
    for name, r in accelerated.items():
        base_name = name.split(":")[0].lower()
        p = paper.get(base_name) if base_name == name.lower() else None
        summary.append({"method": name, "total_tflops": r["total_tflops"], "transformer_tflops": r["transformer_tflops"],
                        "ratio": baseline["total_tflops"] / r["total_tflops"],
                        "paper_tflops": p, "paper_ratio": (paper_base / p) if (p and paper_base) else None})
    per_scale = [{"scale_index": s["scale_index"], "h": s["h"], "w": s["w"], "baseline": s["tflops"],
                  **{name: r["per_scale"][i]["tflops"] for name, r in accelerated.items()}}
                 for i, s in enumerate(baseline["per_scale"])]
    return {"model": baseline["model"], "height": baseline["height"], "width": baseline["width"], "cfg": baseline["cfg"],
            "summary": summary, "per_scale": per_scale}


def format_comparison(comparison: Dict[str, Any]) -> str:
    names = [row["method"] for row in comparison["summary"]]
    lines = [f"{comparison['model']} {comparison['height']}x{comparison['width']}, cfg={comparison['cfg']}: TFLOPs per generation",
             f"{'method':<32} {'total':>9} {'transformer':>12} {'ratio':>7} {'paper':>8} {'paper ratio':>12}"]
    for row in comparison["summary"]:
        paper = f"{row['paper_tflops']:.2f}" if row["paper_tflops"] else "-"
        paper_ratio = f"{row['paper_ratio']:.2f}x" if row["paper_ratio"] else "-"
        lines.append(f"{row['method']:<32} {row['total_tflops']:>9.2f} {row['transformer_tflops']:>12.2f} {row['ratio']:>6.2f}x {paper:>8} {paper_ratio:>12}")
    lines += ["", "transformer TFLOPs per scale (a grouped pass is counted on its first scale; skipped scales are 0):",
              "scale |     h x w | " + " | ".join(f"{n[:14]:>14}" for n in names)]
    for s in comparison["per_scale"]:
        lines.append(f"{s['scale_index']:>5} | {str(s['h']) + 'x' + str(s['w']):>9} | " + " | ".join(f"{s[n]:>14.3f}" for n in names))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# HART
# ---------------------------------------------------------------------------------------------------------------------
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

_HART_BLOCK_MODULE = re.compile(r"(?:^|\.)blocks\.\d+\.(attn|ffn)(?:\.(\w+))?$")


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
        return self.head.sample(condition, guidance, initial_noise=zeros, step_noises=[zeros] * self.head.num_steps, **kwargs)


class _MeteredHARTFamily(HARTScaleFamily):
    """HART's loop steps, unchanged, with the FLOPs of each step added to the current scale's record.

    Parts: ``embed`` (start tokens, word + level embeddings), ``blocks``, ``head`` (head AdaLN + codebook logits),
    ``diffusion`` (``diffusion_residual``: the per-token condition ``decoder_norm(x + word_embed(code))`` and the
    sampler's ``net`` evaluations), ``codes`` (the tokenizer's f_hat update: the Phi convolutions). Nested steps
    (the diffusion residual inside ``tokens_to_codes``) are attributed to the innermost one.
    """

    def __init__(self, *args, meter: _Meter, **kwargs):
        super().__init__(*args, **kwargs)
        self.meter = meter
        self.current: Dict[str, int] = defaultdict(int)
        self._nested: List[int] = []
        self._pending_levels: List[Tuple[int, int]] = []

    def _metered(self, part: str, fn, *args):
        before, _ = self.meter.read()
        self._nested.append(0)
        try:
            out = fn(*args)
        finally:
            inner = self._nested.pop()
        spent = self.meter.read()[0] - before
        self.current[part] += spent - inner
        if self._nested:
            self._nested[-1] += spent
        return out

    def start_tokens(self, *a):
        return self._metered("embed", super().start_tokens, *a)

    def embed_inputs(self, inputs_BLd, scale_index_L):
        pending, self._pending_levels = self._pending_levels, []
        if scale_index_L.is_meta and pending:
            # A meta tensor has no values, and HART's family reads the level ids (to pick rows of its level table).
            # The loop built them from the pass's scales, one next_inputs call per scale: rebuild them on the CPU.
            scales, lengths = zip(*pending)
            if sum(lengths) == scale_index_L.shape[0]:
                scale_index_L = torch.repeat_interleave(torch.tensor(scales), torch.tensor(lengths))
        return self._metered("embed", super().embed_inputs, inputs_BLd, scale_index_L)

    def run_blocks(self, *a):
        return self._metered("blocks", super().run_blocks, *a)

    def guided_logits(self, *a):
        return self._metered("head", super().guided_logits, *a)

    def tokens_to_codes(self, *a):
        return self._metered("codes", super().tokens_to_codes, *a)

    def diffusion_residual(self, *a):
        return self._metered("diffusion", super().diffusion_residual, *a)

    def add_codes(self, *a):
        return self._metered("codes", super().add_codes, *a)

    def next_inputs(self, f_hat, scale_index):
        out = self._metered("codes", super().next_inputs, f_hat, scale_index)
        self._pending_levels.append((int(scale_index), int(out.shape[1])))
        return out

    def _sample_head(self, head, z_RLC, guidance, generator, B, L):
        return super()._sample_head(_ZeroNoiseHead(head), z_RLC, guidance, generator, B, L)


def _hart_block_breakdown(flop_counts: Dict[str, Dict[Any, int]]) -> Dict[str, int]:
    """FLOPs of HART's block sublayers, summed over blocks, from the counter's per-module table."""
    per = defaultdict(lambda: defaultdict(int))
    for name, ops in flop_counts.items():
        m = _HART_BLOCK_MODULE.search(name)
        if m is None:
            continue
        for op, v in ops.items():
            per[(m.group(1), m.group(2))]["attention" if _is_attention_op(op) else "linear"] += v
    attn, ffn = per[("attn", None)], per[("ffn", None)]
    out_proj = per[("attn", "proj")]["linear"]
    return {
        "self_attn_qkv_proj": attn["linear"] - out_proj,
        "self_attn_core": attn["attention"],
        "self_attn_out_proj": out_proj,
        "ffn": ffn["linear"] + ffn["attention"],
    }


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
    """FLOPs of one HART generation with these (meta or real) models, driven as :class:`HARTPipeline` drives them.

    Text: ``encode_condition`` on ``B`` rows of zero Qwen2 features ``(B, T, D)`` with positions ``arange(T)`` (the
    pipeline's ``prompt_embeds`` path) plus, under CFG, the ``B`` all-zero unconditional rows of ``null_context``.
    Loop: :func:`run_next_scale_loop` with a :class:`HARTScaleFamily` (``top_k`` None, ``top_p`` 0,
    ``more_smooth=False``), guidance ``1 + HARTPipeline.guidance_schedule(guidance_scale, n)`` (scale 0 has t = 0
    and runs its head on the B conditional rows only), teacher tokens (all zero ids) instead of sampling, and the
    residual diffusion head at the last scale with explicit zero noise. Decode: ``vae.decode(f_hat)``.

    Returns a dict with integer FLOPs: ``text_flops`` (context_norm + context_embed), ``transformer_flops`` (blocks,
    heads and embeddings of every scale, plus any scheduler work outside the family's steps), ``diffusion_flops``
    (condition + ``net`` x sampling steps), ``codes_flops`` (Phi convolutions of the f_hat updates), ``vae_flops``
    (``post_quant_conv`` + decoder), ``total_flops``, ``attention_core_flops`` (QK^T and PV in the loop),
    ``per_scale`` (one dict per scale), ``transformer_breakdown`` and ``rows``.
    """
    config = transformer.config
    device = transformer.context_embed.weight.device
    T, D = config.context_tokens, config.context_dim
    patch_nums = tuple(config.patch_nums)
    num_scales = len(patch_nums)
    weights = HARTPipeline.guidance_schedule(float(guidance_scale) if cfg else 0.0, num_scales)
    use_cfg = any(t != 0 for t in weights)
    B = batch_size

    mode = make_flop_counter()
    meter = _Meter(mode)
    family = _MeteredHARTFamily(transformer, vae, top_k=None, top_p=0.0, more_smooth=False, diffusion_generator=None,
                                use_diffusion_head=use_diffusion_head, meter=meter)
    per_scale: List[Dict[str, Any]] = []
    with mode:
        # 1. Text conditioning, as HARTPipeline.__call__ with prompt_embeds: prompt rows, then null_context rows.
        text = torch.zeros(B, T, D, device=device)
        positions = torch.arange(T, device=device).expand(B, T)
        if use_cfg:
            neg, neg_positions = transformer.null_context(B, device=device)
            text, positions = torch.cat((text, neg)), torch.cat((positions, neg_positions))
        condition = transformer.encode_condition(text, positions)
        text_flops, _ = meter.read()

        # 2. The next-scale loop with teacher tokens (token ids 0) in place of sampling.
        teacher = [torch.zeros(B, pn * pn, dtype=torch.long, device=device) for pn in patch_nums]
        mark = list(meter.read())
        kv_tokens = 0

        def on_scale_end(si, state):
            nonlocal kv_tokens
            total, attention = meter.read()
            side = patch_nums[si]
            kv_tokens += T if si == 0 else side * side  # scale 0's pass runs the context; its 1x1 token is not cached
            parts = dict(family.current)
            family.current.clear()
            flops = total - mark[0]
            known = sum(parts.values())
            blocks, head, embed = parts.get("blocks", 0), parts.get("head", 0), parts.get("embed", 0)
            per_scale.append(dict(
                scale_index=si, h=side, w=side, tokens=side * side, input_tokens=T if si == 0 else side * side,
                kv_tokens=kv_tokens, flops=flops, blocks_flops=blocks, head_flops=head, embed_flops=embed,
                scheduler_flops=flops - known, transformer_flops=blocks + head + embed + flops - known,
                diffusion_flops=parts.get("diffusion", 0), codes_flops=parts.get("codes", 0),
                attention_flops=attention - mark[1],
            ))
            mark[:] = [total, attention]

        state = run_next_scale_loop(family, condition, family.scale_schedule, B, [1.0 + t for t in weights],
                                    [1.0] * num_scales, None, scheduler, teacher, on_scale_end)
        after_loop, _ = meter.read()

        # 3. Decode the summed latent.
        vae.decode(state.f_hat.to(vae.dtype))
        total_flops, _ = meter.read()

    if sum(s["flops"] for s in per_scale) != after_loop - text_flops:  # pragma: no cover - loop bookkeeping guard
        raise RuntimeError("per-scale FLOPs do not add up to the loop's FLOPs")
    breakdown = _hart_block_breakdown(mode.get_flop_counts())
    for key in ("head", "embed", "scheduler"):
        breakdown[key] = sum(s[f"{key}_flops"] for s in per_scale)
    return dict(
        rows=2 * B if use_cfg else B,
        text_flops=text_flops,
        transformer_flops=sum(s["transformer_flops"] for s in per_scale),
        diffusion_flops=sum(s["diffusion_flops"] for s in per_scale),
        codes_flops=sum(s["codes_flops"] for s in per_scale),
        vae_flops=total_flops - after_loop,
        total_flops=total_flops,
        attention_core_flops=sum(s["attention_flops"] for s in per_scale),
        per_scale=per_scale,
        transformer_breakdown=breakdown,
    )


def build_hart_on_meta(name: str = "hart-0.7b", transformer_config: Optional[Dict[str, Any]] = None,
                       tokenizer_config: Optional[Dict[str, Any]] = None):
    """``(HARTTransformer, HARTHybridTokenizer)`` of a released HART config on meta, with optional overrides."""
    if name not in HART_CONFIGS or name not in HART_TOKENIZER_CONFIGS:
        raise ValueError(f"unknown HART model {name!r}; choose one of {sorted(HART_TOKENIZER_CONFIGS)}")
    t_cfg = {**HART_CONFIGS[name], **(transformer_config or {})}
    v_cfg = {**HART_TOKENIZER_CONFIGS[name], **(tokenizer_config or {})}
    v_cfg.setdefault("v_patch_nums", tuple(t_cfg["patch_nums"]))
    return build_on_meta(HARTTransformer, **t_cfg), build_on_meta(HARTHybridTokenizer, **v_cfg)


_HART_TFLOPS_KEYS = ("text", "transformer", "diffusion", "codes", "vae", "total", "attention_core")


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
        keep = T if self_attention == "context_and_current_pass" else 0
        for module in transformer.modules():
            if isinstance(module, HARTAttention):
                module.set_processor(CurrentPassHARTAttnProcessor(keep_prefix=keep))
    scheduler = load_acceleration(accel, "hart")
    result = count_hart_generation_flops(transformer, vae, cfg=guidance, batch_size=batch_size,
                                         guidance_scale=guidance_scale, scheduler=scheduler)
    result["accel"] = accel or "baseline"
    for key in _HART_TFLOPS_KEYS:
        result[f"{key}_tflops"] = result[f"{key}_flops"] / _TERA
    for s in result["per_scale"]:
        s["tflops"] = s["flops"] / _TERA
        s["percent"] = 100.0 * s["flops"] / result["total_flops"]
    result["transformer_breakdown_tflops"] = {k: v / _TERA for k, v in result.pop("transformer_breakdown").items()}
    patch_nums = tuple(transformer.config.patch_nums)
    size = patch_nums[-1] * 2 ** (len(vae.config.ch_mult) - 1)
    paper = HART_PAPER_TFLOPS.get(name, {}) if not (transformer_config or tokenizer_config) else {}
    head = transformer.diffusion_head
    result.update(
        model=name, family="hart", height=size, width=size, cfg=guidance, batch_size=batch_size, text_tokens=T,
        guidance_scale=guidance_scale if guidance else 0.0, self_attention=self_attention,
        scale_schedule=[[pn, pn] for pn in patch_nums], diffusion_steps=head.num_steps,
        total_macs_tera=result["total_flops"] / 2 / _TERA,
        counting="torch.utils.flop_counter.FlopCounterMode on meta tensors: FLOPs = 2 x MACs of matmul/linear/conv/"
                 "attention; element-wise ops not counted; Qwen2 text encoder not included",
        vae_note=(f"HART tokenizer decoder: post_quant_conv + conv decoder ch={vae.config.ch} "
                  f"ch_mult={list(vae.config.ch_mult)} on the {patch_nums[-1]}x{patch_nums[-1]}x{vae.config.z_channels} latent"),
        reference=None if "baseline" not in paper else dict(
            source=HART_PAPER_SOURCE, total_tflops=paper["baseline"], ratio=result["total_tflops"] / paper["baseline"]),
    )
    return result


def format_hart_report(result: Dict[str, Any]) -> str:
    """HART's per-scale table and totals, as printed by the script."""
    rows, B = result["rows"], result["batch_size"]
    cfg_text = (f"CFG on ({rows} rows: {B} cond + {B} uncond, guidance {result['guidance_scale']:g} ramped)"
                if rows == 2 * B else f"CFG off ({rows} rows)")
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
        lines.append(f"{s['scale_index']:>5} | {str(s['h']) + 'x' + str(s['w']):>7} | {s['tokens']:>6} | {s['kv_tokens']:>9} | "
                     f"{s['transformer_flops'] / _TERA:>11.3f} | {s['attention_flops'] / _TERA:>9.3f} | "
                     f"{s['diffusion_flops'] / _TERA:>10.3f} | {s['percent']:>9.2f}%")
    total_tokens = sum(s["tokens"] for s in result["per_scale"])
    loop = sum(s["flops"] for s in result["per_scale"])
    lines.append(f"{'sum':>5} | {'':>7} | {total_tokens:>6} | {'':>9} | {result['transformer_tflops']:>11.3f} | "
                 f"{result['attention_core_tflops']:>9.3f} | {result['diffusion_tflops']:>10.3f} | "
                 f"{100 * loop / result['total_flops']:>9.2f}%")
    lines += ["(scale 0's pass runs the context tokens; the transformer column includes blocks, heads and embeddings)",
              "", "totals (TFLOPs):"]
    for label, key in (("transformer (blocks + head + embed)", "transformer"),
                       (f"diffusion head ({result['diffusion_steps']} steps)", "diffusion"),
                       ("tokenizer decoder", "vae"), ("tokenizer Phi convs (f_hat updates)", "codes"),
                       ("text conditioning (context_embed)", "text"), ("total", "total")):
        tf = result[f"{key}_tflops"]
        lines.append(f"  {label:<38} {tf:>9.3f}  ({100 * tf / result['total_tflops']:6.2f}%)")
    lines.append(f"  {'total in MACs (tera)':<38} {result['total_macs_tera']:>9.3f}")
    lines += ["", "transformer by sublayer (TFLOPs, all blocks and scales):"]
    for key, tf in result["transformer_breakdown_tflops"].items():
        if key != "scheduler" or tf:
            lines.append(f"  {key:<38} {tf:>9.3f}")
    ref = result.get("reference")
    if ref is not None:
        lines += ["", f"{ref['source']}: {ref['total_tflops']:.2f} TFLOPs; ours {result['total_tflops']:.2f} TFLOPs; "
                      f"ours / paper = {ref['ratio']:.3f} (counting conventions differ: docs/flops.md)"]
    lines.append(f"Tokenizer: {result['vae_note']}")
    return "\n".join(lines)


def compare_hart_methods(baseline: Dict[str, Any], accelerated: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """HART baseline vs methods: totals split into transformer / diffusion head / decoder, ratios, papers' numbers."""
    paper = HART_PAPER_TFLOPS.get(baseline["model"], {}) if baseline.get("reference") else {}
    paper_base = paper.get("baseline")

    def row(method, r, p):
        return {"method": method, "total_tflops": r["total_tflops"], "transformer_tflops": r["transformer_tflops"],
                "diffusion_tflops": r["diffusion_tflops"], "vae_tflops": r["vae_tflops"],
                "other_tflops": r["text_tflops"] + r["codes_tflops"],
                "ratio": baseline["total_tflops"] / r["total_tflops"], "paper_tflops": p,
                "paper_ratio": (paper_base / p) if (p and paper_base) else None}

    summary = [row("baseline", baseline, paper_base)]
    for name, r in accelerated.items():
        base_name = name.split(":")[0].lower()
        summary.append(row(name, r, paper.get(base_name) if base_name == name.lower() else None))
    per_scale = [{"scale_index": s["scale_index"], "h": s["h"], "w": s["w"], "baseline": s["tflops"],
                  **{name: r["per_scale"][i]["tflops"] for name, r in accelerated.items()}}
                 for i, s in enumerate(baseline["per_scale"])]
    return {"model": baseline["model"], "height": baseline["height"], "width": baseline["width"], "cfg": baseline["cfg"],
            "summary": summary, "per_scale": per_scale}


def format_hart_comparison(comparison: Dict[str, Any]) -> str:
    names = [row["method"] for row in comparison["summary"]]
    lines = [f"{comparison['model']} {comparison['height']}x{comparison['width']}, cfg={comparison['cfg']}: TFLOPs per generation "
             "(Qwen2 text encoder not included)",
             f"{'method':<32} {'total':>8} {'transformer':>12} {'diff. head':>10} {'decoder':>8} {'other':>6} {'ratio':>7} "
             f"{'paper':>7} {'paper ratio':>12}"]
    for row in comparison["summary"]:
        paper = f"{row['paper_tflops']:.2f}" if row["paper_tflops"] else "-"
        paper_ratio = f"{row['paper_ratio']:.2f}x" if row["paper_ratio"] else "-"
        lines.append(f"{row['method']:<32} {row['total_tflops']:>8.2f} {row['transformer_tflops']:>12.2f} "
                     f"{row['diffusion_tflops']:>10.2f} {row['vae_tflops']:>8.2f} {row['other_tflops']:>6.3f} "
                     f"{row['ratio']:>6.2f}x {paper:>7} {paper_ratio:>12}")
    lines += ["(other = text conditioning + the tokenizer's Phi convolutions; papers' counting conventions differ, "
              "see docs/flops.md)", "",
              "loop TFLOPs per scale (transformer + diffusion head; a grouped pass is counted on its first scale; "
              "skipped scales are 0):",
              "scale |   h x w | " + " | ".join(f"{n[:14]:>14}" for n in names)]
    for s in comparison["per_scale"]:
        lines.append(f"{s['scale_index']:>5} | {str(s['h']) + 'x' + str(s['w']):>7} | " + " | ".join(f"{s[n]:>14.3f}" for n in names))
    return "\n".join(lines)


def hart_flops_components(name: str = "hart-0.7b", accel: Optional[str] = None, guidance: bool = True,
                          batch_size: int = 1) -> Dict[str, Any]:
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
        accel=real["accel"], cfg=guidance,
        linear=real["transformer_tflops"] - real["attention_core_tflops"] + real["text_tflops"],
        self_attn_cache=real["attention_core_tflops"],
        self_attn_context_and_current_pass=ctx["attention_core_tflops"],
        self_attn_current_pass=cur["attention_core_tflops"],
        diffusion=real["diffusion_tflops"],
        vae_decode=real["vae_tflops"] + real["codes_tflops"],
        codes=real["codes_tflops"],
        total=real["total_tflops"],
        passes=sum(1 for s in real["per_scale"] if s["flops"] > 0),
        per_scale=[dict(scale_index=s["scale_index"], tokens=s["tokens"], tflops=s["tflops"],
                        attention=s["attention_flops"] / _TERA, context_and_current_pass=c["tflops"], current_pass=t["tflops"])
                   for s, c, t in zip(real["per_scale"], ctx["per_scale"], cur["per_scale"])],
    )


#: Qwen2-1.5B's shape (HART's text encoder ``mit-han-lab/Qwen2-VL-1.5B-Instruct`` is a Qwen2 1.5B LM, hidden 1536;
#: its own config.json was not available here), for the optional text-encoder count (``--qwen2-tokens``).
QWEN2_1_5B_CONFIG: Dict[str, Any] = dict(
    vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
    num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True,
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


def hart_conventions(components: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Totals of every method under several counting conventions, from :func:`hart_flops_components` results.

    ``components`` maps method names (``"baseline"`` first) to their components. Each returned row has ``convention``,
    ``totals`` (method -> TFLOPs), ``ratios`` (baseline / method) and ``saved`` (baseline - method).
    """
    rules = [
        ("real count: attention over the KV cache + diffusion head + decoder",
         lambda c: c["total"]),
        ("transformer only (real attention)", lambda c: c["linear"] + c["self_attn_cache"]),
        ("transformer + diffusion head (no decoder)", lambda c: c["linear"] + c["self_attn_cache"] + c["diffusion"]),
        ("self-attention to the context + current pass only",
         lambda c: c["total"] - c["self_attn_cache"] + c["self_attn_context_and_current_pass"]),
        ("self-attention within the current pass only",
         lambda c: c["total"] - c["self_attn_cache"] + c["self_attn_current_pass"]),
        ("attention kernels at half weight (1 per MAC)", lambda c: c["total"] - c["self_attn_cache"] / 2),
        ("no attention kernels (linear + conv): diffusion head + decoder",
         lambda c: c["linear"] + c["diffusion"] + c["vae_decode"]),
        ("no attention kernels, no decoder", lambda c: c["linear"] + c["diffusion"]),
        ("no attention kernels, transformer only", lambda c: c["linear"]),
        ("real count in MACs", lambda c: c["total"] / 2),
    ]
    base = components["baseline"]
    rows = []
    for label, rule in rules:
        totals = {m: rule(c) for m, c in components.items()}
        rows.append(dict(convention=label, totals=totals, ratios={m: totals["baseline"] / t for m, t in totals.items()},
                         saved={m: rule(base) - t for m, t in totals.items()}))
    return rows


def format_hart_conventions(model: str, rows: List[Dict[str, Any]]) -> str:
    methods = list(rows[0]["totals"])
    paper = HART_PAPER_TFLOPS.get(model, {})
    shown = [m for m in methods if m != "baseline"]
    head = (f"{'convention (TFLOPs, CFG, 2 FLOPs per MAC unless stated)':<66} {'baseline':>8} "
            + " ".join(f"{m[:10]:>10}" for m in shown) + "   ratios: " + " ".join(f"{m[:8]:>8}" for m in shown)
            + "   saved: " + " ".join(f"{m[:8]:>8}" for m in shown))
    lines = [f"{model}: one generation under counting conventions (Qwen2 text encoder not included)", head]
    if paper:
        p_tot = {m: paper.get(m.lower()) for m in methods}
        lines.append(f"{'papers (' + HART_PAPER_SOURCE + ')':<66} {paper['baseline']:>8.2f} "
                     + " ".join(f"{p_tot[m]:>10.2f}" if p_tot[m] else f"{'-':>10}" for m in shown) + "   ratios: "
                     + " ".join(f"{paper['baseline'] / p_tot[m]:>7.2f}x" if p_tot[m] else f"{'-':>8}" for m in shown)
                     + "   saved: " + " ".join(f"{paper['baseline'] - p_tot[m]:>8.2f}" if p_tot[m] else f"{'-':>8}" for m in shown))
    for row in rows:
        lines.append(f"{row['convention'][:66]:<66} {row['totals']['baseline']:>8.2f} "
                     + " ".join(f"{row['totals'][m]:>10.2f}" for m in shown) + "   ratios: "
                     + " ".join(f"{row['ratios'][m]:>7.2f}x" for m in shown) + "   saved: "
                     + " ".join(f"{row['saved'][m]:>8.2f}" for m in shown))
    return "\n".join(lines)


def _run_hart_cli(args, methods: List[str]) -> int:
    """The script's HART path (``--model hart-...``)."""
    cfg = not args.no_cfg
    config = HART_CONFIGS[args.model]
    size = config["patch_nums"][-1] * 2 ** (len(HART_TOKENIZER_CONFIGS[args.model]["ch_mult"]) - 1)
    if (args.height or size, args.width or size) != (size, size):
        raise ValueError(f"{args.model} generates {size}x{size} images only; got {args.height}x{args.width}")
    if args.text_tokens is not None and args.text_tokens != config["context_tokens"]:
        raise ValueError(f"HART pads every prompt to its {config['context_tokens']} context tokens; --text-tokens does not apply")
    if args.t5_tokens:
        raise ValueError("HART has no T5 encoder; use --qwen2-tokens N to count its Qwen2 text encoder")
    methods = [m for m in methods if m.lower() not in ("baseline", "none")]
    for m in methods:  # fail on a bad spec before counting anything
        load_acceleration(m, "hart")
    if args.conventions:
        components = {"baseline": hart_flops_components(args.model, None, cfg, args.batch_size)}
        components.update({m: hart_flops_components(args.model, m, cfg, args.batch_size) for m in methods})
        rows = hart_conventions(components)
        print(json.dumps({"model": args.model, "cfg": cfg, "conventions": rows}) if args.json
              else format_hart_conventions(args.model, rows))
        return 0
    result = count_hart_flops(args.model, args.batch_size, cfg)
    if methods:
        accelerated = {m: count_hart_flops(args.model, args.batch_size, cfg, accel=m) for m in methods}
        comparison = compare_hart_methods(result, accelerated)
        print(json.dumps(comparison) if args.json else format_hart_comparison(comparison))
        return 0
    report = format_hart_report(result)
    if args.qwen2_tokens > 0:
        result["qwen2_tokens"] = args.qwen2_tokens
        result["qwen2_encoder_tflops"] = count_qwen2_encoder_flops(args.qwen2_tokens, args.batch_size) / _TERA
        report += (f"\nQwen2-1.5B text encoder on {args.qwen2_tokens} tokens x {args.batch_size} prompt(s) "
                   f"(not in the total): {result['qwen2_encoder_tflops']:.3f} TFLOPs")
    print(json.dumps(result) if args.json else report)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="infinity-2b", choices=sorted(MODEL_SPECS) + sorted(HART_TOKENIZER_CONFIGS))
    parser.add_argument("--height", type=int, default=None, help="image height (Infinity default 1024; HART: its one size)")
    parser.add_argument("--width", type=int, default=None, help="image width (Infinity default 1024; HART: its one size)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--text-tokens", type=int, default=None,
                        help=f"Infinity: T5 tokens per prompt (default {DEFAULT_TEXT_TOKENS}, a typical prompt); "
                             "HART always uses its 300 context tokens")
    parser.add_argument("--no-cfg", action="store_true", help="no guidance: only the conditional rows run")
    parser.add_argument("--t5-tokens", type=int, default=0,
                        help="Infinity: also count the flan-t5-xl encoder on this many tokens per prompt (not in the "
                             "total; the official runner pads to 512)")
    parser.add_argument("--qwen2-tokens", type=int, default=0,
                        help="HART: also count the Qwen2-1.5B text encoder on this many tokens per prompt (not in the "
                             "total; the official encoding is the system instruction + the prompt padded to 300)")
    parser.add_argument("--accel", nargs="+", default=None,
                        help="acceleration methods to compare with the baseline, separated by spaces or commas "
                             f"({', '.join(method_names())}, a+b compositions, name:key=value, a config folder)")
    parser.add_argument("--conventions", action="store_true",
                        help="HART: totals of the baseline and the --accel methods under several counting conventions")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--debug", action="store_true", help="show the Python traceback of an error instead of its one-line message")
    args = parser.parse_args(argv)
    methods = split_acceleration_specs(",".join(args.accel or []))
    try:
        if args.model in HART_TOKENIZER_CONFIGS:
            return _run_hart_cli(args, methods)
        if args.qwen2_tokens or args.conventions:
            raise ValueError("--qwen2-tokens and --conventions apply to HART models only")
        height, width = args.height or 1024, args.width or 1024
        text_tokens = DEFAULT_TEXT_TOKENS if args.text_tokens is None else args.text_tokens
        result = count_infinity_flops(args.model, height, width, cfg=not args.no_cfg,
                                      batch_size=args.batch_size, text_tokens=text_tokens)
        accelerated = {m: count_infinity_flops(args.model, height, width, cfg=not args.no_cfg,
                                               batch_size=args.batch_size, text_tokens=text_tokens, accel=m)
                       for m in methods}
    except ValueError as err:
        if args.debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    if methods:
        comparison = compare_methods(result, accelerated)
        print(json.dumps(comparison) if args.json else format_comparison(comparison))
        return 0
    if args.t5_tokens > 0:
        result["t5_tokens"] = args.t5_tokens
        result["t5_encoder_tflops"] = count_t5_encoder_flops(args.t5_tokens, args.batch_size) / _TERA
    print(json.dumps(result) if args.json else format_report(result))
    return 0
