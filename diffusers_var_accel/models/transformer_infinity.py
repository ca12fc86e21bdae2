"""Infinity's text-to-image transformer (FoundationVision/Infinity, arXiv:2412.04431), written from its published facts.

Reads top-down: helpers, attention modules, block, model. The module tree and parameter names follow the official
checkpoints (``sa.mat_qkv``, ``ca.mat_kv``, ``ffn.fc1`` ...) except that the 32 blocks live in ``blocks.{i}`` instead
of ``block_chunks.{c}.module.{j}``; :func:`convert_infinity_checkpoint` maps one to the other.

Shape legend (VAR style): ``B`` prompts, ``R`` rows (``2B`` under CFG: conditional rows first), ``L`` tokens,
``T`` text tokens, ``C`` width, ``D`` text width (T5), ``d`` codebook bits, ``H`` heads, ``c`` head dim.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from functools import partial
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.utils.accelerate_utils import apply_forward_hook

from .lora import VARPeftAdapterMixin
from .step_caches import VARStepCacheMixin
from .attention_processor import FusedProjection, VARAttnProcessor, VARAttentionMixin, VARAttentionModuleMixin
from .dtype_utils import fused_cast_out, linear_input_dtype
from .checkpoint_utils import (
    StrictLoadingMixin,
    build_and_load_sharded_strict,
    build_and_load_strict,
    load_original_state_dict,
    sharded_checkpoint_shapes,
)
from ..next_scale.context import VARForwardContext
from ..next_scale.executor import GatedUpdate, execute_blocks, run_sublayer

#: Official Infinity configurations (``tools/run_infinity.py``); ``block_chunks`` only shapes the official key names.
#: The 8B model (``apply_spatial_patchify=1``) predicts 2x2 patches of the d14 patch-8 VAE's latent bits: 56 bits per
#: token, the token layout of :func:`latent_bits_to_tokens`.
INFINITY_CONFIGS: Dict[str, Dict] = {
    "infinity-2b": dict(
        depth=32,
        embed_dim=2048,
        num_heads=16,
        mlp_ratio=4.0,
        text_channels=2048,
        text_maxlen=512,
        codebook_dim=32,
        block_chunks=8,
    ),
    "infinity-8b": dict(
        depth=40,
        embed_dim=3584,
        num_heads=28,
        mlp_ratio=4.0,
        text_channels=2048,
        text_maxlen=512,
        codebook_dim=56,
        block_chunks=8,
        apply_spatial_patchify=True,
    ),
}

#: Side of the latent patch one token covers when ``apply_spatial_patchify`` is set (the official 2x2 shuffle).
SPATIAL_PATCH = 2


# ---------------------------------------------------------------------------------------------------------------------
# token layout of the spatial-patchify (8B) path
# ---------------------------------------------------------------------------------------------------------------------
def latent_to_tokens(x_Bdhw: torch.Tensor, patch: int) -> torch.Tensor:
    """A latent map ``(B, d, p*h, p*w)`` as token rows ``(B, h*w, p*p*d)``: ``pixel_unshuffle`` by ``patch``.

    Token (i, j) channel ``k = p*p*c + p*r + s`` is latent channel ``c`` at ``(p*i + r, p*j + s)`` (PyTorch's
    ``pixel_unshuffle`` order, the official patchify). ``patch=1`` is a plain flatten.
    """
    if patch != 1:
        x_Bdhw = F.pixel_unshuffle(x_Bdhw, patch)
    B, k = x_Bdhw.shape[:2]
    return x_Bdhw.reshape(B, k, -1).transpose(1, 2)


def tokens_to_latent(x_BLk: torch.Tensor, hw: Tuple[int, int], patch: int) -> torch.Tensor:
    """Inverse of :func:`latent_to_tokens`: token rows ``(B, h*w, p*p*d)`` -> latent map ``(B, d, p*h, p*w)``."""
    B, L, k = x_BLk.shape
    h, w = hw
    if L != h * w:
        raise ValueError(f"{L} tokens do not form a {h}x{w} map")
    x = x_BLk.transpose(1, 2).reshape(B, k, h, w)
    return F.pixel_shuffle(x, patch) if patch != 1 else x


def latent_bits_to_tokens(bits: torch.Tensor, patch: int) -> torch.Tensor:
    """Bits in the VAE layout ``(B, 1, p*h, p*w, d)`` (or without the time axis) -> token layout ``(B, h*w, p*p*d)``."""
    if bits.ndim == 5:
        bits = bits.squeeze(1)
    if bits.ndim != 4:
        raise ValueError(f"latent bits must be (B, 1, H, W, d) or (B, H, W, d), got shape {tuple(bits.shape)}")
    B, H, W, _ = bits.shape
    if H % patch or W % patch:
        raise ValueError(f"a {H}x{W} bit map is not made of {patch}x{patch} patches")
    return latent_to_tokens(bits.permute(0, 3, 1, 2), patch)


def tokens_to_latent_bits(tokens_BLk: torch.Tensor, hw: Tuple[int, int], patch: int) -> torch.Tensor:
    """Token-layout bits ``(B, h*w, p*p*d)`` -> VAE layout ``(B, 1, p*h, p*w, d)`` (the official un-patchify)."""
    return tokens_to_latent(tokens_BLk, hw, patch).permute(0, 2, 3, 1).unsqueeze(1)


#: log(100) as the official code computes it (fp32 tensor -> float): the clamp of the learned attention scale.
_MAX_SCALE_MUL = torch.log(torch.tensor(100.0)).item()


def ffn_hidden_size(embed_dim: int, mlp_ratio: float) -> int:
    """The official FFN width: ``round(C * mlp_ratio / 256) * 256`` (Python rounding), or C when that rounds to 0."""
    return round(embed_dim * mlp_ratio / 256) * 256 or embed_dim


def ada_layer_norm(x_RLC: torch.Tensor, scale_R1C: torch.Tensor, shift_R1C: torch.Tensor, eps: float) -> torch.Tensor:
    """``LayerNorm(x) * (1 + scale) + shift`` in fp32, LayerNorm without affine parameters."""
    return modulated_layer_norm(x_RLC, scale_R1C.add(1), shift_R1C, eps)


def modulated_layer_norm(
    x_RLC: torch.Tensor,
    scale_plus_1_R1C: torch.Tensor,
    shift_R1C: torch.Tensor,
    eps: float,
    out_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """:func:`ada_layer_norm` with ``1 + scale`` given (a per-call constant of every block).

    The modulation is one ``addcmul`` in fp32 (``shift + norm * (1 + scale)``; the official code multiplies, then
    adds: the same within fp32 rounding). ``out_dtype``: the dtype of the result (the next Linear's input dtype, see
    :func:`~diffusers_var_accel.models.dtype_utils.linear_input_dtype`), written by that same kernel; ``None``: fp32."""
    x = F.layer_norm(x_RLC.float(), (x_RLC.shape[-1],), eps=eps)
    out = fused_cast_out(x.shape, x.dtype, out_dtype, x.device)  # fp32: the norm's dtype wins the promotion
    return torch.addcmul(shift_R1C, x, scale_plus_1_R1C, out=out)


class InfinityRMSNorm(nn.Module):
    """RMSNorm with weight, computed in fp32 (the T5-feature norm)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True).add_(self.eps)) * self.weight).to(x.dtype)


