"""Attention processors of the VAR transformers: the module owns the weights, the processor owns the math.

``VARAttnProcessor`` is the dense reference path of Infinity's attention (cosine self-attention with 2D RoPE and the
per-call KV cache; plain cross-attention to the text). It computes on whatever tokens it is given, so sparse methods
reuse it on gathered tokens. Every attention call goes through ``diffusers``' ``dispatch_attention_fn``: the kernel is
the backend set on the model (``transformer.set_attention_backend("flash")``), else the registry's active backend
(``with attention_backend("_native_math"): ...``, or the ``DIFFUSERS_ATTN_BACKEND`` variable; PyTorch SDPA,
``"native"``, by default).

A grouped pass (several scales in one forward) is block-causal: the queries of scale ``j`` see the cached keys and the
keys of scales ``<= j``. Backends that refuse a mask (flash-attn, sage, flex, cuDNN ...), and SDPA on CUDA (where a
mask keeps it off its flash kernel), get one mask-free call per scale, whose keys are a prefix of the pass; the tokens
per scale come from shapes (``context.token_scale_lengths``), never from the device. Elsewhere (SDPA on the CPU, the
tested reference; xformers) the boolean mask is used (``grouped_attention`` chooses; the two agree within float
rounding, see ``tests/test_attention_backends.py``).

Per-call constants (the concatenated q/zero-k/v bias, q's learned scale, the text's cross-attention keys/values) are
taken from ``context.call_cache`` and the RoPE tables from ``context.pass_cache``; q and k are normalised and rotated
as one stacked ``(R, L, 2, H, c)`` tensor, the normalisation and q's scale as one per-token factor, the rotation
as one ``addcmul`` that writes the attention's dtype: within float rounding of the reference forms, fewer kernels.

Both families' processors run one self-attention, :meth:`VARAttnProcessor.__call__` (they differ in ``project_qkv``
and the RoPE pairing only); its keys/values go through the public hook ``processor.key_value_source`` (``None``: the
KV cache itself), which the FLOP meter uses for its counting conventions. How a grouped pass attends (the kernel, one
call per scale or a mask) is decided once per pass (:class:`AttentionChoice`). :func:`get_active_backend` is the
registry's active backend for the modules that need it.

Shape legend: ``R`` rows, ``L`` query tokens, ``S`` key tokens, ``H`` heads, ``c`` head dim, ``C`` width.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from diffusers.models.attention import AttentionMixin, AttentionModuleMixin
from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry, dispatch_attention_fn

from ..next_scale.context import VARForwardContext, block_causal_mask, gather_rope_tables
from .dtype_utils import fused_cast_out

#: Backends that take a boolean ``attn_mask`` as a kernel input. Every other backend either refuses a mask (flash-attn,
#: sage, cuDNN) or turns it into a dense score modification (flex), so grouped passes go to them one scale at a time.
BACKENDS_TAKING_BOOL_MASK = frozenset(
    ("native", "_native_math", "_native_efficient", "_native_xla", "_native_npu", "xformers")
)


def get_active_backend() -> str:
    """The name of the attention backend ``diffusers`` runs where no processor sets one: the registry's active backend
    (``with attention_backend("flash"): ...``, the ``DIFFUSERS_ATTN_BACKEND`` variable; ``"native"`` by default).

    The one reader of diffusers' private registry state in this library: other modules ask here."""
    backend = _AttentionBackendRegistry._active_backend
    return getattr(backend, "value", backend)


def resolve_backend(explicit: Union[str, AttentionBackendName, None]) -> str:
    """The name of the backend ``dispatch_attention_fn`` will run: the one set on the processor, else the registry's
    active one (names are compared as strings: no enum construction, which TorchDynamo may not trace)."""
    return get_active_backend() if explicit is None else getattr(explicit, "value", explicit)