# ---------------------------------------------------------------------------------------------------------------------
# attention modules (weights only; math in the processor)
# ---------------------------------------------------------------------------------------------------------------------
class InfinitySelfAttention(nn.Module, VARAttentionModuleMixin):
    """Cosine self-attention with a learned per-head scale and 2D RoPE (weights only)."""

    _default_processor_cls = VARAttnProcessor
    _available_processors = [VARAttnProcessor]
    _supports_qkv_fusion = False

    def __init__(self, embed_dim: int, num_heads: int, layer_idx: int):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
        self.num_heads, self.head_dim, self.layer_idx = num_heads, embed_dim // num_heads, layer_idx
        self.is_cross_attention = False
        self.max_scale_mul = _MAX_SCALE_MUL
        self.softmax_scale = 1.0  # cosine attention: the learned per-head scale replaces 1/sqrt(c)
        self.scale_mul_1H11 = nn.Parameter(torch.full((1, num_heads, 1, 1), 4.0).log())
        self.mat_qkv = FusedProjection(embed_dim, 3 * embed_dim)
        self.q_bias = nn.Parameter(torch.zeros(embed_dim))
        self.v_bias = nn.Parameter(torch.zeros(embed_dim))
        self.register_buffer("zero_k_bias", torch.zeros(embed_dim))
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.set_processor(VARAttnProcessor())

    def forward(
        self,
        hidden_states_RLC,
        context: VARForwardContext,
        rope_cos_sin: Optional[torch.Tensor] = None,
        scale_ids: Optional[torch.Tensor] = None,
    ):
        return self.processor(self, hidden_states_RLC, context=context, rope_cos_sin=rope_cos_sin, scale_ids=scale_ids)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, head_dim={self.head_dim}, layer_idx={self.layer_idx}"