def apply_rope_2d(x_RHLc: torch.Tensor, rope_cos_sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent channel pairs ``(2m, 2m+1)`` by the angles whose cos/sin are ``rope_cos_sin[0]`` / ``[1]``.

    The reference form of :func:`rotate_pairs` (which the processor uses; the two agree bit for bit)."""
    cos, sin = rope_cos_sin[0], rope_cos_sin[1]
    pairs = x_RHLc.reshape(*x_RHLc.shape[:-1], -1, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((cos * x0 - sin * x1, sin * x0 + cos * x1), dim=-1)
    return rotated.reshape(x_RHLc.shape)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(x1, x2) -> (-x2, x1)`` over the two halves of the last dim (llama's RoPE pairing: channel j with j + c/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope_half(x_RHLc: torch.Tensor, rope_cos_sin: torch.Tensor) -> torch.Tensor:
    """Llama-style RoPE with full-width cos/sin tables ``(2, R, 1, L, c)``: ``x * cos + rotate_half(x) * sin``.

    The reference form of :func:`rotate_pairs` with :func:`half_pairing_tables` (bit for bit the same)."""
    return x_RHLc * rope_cos_sin[0] + rotate_half(x_RHLc) * rope_cos_sin[1]


def adjacent_pairing_tables(rope_cos_sin: torch.Tensor, signs: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Infinity's ``(2, 1 or R, 1, L, c/2)`` table as ``(2, 1 or R, L, 1, 1, c)`` multipliers of :func:`rotate_pairs`
    for tokens laid out ``(R, L, n, H, c)``: ``[cos, cos]`` and ``[-sin, sin]`` per channel pair.

    ``x0 cos + x1 (-sin)`` is ``cos x0 - sin x1`` bit for bit (negation is exact, ``a + (-b)`` is ``a - b``) and
    ``x1 cos + x0 sin`` is ``sin x0 + cos x1`` (addition commutes), so the rotation keeps its values exactly.
    ``signs`` (:func:`adjacent_pairing_signs`, kept by the caller for the call) makes it one multiply by +-1
    (exact); without it, one copy and one in-place negation."""
    if signs is not None:
        tables = rope_cos_sin[:, :, 0, :, :, None] * signs  # (2, 1 or R, L, c/2, 2)
    else:
        tables = rope_cos_sin[:, :, 0, :, :, None].expand(*rope_cos_sin[:, :, 0].shape, 2).contiguous()
        tables[1, ..., 0].neg_()
    return tables.flatten(-2)[:, :, :, None, None, :]


def adjacent_pairing_signs(rope_cos_sin: torch.Tensor) -> torch.Tensor:
    """``(2, 1, 1, 1, 2)`` factors ``[[1, 1], [-1, 1]]`` of :func:`adjacent_pairing_tables`, filled on the table's
    device (no host data is uploaded)."""
    signs = torch.ones(2, 1, 1, 1, 2, dtype=rope_cos_sin.dtype, device=rope_cos_sin.device)
    signs[1, ..., 0].fill_(-1)  # a fill, not a copy from a host scalar
    return signs


def half_pairing_tables(
    rope_cos_sin: torch.Tensor, dtype: torch.dtype, signs: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """HART's ``(2, R, 1, L, c)`` table as ``(2, R, L, 1, 1, c)`` multipliers of :func:`rotate_pairs` (halves
    swapped): ``cos`` and ``[-sin_1, sin_2]``, in ``dtype``. ``x2 (-sin)`` is ``(-x2) sin`` bit for bit.
    ``signs`` (:func:`half_pairing_signs`) makes it one multiply by +-1 (exact) and the cast."""
    if signs is not None:
        return (rope_cos_sin[:, :, 0] * signs).to(dtype)[:, :, :, None, None, :]
    cos, sin = rope_cos_sin[0, :, 0], rope_cos_sin[1, :, 0]  # (R, L, c)
    sin1, sin2 = sin.chunk(2, dim=-1)
    tables = torch.stack((cos, torch.cat((-sin1, sin2), dim=-1))).to(dtype)
    return tables[:, :, :, None, None, :]


def half_pairing_signs(rope_cos_sin: torch.Tensor) -> torch.Tensor:
    """``(2, 1, 1, c)`` factors of :func:`half_pairing_tables`: ones, and ``-1`` on the first half of the sines."""
    c = rope_cos_sin.shape[-1]
    signs = torch.ones(2, 1, 1, c, dtype=rope_cos_sin.dtype, device=rope_cos_sin.device)
    signs[1, ..., : c // 2].fill_(-1)
    return signs


def rotate_pairs(
    x_RLnHc: torch.Tensor, tables: torch.Tensor, halves: bool, out_dtype: Optional[torch.dtype] = None
) -> torch.Tensor:
    """RoPE on tokens laid out ``(R, L, n, H, c)`` (q and k stacked on ``n``): ``x * cos + swap(x) * sin'``, where
    ``swap`` exchanges the channels of each pair (adjacent channels, or the two halves when ``halves``) and the
    tables come from :func:`adjacent_pairing_tables` / :func:`half_pairing_tables`.

    Four kernels for q and k (the swap, two products, their sum), bit for bit the reference forms
    :func:`apply_rope_2d` / :func:`apply_rope_half`. With ``out_dtype`` (the attention's dtype, when it differs from
    the rotation's) the sum and the cast are one ``addcmul`` writing ``out_dtype``: three kernels, within float
    rounding of rotating, then casting (``swap(x) * sin`` is not rounded before the addition)."""
    c = x_RLnHc.shape[-1]
    pairs = x_RLnHc.unflatten(-1, (2, c // 2) if halves else (c // 2, 2))
    swapped = pairs.flip(-2 if halves else -1).flatten(-2)
    cos_part = x_RLnHc * tables[0]
    result_dtype = (
        cos_part.dtype if tables.dtype == cos_part.dtype else torch.promote_types(cos_part.dtype, tables.dtype)
    )
    out = fused_cast_out(
        torch.broadcast_shapes(cos_part.shape, tables.shape[1:]), result_dtype, out_dtype, x_RLnHc.device
    )
    if out is None:  # nothing to cast: the reference's rounding (swap(x) * sin rounded before the addition)
        return cos_part + swapped * tables[1]
    return torch.addcmul(cos_part, swapped, tables[1], out=out)


class FusedProjection(nn.Linear):
    """A fused q/k/v (or k/v) projection: an ``nn.Linear`` with no bias of its own, whose bias is given at the call
    (the official layout keeps q's and v's biases beside it and k has none; their concatenation is a per-call
    constant): ``F.linear(x, weight, bias)``, one GEMM with the bias in it.

    The attention calls it as a module, never reads its weight, so whatever wraps it applies: a peft LoRA layer
    passes the call's ``bias`` to this base layer and adds its low-rank update; hooks (offload, layerwise casting)
    run. The state-dict names are a Linear's (``weight``)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return F.linear(x, self.weight, bias)


def fused_qkv(
    attn, hidden_states_RLC: torch.Tensor, projection: nn.Module, context: Optional[VARForwardContext] = None
):
    """q, k, v as ``(R, L, H, c)`` views of one fused projection with q and v biases and no k bias (both families),
    laid out ``(R, L, 3, H, c)``; the concatenated bias is a per-call constant. ``projection`` is a
    :class:`FusedProjection` or what wraps it (a LoRA layer), called as a module."""
    R, L, C = hidden_states_RLC.shape
    bias = _call_cached(
        context, ("qkv_bias", attn.layer_idx), lambda: torch.cat((attn.q_bias, attn.zero_k_bias, attn.v_bias))
    )
    return projection(hidden_states_RLC, bias=bias).view(R, L, 3, attn.num_heads, attn.head_dim)


def _call_cached(context: Optional[VARForwardContext], key, compute):
    return compute() if context is None else context.cached(key, compute)


def _qk_multipliers(attn) -> torch.Tensor:
    """``(1, 1, 2, H, 1)``: q's learned scale ``exp(min(scale_mul, max))``, and 1 for k (``k * 1`` is exact)."""
    scale_mul_H = attn.scale_mul_1H11.clamp_max(attn.max_scale_mul).exp().view(-1)
    return torch.stack((scale_mul_H, torch.ones_like(scale_mul_H))).view(1, 1, 2, -1, 1)


def _cosine_qk(
    attn, qk_RL2Hc: torch.Tensor, context: Optional[VARForwardContext], eps: Optional[float]
) -> torch.Tensor:
    """q and k L2-normalised together (``F.normalize``: the norm clamped at ``eps``, 1e-12 by default), q times its
    learned per-head scale: one multiply of q and k by a per-token factor ``scale / norm`` (the division runs on the
    ``(R, L, 2, H, 1)`` norms, not on every channel; within float rounding of normalising, then scaling)."""
    norm = torch.linalg.vector_norm(qk_RL2Hc, dim=-1, keepdim=True).clamp_min(1e-12 if eps is None else eps)
    multipliers = _call_cached(context, ("qk_multipliers", attn.layer_idx), lambda: _qk_multipliers(attn))
    return qk_RL2Hc * multipliers.div(norm)


def _explicit_attention(q_RHLc, k_RHSc, v_RHSc, scale: float, mask_LS: Optional[torch.Tensor]):
    """Softmax attention that also returns the probabilities ``(R, H, L, S)`` (only for scales that read them)."""
    scores = torch.matmul(q_RHLc, k_RHSc.transpose(-1, -2))
    if scale != 1.0:  # Infinity's softmax scale is 1 (q carries it): a multiply by 1 would be an exact copy
        scores = scores * scale
    if mask_LS is not None:
        scores = scores.masked_fill(~mask_LS, float("-inf"))
    probs = scores.softmax(dim=-1)
    return torch.matmul(probs, v_RHSc), probs


#: The most probabilities ``R x H x queries x S`` one block of :func:`attention_with_key_mean` holds (16 Mi elements:
#: 64 MiB in fp32; the scores and probabilities of a block take a few times that); a larger map goes block by block.
KEY_MEAN_BLOCK_ELEMENTS = 1 << 24


def attention_with_key_mean(
    q_RHLc, k_RHSc, v_RHSc, scale: float, mask_LS: Optional[torch.Tensor], max_elements: int = KEY_MEAN_BLOCK_ELEMENTS
):
    """Softmax attention and the attention each key receives, averaged over heads and queries ``(R, S)`` (fp32).

    When the ``(R, H, L, S)`` probabilities fit in ``max_elements`` this is :func:`_explicit_attention` and one mean
    (the same kernels and bits as before); beyond, the queries are taken in blocks whose probabilities fit, each
    block's column sums are accumulated in fp32 and divided once by ``H L``: the full map never exists (ARVAR's
    saliency at Infinity-2B's 40² scale: 840 MB of fp32 probabilities per recorded layer in one piece). Softmax is
    per query, so every probability is the same; the sums and the output GEMM of a block round within fp32 of the
    single call."""
    R, H, L, _ = q_RHLc.shape
    S = k_RHSc.shape[-2]
    rows = max(1, max_elements // max(1, R * H * S))
    if rows >= L:
        out, probs = _explicit_attention(q_RHLc, k_RHSc, v_RHSc, scale, mask_LS)
        return out, probs.mean(dim=(1, 2), dtype=torch.float32)  # accumulated in fp32, no fp32 copy of the map
    outs, total = [], None
    for start in range(0, L, rows):
        end = min(start + rows, L)
        mask = None if mask_LS is None else mask_LS[..., start:end, :]
        out, probs = _explicit_attention(q_RHLc[:, :, start:end], k_RHSc, v_RHSc, scale, mask)
        outs.append(out)
        part = probs.sum(dim=(1, 2), dtype=torch.float32)
        total = part if total is None else total + part
    return torch.cat(outs, dim=2), total / (H * L)


@dataclass(frozen=True)
class AttentionChoice:
    """How a pass's attention runs, decided once per pass (and processor backend): ``backend``, the kernel's name;
    ``per_scale``, whether a grouped pass attends one scale at a time (no mask); ``takes_bool_mask``, whether the
    kernel takes a boolean mask."""

    backend: str
    per_scale: bool
    takes_bool_mask: bool


class VARAttnProcessor:
    """Dense attention of Infinity's self- and cross-attention modules.

    Self-attention (``encoder_hidden_states is None``): q/k L2-normalised, q scaled by the learned per-head scale
    (clamped at 100), 2D RoPE on q and k, keys/values appended to the per-call ``ScaleKVCache``, softmax with scale 1.
    Cross-attention: plain scaled attention of the image tokens to the projected text tokens of their own sample.
    """

    #: Set by ``ModelMixin.set_attention_backend``; ``None`` passes ``backend=None`` so the registry's active backend
    #: (``attention_backend(...)`` context, ``DIFFUSERS_ATTN_BACKEND``) decides.
    _attention_backend = None
    _parallel_config = None
    #: Heads per attention call (``enable_attention_slicing``); ``None`` attends with every head at once.
    slice_size: Optional[int] = None
    #: How a grouped pass keeps its block-causal structure: ``"mask"`` (one call with a boolean mask), ``"per_scale"``
    #: (one mask-free call per scale) or ``"auto"`` (the mask where the backend takes one, else per scale).
    grouped_attention: Literal["auto", "mask", "per_scale"] = "auto"
    #: Public hook of the self-attention's keys/values: ``None`` (the real model) or a callable ``cache -> view`` that
    #: the self-attention stores and reads the keys/values through. The view takes the cache's
    #: ``update(key_RHLc, value_RHLc, layer_idx, cache_rows=None, row_start=0) -> (keys, values)`` (it must store them,
    #: so later passes see the shapes of the real run) and ``get_seq_length(layer_idx)`` (the cached keys the queries
    #: see before their own pass). The FLOP meter sets it to count attention to the current pass's keys only
    #: (:mod:`diffusers_var_accel.lab.bench.flops`); set it on a copy of the processor, per module.
    key_value_source: Optional[Callable[[Any], Any]] = None

    def _attend_block_causal(
        self, q_RLHc, k_RSHc, v_RSHc, cache_length: int, scale_ids: torch.Tensor, scale
    ) -> torch.Tensor:
        """Block-causal attention of a grouped pass without a mask: the queries of scale ``j`` attend to the cache and
        the pass's keys of scales ``<= j``, one call per scale, outputs put back at their positions.

        ``scale_ids`` is ``(L,)`` (every row holds the same tokens) or ``(R, L)`` (routed tokens, rows computed one at a
        time). Where the ids do not decrease along the pass (the loop's order) the keys of a call are a prefix of the
        keys, so nothing is gathered.
        """
        if scale_ids.dim() == 2:
            rows = [
                self._attend_block_causal(
                    q_RLHc[r : r + 1], k_RSHc[r : r + 1], v_RSHc[r : r + 1], cache_length, scale_ids[r], scale
                )
                for r in range(q_RLHc.shape[0])
            ]
            return torch.cat(rows, dim=0)
        if bool((scale_ids[1:] >= scale_ids[:-1]).all()):
            _, counts = torch.unique_consecutive(scale_ids, return_counts=True)
            parts, start = [], 0
            for count in counts.tolist():
                end = start + count
                keys = slice(0, cache_length + end)
                parts.append(self.attend(q_RLHc[:, start:end], k_RSHc[:, keys], v_RSHc[:, keys], None, scale))
                start = end
            return torch.cat(parts, dim=1)
        out = torch.empty_like(q_RLHc)
        cache_index = torch.arange(cache_length, device=scale_ids.device)
        for scale_id in torch.unique(scale_ids).tolist():
            query_index = (scale_ids == scale_id).nonzero().squeeze(1)
            key_index = torch.cat((cache_index, cache_length + (scale_ids <= scale_id).nonzero().squeeze(1)))
            out[:, query_index] = self.attend(
                q_RLHc[:, query_index], k_RSHc[:, key_index], v_RSHc[:, key_index], None, scale
            )
        return out

    def _grouped_pass_mask(
        self,
        context: VARForwardContext,
        cache_length: int,
        scale_ids: torch.Tensor,
        dtype: torch.dtype,
        additive: bool,
        backend: str,
    ) -> torch.Tensor:
        """The block-causal mask of a grouped pass, built once per pass for the pass's own tokens (every layer has
        the same cache length and ids). ``additive``: for PyTorch's SDPA, the ``0 / -inf`` float mask in the
        queries' dtype that SDPA would make of the boolean one at every call (the same values)."""
        additive = additive and backend == "native"

        def build():
            mask = block_causal_mask(cache_length, scale_ids)
            if additive:
                mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
            return mask

        if scale_ids is not context.token_scale_ids:  # ids given for other tokens than the context's own
            return build()
        return context.pass_cached(("block_causal_mask", cache_length, dtype if additive else torch.bool), build)

    def _attend_scale_prefixes(self, q_RLHc, k_RSHc, v_RSHc, cache_length: int, lengths, scale) -> torch.Tensor:
        """Block-causal attention of a grouped pass whose tokens are in scale order with ``lengths[j]`` tokens of
        scale ``j`` (known from shapes): the queries of scale ``j`` attend to the cache and the first
        ``sum(lengths[:j+1])`` keys of the pass, one mask-free call per scale. Nothing is read from the device."""
        parts, start = [], 0
        for count in lengths:
            if count == 0:  # a scale that keeps no token here
                continue
            end = start + count
            keys = slice(0, cache_length + end)
            parts.append(self.attend(q_RLHc[:, start:end], k_RSHc[:, keys], v_RSHc[:, keys], None, scale))
            start = end
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def attend(self, q_RLHc, k_RSHc, v_RSHc, mask, scale) -> torch.Tensor:
        """``dispatch_attention_fn`` on (R, L, H, c) tensors with this processor's backend, ``slice_size`` heads at a
        time when slicing is on (heads are independent, so slicing only bounds the size of the score tensor of one
        call)."""
        H = q_RLHc.shape[2]
        backend = self._attention_backend
        if self.slice_size is None or self.slice_size >= H:
            return dispatch_attention_fn(q_RLHc, k_RSHc, v_RSHc, attn_mask=mask, scale=scale, backend=backend)
        parts = []
        for h0 in range(0, H, self.slice_size):
            heads = slice(h0, h0 + self.slice_size)
            sub_mask = mask
            if mask is not None and mask.ndim == 4 and mask.shape[1] == H:
                sub_mask = mask[:, heads]
            parts.append(
                dispatch_attention_fn(
                    q_RLHc[:, :, heads],
                    k_RSHc[:, :, heads],
                    v_RSHc[:, :, heads],
                    attn_mask=sub_mask,
                    scale=scale,
                    backend=backend,
                )
            )
        return torch.cat(parts, dim=2)

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        context: Optional[VARForwardContext] = None,
        rope_cos_sin: Optional[torch.Tensor] = None,
        scale_ids: Optional[torch.Tensor] = None,
        encoder_hidden_states: Optional[torch.Tensor] = None,
        encoder_attention_mask: Optional[torch.Tensor] = None,
        encoder_rows: Optional[slice] = None,
    ) -> torch.Tensor:
        """Self-attention of ``hidden_states`` (the family's q/k/v, normalisation and RoPE by :meth:`project_qkv`;
        keys and values into the per-call KV cache or the view ``key_value_source`` makes of it; a grouped pass's
        block-causal structure; recorded maps; the kernel; the output projection), or cross-attention to
        ``encoder_hidden_states`` when given.

        ``rope_cos_sin`` / ``scale_ids`` describe the given tokens (gathered ones when a route selected them);
        ``None``: the context's own.
        """
        if encoder_hidden_states is not None:
            return self._cross_attention(
                attn, hidden_states, encoder_hidden_states, encoder_attention_mask, context, encoder_rows
            )
        if encoder_rows is not None:
            raise ValueError("encoder_rows selects rows of the text of a cross-attention; self-attention has none")
        R, L, C = hidden_states.shape
        scale_ids = context.token_scale_ids if scale_ids is None else scale_ids
        q, k, v = self.project_qkv(attn, hidden_states, rope_cos_sin, context)  # (R, L, H, c)
        k_all, v_all = k, v
        cache = context.kv_cache
        if cache is not None and self.key_value_source is not None:
            cache = self.key_value_source(cache)
        cache_length = cache.get_seq_length(attn.layer_idx) if cache else 0
        record = attn.layer_idx in context.record_attention_layers
        mask, per_scale_lengths = None, None
        if scale_ids is not None:  # several scales in one pass: block-causal over the cache and the pass
            choice = self.attention_choice(context, hidden_states.device)
            lengths = context.token_scale_lengths(L)
            per_scale = choice.per_scale and not record
            if per_scale and lengths is None and choice.takes_bool_mask and self.grouped_attention == "auto":
                per_scale = False  # tokens per scale unknown: a device-built mask rather than reading ids on the host
            if per_scale and lengths is None and context.static_pass:
                raise ValueError(
                    f"layer {attn.layer_idx}: a grouped pass whose tokens carry no count per scale attends scale by "
                    f"scale only by reading the scale ids on the host (backend {choice.backend!r}, grouped_attention="
                    f"{self.grouped_attention!r}), which a captured or compiled pass cannot do: give the route its "
                    "scale_counts, use a backend that takes a mask (native SDPA) with grouped_attention 'auto' or "
                    "'mask', or run the passes eagerly (pipe.disable_cuda_graphs())"
                )
            if not per_scale:
                mask = self._grouped_pass_mask(context, cache_length, scale_ids, q.dtype, not record, choice.backend)
            else:
                per_scale_lengths = lengths if lengths is not None else "host"
        if cache is not None:
            # the cache holds (R, H, S, c); these are views of the (R, L, H, c) projections, copied once into it
            if context.cache_rows is not None and context.cache_rows != R:
                # CFG halving: only these rows ran; their keys/values stand in for the other rows of the cache
                k_all, v_all = cache.update(
                    k.transpose(1, 2),
                    v.transpose(1, 2),
                    attn.layer_idx,
                    cache_rows=context.cache_rows,
                    row_start=context.cache_row_start,
                )
            else:
                k_all, v_all = cache.update(k.transpose(1, 2), v.transpose(1, 2), attn.layer_idx)
            k_all, v_all = k_all.transpose(1, 2), v_all.transpose(1, 2)
        if record:  # the probabilities are kept: an explicit softmax
            if context.attention_map == "full":
                out, maps = _explicit_attention(
                    q.transpose(1, 2), k_all.transpose(1, 2), v_all.transpose(1, 2), attn.softmax_scale, mask
                )
            else:  # reduced as it is computed: full maps of every layer at 1M pixels take gigabytes
                out, maps = attention_with_key_mean(
                    q.transpose(1, 2), k_all.transpose(1, 2), v_all.transpose(1, 2), attn.softmax_scale, mask
                )
            context.attention_maps[attn.layer_idx] = maps
            out = out.transpose(1, 2)
        elif per_scale_lengths == "host":
            out = self._attend_block_causal(q, k_all, v_all, cache_length, scale_ids, attn.softmax_scale)
        elif per_scale_lengths is not None:
            out = self._attend_scale_prefixes(q, k_all, v_all, cache_length, per_scale_lengths, attn.softmax_scale)
        else:
            out = self.attend(q, k_all, v_all, mask, attn.softmax_scale)
        return attn.proj(out.reshape(R, L, C))

    def attention_choice(self, context: VARForwardContext, device: torch.device) -> AttentionChoice:
        """The pass's :class:`AttentionChoice` for this processor's backend, decided at its first grouped attention
        and kept in ``context.decisions`` (shared by every token set of the pass)."""
        key = ("attention", self._attention_backend, self.grouped_attention, device.type)

        def decide() -> AttentionChoice:
            backend = resolve_backend(self._attention_backend)
            return AttentionChoice(backend, self.uses_per_scale_calls(device), backend in BACKENDS_TAKING_BOOL_MASK)

        return context.decided(key, decide)

    # -- self-attention -------------------------------------------------------------------------------------------
    def project_qkv(
        self,
        attn,
        hidden_states_RLC: torch.Tensor,
        rope_cos_sin: torch.Tensor,
        context: Optional[VARForwardContext] = None,
    ):
        """q, k, v as ``(R, L, H, c)`` with cosine normalisation, per-head scale and RoPE applied (q and k together)."""
        qkv = fused_qkv(attn, hidden_states_RLC, attn.mat_qkv, context)
        qk = _cosine_qk(attn, qkv[:, :, :2], context, eps=1e-12)
        tables = self._rope_tables(rope_cos_sin, context, qk.dtype)
        q, k = rotate_pairs(qk, tables, halves=False, out_dtype=self._attention_dtype(qk.device)).unbind(2)
        return q, k, qkv[:, :, 2]

    def _attention_dtype(self, device: torch.device) -> Optional[torch.dtype]:
        """The dtype q and k are written in (``None``: the rotation's own). Under autocast v comes out of its projection
        in the autocast dtype: q and k are written in it too, before the KV cache, whatever the backend (SDPA would
        cast them itself, and the recorded-map path's matmuls do too, so for it the values are the same with no cast
        of q and of the whole cache per pass; flash-attn and the other kernels refuse q, k and v of mixed dtypes)."""
        device_type = device.type
        if device_type == "meta" or not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)

    def _rope_tables(self, rope_cos_sin: Optional[torch.Tensor], context: Optional[VARForwardContext], dtype):
        """The tables of :func:`rotate_pairs`, once per pass when they are the context's own; their sign factors
        once per call when the context has a call cache. Gathered tokens (``context.rope_source``) take the outer
        context's tables at their positions: one gather per token set, the outer tables built once per pass."""
        if rope_cos_sin is not None:
            return self.rope_tables(rope_cos_sin, dtype, self._rope_signs(rope_cos_sin, context))
        key = ("rope_tables", type(self).__name__, dtype)
        if context.rope_source is not None:
            outer, index_RK = context.rope_source
            return context.pass_cached(
                key, lambda: gather_rope_tables(self._rope_tables(None, outer, dtype), index_RK)
            )
        table = context.rope_cos_sin
        return context.pass_cached(key, lambda: self.rope_tables(table, dtype, self._rope_signs(table, context)))

    def _rope_signs(self, table: torch.Tensor, context: Optional[VARForwardContext]) -> Optional[torch.Tensor]:
        """The sign factors of :meth:`rope_tables`, once per call when the context has a call cache."""
        if context is None or context.call_cache is None:
            return None
        return context.cached(
            ("rope_signs", type(self).__name__, table.dtype, table.device, table.shape[-1]),
            lambda: self.rope_signs(table),
        )

    @staticmethod
    def rope_tables(
        rope_cos_sin: torch.Tensor, dtype: torch.dtype, signs: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        return adjacent_pairing_tables(rope_cos_sin, signs)

    @staticmethod
    def rope_signs(rope_cos_sin: torch.Tensor) -> torch.Tensor:
        """The per-call sign factors of :meth:`rope_tables` for tables like ``rope_cos_sin``."""
        return adjacent_pairing_signs(rope_cos_sin)

    def uses_per_scale_calls(self, device: Optional[torch.device] = None) -> bool:
        """Whether a grouped pass runs one mask-free call per scale with the backend that is active now.

        ``"auto"``: per scale where the backend takes no mask, and on CUDA also for the SDPA backends (a mask keeps
        SDPA off its flash kernel); the masked call elsewhere (the CPU reference)."""
        if self.grouped_attention not in ("auto", "mask", "per_scale"):
            raise ValueError(
                f"grouped_attention must be 'auto', 'mask' or 'per_scale', got {self.grouped_attention!r}"
            )
        if self.grouped_attention != "auto":
            return self.grouped_attention == "per_scale"
        backend = resolve_backend(self._attention_backend)
        if backend not in BACKENDS_TAKING_BOOL_MASK:
            return True
        return device is not None and device.type == "cuda" and backend == "native"

    # -- cross-attention ------------------------------------------------------------------------------------------
    def _cross_attention(
        self, attn, hidden_states_RLC, text_RTC, text_mask_R11T, context=None, text_rows: Optional[slice] = None
    ):
        """``text_rows``: the rows of the text (keys, values, mask) the image rows attend to; ``None``: all. The
        keys/values are computed for every text row once per call, so a pass on fewer rows takes a view of them."""
        R, L, C = hidden_states_RLC.shape
        T = text_RTC.shape[1]

        def text_kv():  # a GEMM over the text per block: constant for the call
            kv = attn.mat_kv(text_RTC, bias=torch.cat((attn.zero_k_bias, attn.v_bias)))
            return kv.view(text_RTC.shape[0], T, 2, attn.num_heads, attn.head_dim).unbind(dim=2)

        layer = getattr(attn, "layer_idx", None)
        k, v = text_kv() if layer is None else _call_cached(context, ("cross_kv", layer, text_RTC.shape[0]), text_kv)
        if text_rows is not None:
            k, v = k[text_rows], v[text_rows]
            text_mask_R11T = None if text_mask_R11T is None else text_mask_R11T[text_rows]
        q = attn.mat_q(hidden_states_RLC).view(R, L, attn.num_heads, attn.head_dim)
        out = self.attend(q, k, v, text_mask_R11T, attn.scale)
        return attn.proj(out.reshape(R, L, C))


class HARTAttnProcessor(VARAttnProcessor):
    """HART's llama attention: q/v biases, optional cosine normalisation, llama-pairing RoPE with per-row tables.

    Everything else (KV cache, grouped-pass mask, CFG-halving rows, recorded maps, kernel choice) is the shared
    self-attention of :class:`VARAttnProcessor`; the softmax scale is the module's ``softmax_scale``
    (``0.25 / sqrt(c)`` without cosine normalisation, as the official model). There is no cross-attention.
    """

    def project_qkv(
        self,
        attn,
        hidden_states_RLC: torch.Tensor,
        rope_cos_sin: torch.Tensor,
        context: Optional[VARForwardContext] = None,
    ):
        qkv = fused_qkv(attn, hidden_states_RLC, attn.qkv_proj, context)
        qk = qkv[:, :, :2]
        if attn.attn_l2_norm:
            qk = _cosine_qk(attn, qk, context, eps=None)
        tables = self._rope_tables(rope_cos_sin, context, qk.dtype)
        q, k = rotate_pairs(qk, tables, halves=True, out_dtype=self._attention_dtype(qk.device)).unbind(2)
        return q, k, qkv[:, :, 2]

    @staticmethod
    def rope_tables(
        rope_cos_sin: torch.Tensor, dtype: torch.dtype, signs: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        return half_pairing_tables(rope_cos_sin, dtype, signs)

    @staticmethod
    def rope_signs(rope_cos_sin: torch.Tensor) -> torch.Tensor:
        return half_pairing_signs(rope_cos_sin)


class VARAttentionModuleMixin(AttentionModuleMixin):
    """``AttentionModuleMixin`` for the VAR attention modules: only this library's processors are accepted.

    diffusers' processors (``AttnProcessor2_0``, ``FluxAttnProcessor`` ...) expect ``to_q`` / ``to_k`` / ``to_v``
    projections and know nothing of the per-call KV cache, the 2D RoPE or the block-causal mask of grouped scales,
    so they cannot compute this attention; they are refused when set instead of failing at the first call.
    """

    def set_processor(self, processor) -> None:
        allowed = tuple(self._available_processors)
        if not isinstance(processor, allowed):
            names = ", ".join(cls.__name__ for cls in allowed)
            raise ValueError(
                f"{type(processor).__name__} cannot run {type(self).__name__}: its q/k/v live in one fused projection "
                f"and the attention needs the next-scale KV cache and RoPE; allowed processors: {names} (or subclasses)"
            )
        super().set_processor(processor)

    def set_attention_slice(self, slice_size: Optional[int]) -> None:
        """Attend ``slice_size`` heads at a time (``None``: all heads in one call). Same outputs, smaller peaks."""
        if slice_size is not None and (
            isinstance(slice_size, bool) or not isinstance(slice_size, int) or not 1 <= slice_size <= self.num_heads
        ):
            raise ValueError(
                f"slice_size must be an int in [1, {self.num_heads}] (heads per slice) or None, got {slice_size!r}"
            )
        processor = copy.copy(
            self.processor
        )  # keeps its attention backend; a processor shared by modules stays unchanged
        processor.slice_size = slice_size
        self.processor = processor


class VARAttentionMixin(AttentionMixin):
    """``AttentionMixin`` for the VAR transformers: attention slicing, and an explicit answer to q/k/v fusion."""

    def set_attention_slice(self, slice_size: Union[str, int, None]) -> None:
        """Attention slicing over heads, as ``DiffusionPipeline.enable_attention_slicing`` asks for it.

        Args:
            slice_size (`str`, `int` or `None`): ``"auto"`` attends half the heads at a time, ``"max"`` one head at a
                time, an int that many heads at a time; ``None`` turns slicing off.
        """
        modules = [m for m in self.modules() if isinstance(m, VARAttentionModuleMixin)]
        for module in modules:
            if slice_size == "auto":
                size = max(module.num_heads // 2, 1)
            elif slice_size == "max":
                size = 1
            elif slice_size is None or isinstance(slice_size, int):
                size = slice_size
            else:
                raise ValueError(f"slice_size must be 'auto', 'max', an int or None, got {slice_size!r}")
            module.set_attention_slice(size)

    def fuse_qkv_projections(self) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} already stores q, k and v as one Linear per attention (the official checkpoint "
            "layout: mat_qkv / qkv_proj for self-attention, mat_kv for Infinity's cross-attention); there are no "
            "separate projections to fuse"
        )

    def unfuse_qkv_projections(self) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} keeps q, k and v in one Linear (the official checkpoint layout); splitting it "
            "would change the weight names the checkpoints load into"
        )