class InfinityCrossAttention(nn.Module, VARAttentionModuleMixin):
    """Cross-attention of image tokens to projected text tokens; with ``for_pooling`` a learned query per head."""

    _default_processor_cls = VARAttnProcessor
    _available_processors = [VARAttnProcessor]
    _supports_qkv_fusion = False

    def __init__(
        self, embed_dim: int, kv_dim: int, num_heads: int, for_pooling: bool = False, layer_idx: Optional[int] = None
    ):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        # the block's index: the text keys/values are a per-call constant stored under it (None: not stored)
        self.layer_idx = layer_idx
        self.is_cross_attention = True
        self.scale = 1 / math.sqrt(self.head_dim)
        if for_pooling:
            self.mat_q = nn.Parameter(torch.zeros(1, num_heads, self.head_dim))
        else:
            self.mat_q = nn.Linear(embed_dim, embed_dim, bias=True)
        self.mat_kv = FusedProjection(kv_dim, 2 * embed_dim)
        self.v_bias = nn.Parameter(torch.zeros(embed_dim))
        self.register_buffer("zero_k_bias", torch.zeros(embed_dim))
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.set_processor(VARAttnProcessor())

    def forward(
        self,
        hidden_states_RLC,
        encoder_hidden_states,
        encoder_attention_mask=None,
        context: Optional[VARForwardContext] = None,
        encoder_rows: Optional[slice] = None,
    ):
        """``encoder_rows``: the rows of ``encoder_hidden_states`` (and its mask) the image rows attend to, when the
        text is given for more rows than run (``None``: one text row per image row)."""
        kwargs = {} if encoder_rows is None else {"encoder_rows": encoder_rows}
        return self.processor(
            self,
            hidden_states_RLC,
            context=context,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            **kwargs,
        )


class InfinityTextPool(nn.Module):
    """Attentive pooling of the T5 tokens into one vector per row (the start token and AdaLN condition)."""

    def __init__(self, text_channels: int, embed_dim: int):
        super().__init__()
        head_dim = 64 if embed_dim > 4096 else 128
        self.ca = InfinityCrossAttention(embed_dim, text_channels, max(text_channels // head_dim, 1), for_pooling=True)

    def forward(self, text_RTD: torch.Tensor, text_mask_R11T: Optional[torch.Tensor]) -> torch.Tensor:
        ca = self.ca
        R, T = text_RTD.shape[:2]
        kv = ca.mat_kv(text_RTD, bias=torch.cat((ca.zero_k_bias, ca.v_bias)))
        k, v = kv.view(R, T, 2, ca.num_heads, ca.head_dim).unbind(dim=2)
        q = ca.mat_q.to(kv.dtype).unsqueeze(0).expand(R, 1, ca.num_heads, ca.head_dim)
        # the kernel is chosen as for every other attention (set_attention_backend / attention_backend context)
        out = ca.processor.attend(q, k, v, text_mask_R11T, ca.scale)
        return ca.proj(out.reshape(R, -1))


class InfinityFeedForward(nn.Module):
    """``fc2(GELU_tanh(fc1(x)))``."""

    def __init__(self, embed_dim: int, hidden_size: int):
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, hidden_size)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden_size, embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


# ---------------------------------------------------------------------------------------------------------------------
# block
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class InfinityCondition:
    """The text conditioning of one call, computed once (rows: conditional first, then unconditional).

    Args:
        cond_RC: attentive-pooled text (start token, AdaLN and head condition).
        ada_R16C: shared AdaLN parameters ``SiLU -> Linear(cond)`` reshaped to (R, 1, 6, C).
        text_RTC: projected text tokens, the cross-attention keys/values source.
        text_mask_R11T: boolean key mask of the padded text, or ``None`` when no row is padded.
    """

    cond_RC: torch.Tensor
    ada_R16C: torch.Tensor
    text_RTC: torch.Tensor
    text_mask_R11T: Optional[torch.Tensor]
    #: ``(condition, rows)`` when this condition is a row selection of another (a CFG-halved pass runs the call's
    #: conditional rows): its per-call constants are the selection of the other's, which earlier passes computed.
    selected_from: Optional[Tuple["InfinityCondition", slice]] = field(default=None, repr=False, compare=False)

    def select_rows(self, rows: slice) -> "InfinityCondition":
        mask = None if self.text_mask_R11T is None else self.text_mask_R11T[rows]
        source, within = self, rows
        if self.selected_from is not None:  # a selection of a selection: rows of the first source
            source, outer = self.selected_from
            picked = range(source.ada_R16C.shape[0])[outer][rows]
            within = slice(picked.start, picked.stop, picked.step)
        return InfinityCondition(self.cond_RC[rows], self.ada_R16C[rows], self.text_RTC[rows], mask, (source, within))

    def constant_source(self) -> Tuple["InfinityCondition", Optional[slice]]:
        """The condition whose per-call constants this one's are (itself, or the one it selects rows of) and the
        rows to take of them (``None``: all)."""
        return (self, None) if self.selected_from is None else self.selected_from


class InfinityBlock(nn.Module):
    """Self-attention, cross-attention and FFN with shared AdaLN (per-block gains ``ada_gss``); the residual stream::

        x = x + gamma1 * SA(LN(x) * (1 + scale1) + shift1)       # cosine self-attention, 2D RoPE, the KV cache
        x = x + CA(LN_ca(x), text)                                # cross-attention to the text tokens
        x = x + gamma2 * FFN(LN(x) * (1 + scale2) + shift2)

    Order of ``ada_gss + shared`` after unbinding: gamma1, gamma2, scale1, scale2, shift1, shift2. When the pass routes
    or records a sublayer of this block, that sublayer's update goes through the executor
    (:func:`~diffusers_var_accel.next_scale.executor.run_sublayer`), which computes it on the route's tokens and fills
    the others: the same three lines, with the routing around each update.
    """

    def __init__(self, embed_dim: int, num_heads: int, mlp_hidden: int, layer_idx: int, norm_eps: float = 1e-6):
        super().__init__()
        self.layer_idx, self.norm_eps = layer_idx, norm_eps
        self.sa = InfinitySelfAttention(embed_dim, num_heads, layer_idx)
        self.ca = InfinityCrossAttention(embed_dim, embed_dim, num_heads, layer_idx=layer_idx)
        self.ffn = InfinityFeedForward(embed_dim, mlp_hidden)
        self.ca_norm = nn.LayerNorm(embed_dim, eps=norm_eps, elementwise_affine=True)
        self.ada_gss = nn.Parameter(torch.zeros(1, 1, 6, embed_dim))

    def forward(self, x: torch.Tensor, condition: InfinityCondition, context: VARForwardContext) -> torch.Tensor:
        gamma1, gamma2, scale1_plus_1, scale2_plus_1, shift1, shift2 = self.modulation(condition, context)
        eps = self.norm_eps
        # each Linear's input is written in its input dtype by the modulation itself (no separate cast kernel)
        qkv_dtype = linear_input_dtype(self.sa.mat_qkv, x.device)
        fc1_dtype = linear_input_dtype(self.ffn.fc1, x.device)
        routes = context.routes
        if routes is None or not routes.acts_on_layer(self.layer_idx):  # every token: the stream as written above
            # x + gamma * update in one kernel (addcmul: the product is not rounded first)
            x = torch.addcmul(
                x, self.sa(modulated_layer_norm(x, scale1_plus_1, shift1, eps, qkv_dtype), context), gamma1
            )
            x = x + self.cross_attention(x, context, condition)
            return torch.addcmul(x, self.ffn(modulated_layer_norm(x, scale2_plus_1, shift2, eps, fc1_dtype)), gamma2)

        def self_attn(x_sub, ctx):
            return GatedUpdate(
                self.sa(modulated_layer_norm(x_sub, scale1_plus_1, shift1, eps, qkv_dtype), ctx), gamma1
            )

        def ffn(x_sub, ctx):
            return GatedUpdate(self.ffn(modulated_layer_norm(x_sub, scale2_plus_1, shift2, eps, fc1_dtype)), gamma2)

        x = run_sublayer(self.layer_idx, "self_attn", x, self_attn, context)
        x = run_sublayer(self.layer_idx, "cross_attn", x, partial(self.cross_attention, condition=condition), context)
        return run_sublayer(self.layer_idx, "ffn", x, ffn, context)

    def cross_attention(self, x: torch.Tensor, context: VARForwardContext, condition: InfinityCondition):
        """``CA(LN_ca(x), text)``: the update of the tokens ``x`` (the layer norm in fp32, whatever the weights' dtype,
        as the official bf16 inference), attending to the text rows of the call's condition."""
        norm = self.ca_norm
        weight, bias = context.cached(("ca_norm", self.layer_idx), lambda: (norm.weight.float(), norm.bias.float()))
        x_norm = F.layer_norm(x.float(), norm.normalized_shape, weight, bias, norm.eps)
        source, rows = condition.constant_source()
        # the text keys/values of the call's rows (a per-call constant); a halved pass attends to its rows of them
        out = self.ca(x_norm, source.text_RTC, source.text_mask_R11T, context, encoder_rows=rows)
        # The update is fp32 as the official code. Where it is only added to an fp32 stream (no route or record at
        # this level, whatever the pass routes elsewhere; ``x + out`` promotes to the same values) or scattered
        # (which casts), the cast would be one more kernel per block, so it is left to the addition.
        routes = context.routes
        plain = routes is None or not routes.acts_on_sublayer(self.layer_idx, "cross_attn")
        return out if plain and x.dtype == torch.float32 else out.float()

    def modulation(self, condition: InfinityCondition, context: VARForwardContext):
        """``gamma1, gamma2, 1 + scale1, 1 + scale2, shift1, shift2`` of this block for the rows of ``condition``: the
        AdaLN terms of the call's rows, once per call; a CFG-halved pass takes its rows of them (row-wise: the same
        values, and no kernel)."""
        source, rows = condition.constant_source()
        terms = context.cached(("ada", self.layer_idx, source.ada_R16C.shape[0]), lambda: self._modulation(source))
        return terms if rows is None else tuple(t[rows] for t in terms)

    def _modulation(self, condition: InfinityCondition):
        """``gamma1, gamma2, 1 + scale1, 1 + scale2, shift1, shift2`` of this block: constant for the call."""
        gamma1, gamma2, scale1, scale2, shift1, shift2 = (self.ada_gss + condition.ada_R16C).unbind(2)
        return gamma1, gamma2, scale1.add(1), scale2.add(1), shift1, shift2


class InfinityHeadNorm(nn.Module):
    """AdaLN before the head, conditioned on the pooled text: ``LN(x) * (1 + scale) + shift``."""

    def __init__(self, embed_dim: int, norm_eps: float = 1e-6):
        super().__init__()
        self.norm_eps = norm_eps
        self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(embed_dim, 2 * embed_dim))

    def modulation(self, cond_RC: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(1 + scale, shift)``, each ``(R, 1, C)``: they depend only on the condition rows (constant for a call)."""
        scale, shift = self.ada_lin(cond_RC).view(-1, 1, 2, cond_RC.shape[-1]).unbind(2)
        return scale.add(1), shift

    def forward(
        self,
        x_RLC: torch.Tensor,
        cond_RC: Optional[torch.Tensor] = None,
        modulation: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> torch.Tensor:
        """Pass ``cond_RC``, or its :meth:`modulation` when the caller keeps it for the call (same values)."""
        if modulation is None:
            if cond_RC is None:
                raise ValueError("InfinityHeadNorm needs cond_RC or its modulation")
            modulation = self.modulation(cond_RC)
        scale_plus_1, shift = modulation
        return modulated_layer_norm(x_RLC, scale_plus_1, shift, self.norm_eps)


# ---------------------------------------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------------------------------------
class InfinityTransformer(
    StrictLoadingMixin,
    VARStepCacheMixin,  # before ModelMixin: its named_modules refuses diffusers' step-cache apply_* walks
    ModelMixin,
    ConfigMixin,
    VARAttentionMixin,
    VARPeftAdapterMixin,
):
    r"""The Infinity transformer: bitwise next-scale prediction conditioned on T5 text features.

    It holds weights only: the KV cache and everything else that lives for one generation belongs to the caller
    (the next-scale loop, ``next_scale/``). One :meth:`forward` runs the blocks over the tokens of one scale (or one group of
    scales); :meth:`encode_condition`, :meth:`embed_start`, :meth:`embed_scale_inputs` and :meth:`head` are the other
    steps of the official ``autoregressive_infer_cfg``.

    Args:
        depth (`int`, defaults to 32): number of blocks.
        embed_dim (`int`, defaults to 2048): width C.
        num_heads (`int`, defaults to 16): attention heads.
        mlp_ratio (`float`, defaults to 4.0): FFN width ratio (rounded to a multiple of 256).
        text_channels (`int`, defaults to 2048): width of the T5 features.
        text_maxlen (`int`, defaults to 512): rows of the learned unconditional text ``cfg_uncond``.
        codebook_dim (`int`, defaults to 32): bits per token (the head predicts 2 logits per bit). With
            ``apply_spatial_patchify`` a token is a 2x2 patch of VAE latents: ``codebook_dim = 4 * d_vae``.
        num_levels (`int`, defaults to 15): rows of the level (scale-index) embedding.
        norm_eps (`float`, defaults to 1e-6): LayerNorm / RMSNorm epsilon.
        block_chunks (`int`, defaults to 8): how the official checkpoint groups the blocks (key names only).
        scale_schedule (`list[tuple[int, int, int]]`, *optional*): a fixed ``(1, h, w)`` schedule the model was
            trained for (one resolution, RoPE on its final grid), as the embedded shapes model; `None` (official
            models): the 15 aspect templates x 4 pixel budgets of the official code.
        apply_spatial_patchify (`bool`, defaults to `False`): the official flag of the 8B model: each token is a 2x2
            patch of the VAE latent (bits, next-scale inputs and codes are ``pixel_unshuffle``-d by 2; see
            :func:`latent_to_tokens`); the VAE latent is twice the token map per side.
    """

    _supports_gradient_checkpointing = False
    _no_split_modules = ["InfinityBlock"]
    # regional compilation (``compile_repeated_blocks``) compiles these once per token count, shared by every block:
    # the feed-forward networks are pure functions of their tokens. A whole ``InfinityBlock`` is not: its layer index
    # keys its KV-cache slot and per-call constants, so dynamo would compile one graph per block and shape (past its
    # recompile limit at 32 blocks).
    _repeated_blocks = ["InfinityFeedForward"]
    _skip_layerwise_casting_patterns = ["norm", "lvl_embed", "pos_start", "cfg_uncond"]
    # group offloading (models/group_offload.py): the blocks move group by group; the rest is read by the loop outside
    # ``forward`` and stays on the device for the call, as does each block's cross-attention norm at leaf level (the
    # block takes its fp32 copy, never calling the norm)
    _group_offload_streamed_modules = ("blocks",)
    _group_offload_resident_in_streamed = ("ca_norm",)
    _lora_refused_modules = {
        "lvl_embed": "the start token reads level 0's row of its weight directly (embed_start), so a LoRA would "
        "not reach scale 0",
    }

    @register_to_config
    def __init__(
        self,
        depth: int = 32,
        embed_dim: int = 2048,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
        text_channels: int = 2048,
        text_maxlen: int = 512,
        codebook_dim: int = 32,
        num_levels: int = 15,
        norm_eps: float = 1e-6,
        block_chunks: int = 8,
        scale_schedule: Optional[Sequence[Sequence[int]]] = None,
        apply_spatial_patchify: bool = False,
    ):
        super().__init__()
        if not isinstance(apply_spatial_patchify, bool):
            raise ValueError(f"apply_spatial_patchify must be True or False, got {apply_spatial_patchify!r}")
        if apply_spatial_patchify and codebook_dim % (SPATIAL_PATCH * SPATIAL_PATCH):
            raise ValueError(
                f"apply_spatial_patchify needs codebook_dim divisible by {SPATIAL_PATCH**2} "
                f"(a {SPATIAL_PATCH}x{SPATIAL_PATCH} patch of latent bits), got {codebook_dim}"
            )
        if scale_schedule is not None:
            schedule = [tuple(int(v) for v in s) for s in scale_schedule]
            if (
                not schedule
                or any(len(s) != 3 or s[0] != 1 or min(s) < 1 for s in schedule)
                or len(schedule) > num_levels
            ):
                raise ValueError(
                    f"scale_schedule must be 1..{num_levels} scales (1, h, w) with h, w >= 1; got {scale_schedule!r}"
                )
            # the stored configuration holds plain lists, so a JSON round trip gives the same config
            self.register_to_config(scale_schedule=[list(s) for s in schedule])
        C = embed_dim
        # 1. text conditioning
        self.cfg_uncond = nn.Parameter(torch.zeros(text_maxlen, text_channels))
        self.text_norm = InfinityRMSNorm(text_channels, eps=norm_eps)
        self.text_proj_for_sos = InfinityTextPool(text_channels, C)
        self.text_proj_for_ca = nn.Sequential(
            nn.Linear(text_channels, C), nn.GELU(approximate="tanh"), nn.Linear(C, C)
        )
        self.shared_ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(C, 6 * C))
        # 2. inputs
        self.pos_start = nn.Parameter(torch.zeros(1, 1, C))
        self.lvl_embed = nn.Embedding(num_levels, C)
        self.word_embed = nn.Linear(codebook_dim, C)
        # 3. trunk and head
        hidden = ffn_hidden_size(C, mlp_ratio)
        self.blocks = nn.ModuleList([InfinityBlock(C, num_heads, hidden, i, norm_eps) for i in range(depth)])
        self.head_nm = InfinityHeadNorm(C, norm_eps)
        self.head = nn.Linear(C, 2 * codebook_dim)
        self.refuse_step_cache_hooks()

    @property
    def token_patch_size(self) -> int:
        """Latent positions per token along each axis: 2 with ``apply_spatial_patchify`` (8B), else 1."""
        return SPATIAL_PATCH if self.config.get("apply_spatial_patchify", False) else 1

    # -- conditioning ------------------------------------------------------------------------------------------------
    @apply_forward_hook
    def null_text_embeds(self, encoder_attention_mask_BT: torch.Tensor) -> torch.Tensor:
        """The learned unconditional text for prompts padded to ``T`` tokens: ``cfg_uncond[:T]`` per row."""
        B, T = encoder_attention_mask_BT.shape
        if T > self.cfg_uncond.shape[0]:
            raise ValueError(
                f"text length {T} exceeds text_maxlen={self.cfg_uncond.shape[0]} of the unconditional embedding"
            )
        return self.cfg_uncond[:T].unsqueeze(0).expand(B, T, -1)

    @apply_forward_hook
    def encode_condition(
        self,
        encoder_hidden_states_RTD: torch.Tensor,
        encoder_attention_mask_RT: Optional[torch.Tensor],
        padded: Optional[bool] = None,
    ) -> InfinityCondition:
        """Text norm, attentive pooling, cross-attention projection and the shared AdaLN (once per call).

        A mask without padding is dropped (unmasked attention kernels). ``padded`` says whether any row of the mask
        is padded when the caller knows it on the host (from the tokenizer's lengths); ``None`` reads it from the
        mask, one host read before the generation starts."""
        mask = None
        if encoder_attention_mask_RT is not None:
            if padded is None:
                padded = not bool(encoder_attention_mask_RT.bool().all())
            if padded:
                mask = encoder_attention_mask_RT.bool()[:, None, None, :]
        text = self.text_norm(encoder_hidden_states_RTD.float())
        cond_RC = self.text_proj_for_sos(text, mask)
        text_RTC = self.text_proj_for_ca(text)
        C = cond_RC.shape[-1]
        ada_R16C = self.shared_ada_lin(cond_RC.float()).float().reshape(-1, 1, 6, C)
        return InfinityCondition(cond_RC, ada_R16C, text_RTC, mask)

    # -- inputs ------------------------------------------------------------------------------------------------------
    @apply_forward_hook
    def embed_start(self, condition: InfinityCondition) -> torch.Tensor:
        """Tokens of scale 0: pooled text + ``pos_start`` + level 0, shape (R, 1, C)."""
        x = condition.cond_RC.unsqueeze(1) + self.pos_start
        return x + self.lvl_embed.weight[0]

    @apply_forward_hook
    def embed_scale_inputs(self, inputs_RLd: torch.Tensor, level_index_L: torch.Tensor) -> torch.Tensor:
        """``word_embed`` of the up/down-sampled summed codes plus each token's level embedding."""
        return self.word_embed(inputs_RLd) + self.lvl_embed(level_index_L)

    @apply_forward_hook
    def rope_cos_sin(self, positions_L2: torch.Tensor) -> torch.Tensor:
        """cos/sin ``(2, 1, 1, L, c/2)`` for tokens at (row, col) on the RoPE grid: rows use the first c/4 pairs."""
        # inverse frequencies in fp32, c/4 values shared by rows and columns (official rope2d, base 10000)
        # built on the model's device: no host data is uploaded (positions from rope_positions(..., device=))
        half = (self.config.embed_dim // self.config.num_heads) // 2
        device = self.pos_start.device
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, half, 2, dtype=torch.int64, device=device).float() / half))
        pos = positions_L2.to(device, torch.float32)
        angles = torch.cat((pos[:, :1] * inv_freq, pos[:, 1:] * inv_freq), dim=-1)
        return torch.stack((angles.cos(), angles.sin()), dim=0)[:, None, None]

    @staticmethod
    def rope_positions(height: int, width: int, grid_hw: Tuple[int, int], device=None) -> torch.Tensor:
        """(row, col) of each token of an ``height x width`` map on the 1M grid: ``round(i * Hf / h)``, half to even."""
        Hf, Wf = grid_hw
        rows = (torch.arange(height, device=device) * (Hf / height)).round().int()
        cols = (torch.arange(width, device=device) * (Wf / width)).round().int()
        return torch.stack((rows[:, None].expand(height, width), cols[None, :].expand(height, width)), dim=-1).reshape(
            -1, 2
        )

    # -- trunk and head ----------------------------------------------------------------------------------------------
    def forward(
        self, hidden_states_RLC: torch.Tensor, condition: InfinityCondition, context: VARForwardContext
    ) -> torch.Tensor:
        """Run every block over this pass's tokens; the context carries the KV cache, RoPE and any token routing
        (whole-block routes, mixtures and block records through the executor; a block routes its own sublayers)."""
        routes = context.routes
        if routes is not None and routes.acts_on_blocks:
            return execute_blocks(self.blocks, hidden_states_RLC, condition, context)
        for block in self.blocks:
            hidden_states_RLC = block(hidden_states_RLC, condition, context)
        return hidden_states_RLC

    @apply_forward_hook
    def head_logits(
        self,
        hidden_states_RLC: torch.Tensor,
        cond_RC: Optional[torch.Tensor] = None,
        head_modulation: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> torch.Tensor:
        """Raw bit logits ``(R, L, 2d)``: channel ``2k`` / ``2k+1`` is the logit of bit ``k`` being 0 / 1.

        ``head_modulation`` (from :meth:`head_modulation` of the same rows) replaces ``cond_RC``: a caller that runs
        the head at every scale of a call computes the head's AdaLN terms once."""
        if head_modulation is None:
            if cond_RC is None:
                raise ValueError("head_logits needs cond_RC or head_modulation")
            head_modulation = self.head_modulation(cond_RC)
        return self.head(self.head_nm(hidden_states_RLC.float(), modulation=head_modulation))

    @apply_forward_hook
    def head_modulation(self, cond_RC: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The head AdaLN's ``(1 + scale, shift)`` for the condition rows ``cond_RC`` (constant for a call)."""
        return self.head_nm.modulation(cond_RC.float())

    # -- official checkpoints ----------------------------------------------------------------------------------------
    @classmethod
    def from_original_checkpoint(
        cls,
        path_or_state_dict: Union[str, os.PathLike, Dict[str, torch.Tensor]],
        config: Optional[Union[str, Dict]] = None,
        torch_dtype: Optional[torch.dtype] = None,
        apply_spatial_patchify: Optional[bool] = None,
    ) -> "InfinityTransformer":
        """Load an official Infinity checkpoint, strictly.

        Args:
            path_or_state_dict: a ``.pth`` (read with ``torch.load(..., weights_only=True)``), a ``.safetensors`` file,
                a sharded folder (``model.safetensors.index.json`` + shards, the released 8B layout, official
                ``checkpoint_type='torch_shard'``: read shard by shard into a model built on the meta device, so the
                weights are never held twice), or a state dict with the official key names.
            config: a name from ``INFINITY_CONFIGS``, a config dict, or ``None`` to infer it from the tensor shapes.
            torch_dtype: cast the weights to this dtype.
            apply_spatial_patchify: the official 8B flag, which the weights' shapes cannot tell; overrides the config's
                value (``None``: the config's, or ``False`` for an inferred config).

        Raises:
            ValueError: missing, unexpected or mis-shaped keys (all of them listed); a corrupt shard (named).
            FileNotFoundError: the file, or a shard the index names.
        """
        if not isinstance(path_or_state_dict, dict) and os.path.isdir(os.fspath(path_or_state_dict)):
            shapes = sharded_checkpoint_shapes(path_or_state_dict)
            state_dict = None
        else:
            state_dict = load_original_state_dict(path_or_state_dict)
            shapes = state_dict
        if isinstance(config, str):
            if config not in INFINITY_CONFIGS:
                raise ValueError(f"unknown Infinity config {config!r}; known: {sorted(INFINITY_CONFIGS)}")
            config = INFINITY_CONFIGS[config]
        config = (
            {k: v for k, v in dict(config).items() if not k.startswith("_")}
            if config is not None
            else infer_infinity_config(shapes)
        )
        if apply_spatial_patchify is not None:
            config["apply_spatial_patchify"] = apply_spatial_patchify
        what = "Infinity transformer checkpoint"
        convert = lambda sd, expected: convert_infinity_checkpoint(sd)  # noqa: E731
        if state_dict is None:
            return build_and_load_sharded_strict(cls, config, path_or_state_dict, what, torch_dtype, convert=convert)
        return build_and_load_strict(cls, config, state_dict, what, torch_dtype, convert=convert)


_CHUNK_KEY = re.compile(r"^block_chunks\.(\d+)\.module\.(\d+)\.(.*)$")


def convert_infinity_checkpoint(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Official key names -> ours: ``block_chunks.{c}.module.{j}.X`` -> ``blocks.{c * per_chunk + j}.X``.

    ``per_chunk`` is read from the keys (the largest ``j`` + 1). Other keys are unchanged; keys that are already in our
    layout (``blocks.{i}.X``) pass through.
    """
    per_chunk = 1 + max((int(m.group(2)) for k in state_dict if (m := _CHUNK_KEY.match(k))), default=-1)
    out = {}
    for key, value in state_dict.items():
        m = _CHUNK_KEY.match(key)
        out[f"blocks.{int(m.group(1)) * per_chunk + int(m.group(2))}.{m.group(3)}" if m else key] = value
    return out


def infer_infinity_config(state_dict: Dict[str, torch.Tensor]) -> Dict:
    """Architecture numbers read from an official (or converted) state dict's shapes."""
    sd = convert_infinity_checkpoint(state_dict)
    required = [
        "pos_start",
        "cfg_uncond",
        "word_embed.weight",
        "lvl_embed.weight",
        "blocks.0.sa.scale_mul_1H11",
        "blocks.0.ffn.fc1.weight",
    ]
    missing = [k for k in required if k not in sd]
    if missing:
        raise ValueError(f"cannot infer the Infinity config: the checkpoint lacks {missing}")
    C = sd["pos_start"].shape[-1]
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    num_heads = sd["blocks.0.sa.scale_mul_1H11"].shape[1]
    hidden = sd["blocks.0.ffn.fc1.weight"].shape[0]
    chunk_ids = {int(m.group(1)) for k in state_dict if (m := _CHUNK_KEY.match(k))}
    return dict(
        depth=depth,
        embed_dim=C,
        num_heads=num_heads,
        mlp_ratio=hidden / C,
        text_channels=sd["cfg_uncond"].shape[1],
        text_maxlen=sd["cfg_uncond"].shape[0],
        codebook_dim=sd["word_embed.weight"].shape[1],
        num_levels=sd["lvl_embed.weight"].shape[0],
        block_chunks=len(chunk_ids) if chunk_ids else 1,
    )
