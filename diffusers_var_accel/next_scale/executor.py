"""The one executor of acceleration plans, shared by Infinity and HART: every gather, fill, scatter and record.

A model's ``forward`` hands its blocks to :func:`execute_blocks`; each block describes its sublayers and passes each
through :func:`run_sublayer`. What happens is read from the pass's :class:`~.plan.PassRoutes` (``context.routes``):

* a **block route** ``(layer, "block")``: the block runs on the route's tokens; the other positions take the route's
  fill (the input unchanged, an earlier scale's interpolated output, or the input plus an earlier scale's upsampled
  layer delta); an ``inner`` route selects again among the kept tokens (nested selections).
* consecutive block routes with the **same index and a pass-through fill** form one span: the tokens are gathered
  once before its first block and scattered once after its last (LazyVAR's kept tokens run every block with one
  gather and one scatter). Within a span only the tokens' own values change, so this equals a gather and scatter
  per block.
* a **sublayer route** ``(layer, "self_attn" | "cross_attn" | "ffn")``: the sublayer computes its update on the
  route's tokens (chosen from the residual stream by a selector when the route has one, as FastVAR's pivotal tokens);
  the other positions' update is the fill (zero, or an earlier scale's interpolated update).
* **records**: full block outputs, block deltas (output minus input) and full sublayer updates of the requested
  layers are kept in ``context.records`` for later scales.

Without routes every token runs every layer and nothing else happens: the dense path is the reference.

Shape legend: ``R`` rows, ``L`` tokens of the pass, ``K`` tokens a route keeps, ``C`` width, ``l`` tokens of an
earlier scale.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Callable, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from .context import VARForwardContext
from .work import tally
from .plan import FILL_MODES, SUBLAYER_KINDS, EarlierScale, LayerProxy, MixingRoute, PassThrough, TokenRoute


class GatedUpdate(NamedTuple):
    """A residual update ``value * gate`` left unmultiplied, so that the dense path adds it to the stream in one
    kernel (``addcmul``: ``x + value * gate``) instead of two; every other use materialises it (:meth:`resolve`).

    The fields: ``value``, the sublayer's output ``(R, L, C)``; ``gate``, its per-row gain broadcast over the tokens
    (Infinity's AdaLN ``gamma``, ``(R, 1, C)``).
    """

    value: torch.Tensor
    gate: torch.Tensor

    def resolve(self) -> torch.Tensor:
        """The update as a tensor: ``value * gate`` in their promoted dtype."""
        return self.value * self.gate


#: ``compute(x_sub_RKC, context_of_those_tokens) -> residual update`` of one sublayer (a tensor or a
#: :class:`GatedUpdate`).
SublayerFn = Callable[[torch.Tensor, VARForwardContext], Union[torch.Tensor, GatedUpdate]]


# ---------------------------------------------------------------------------------------------------------------------
# tokens and rows: the executor's gather, scatter and row matching
# ---------------------------------------------------------------------------------------------------------------------
def gather_tokens(x_RLC: torch.Tensor, index_RK: torch.Tensor) -> torch.Tensor:
    """``x[r, index[r, k]]`` for every row: the kept tokens, in index order."""
    return torch.gather(x_RLC, 1, index_RK.unsqueeze(-1).expand(-1, -1, x_RLC.shape[-1]))


def scatter_tokens(canvas_RLC: torch.Tensor, index_RK: torch.Tensor, values_RKC: torch.Tensor) -> torch.Tensor:
    """A copy of ``canvas`` with the kept tokens overwritten by ``values``."""
    return canvas_RLC.scatter(
        1, index_RK.unsqueeze(-1).expand(-1, -1, canvas_RLC.shape[-1]), values_RKC.to(canvas_RLC.dtype)
    )


def match_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` with ``rows`` rows: the conditional rows when it has more (a halved pass), copies of its rows for both
    CFG halves when it has fewer (a per-image choice, or a halved source)."""
    if t.shape[0] == rows:
        return t
    if t.shape[0] > rows:
        return t[:rows]
    if rows % t.shape[0]:
        raise ValueError(f"cannot lay out {t.shape[0]} rows as {rows} (conditional rows first)")
    return t.repeat(rows // t.shape[0], *([1] * (t.dim() - 1)))


# ---------------------------------------------------------------------------------------------------------------------
# token maps
# ---------------------------------------------------------------------------------------------------------------------
def interpolate_tokens(
    x_RlC: torch.Tensor, source_hw: Tuple[int, int], hw: Tuple[int, int], mode: str, in_float32: bool = False
) -> torch.Tensor:
    """The tokens of an ``h x w`` map interpolated to ``hw``: ``(R, h_out * w_out, C)`` in ``x``'s dtype."""
    if mode not in FILL_MODES:
        raise ValueError(f"interpolation mode must be one of {list(FILL_MODES)}, got {mode!r}")
    R, _, C = x_RlC.shape
    x = (x_RlC.float() if in_float32 else x_RlC).reshape(R, *source_hw, C).permute(0, 3, 1, 2)
    x = F.interpolate(x, size=tuple(hw), mode=mode, align_corners=False if mode in ("bilinear", "bicubic") else None)
    return x.permute(0, 2, 3, 1).reshape(R, hw[0] * hw[1], C).to(x_RlC.dtype)


def _layer_proxy(fill: LayerProxy, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """``up(delta)`` of every token of the pass, bilinear per scale of the pass, ``(R, L, C)``."""
    delta = match_rows(fill.delta, rows)
    R, _, C = delta.shape
    grid = delta.transpose(1, 2).reshape(R, C, *fill.source_hw).float()
    parts = [
        F.interpolate(grid, size=tuple(hw), mode="bilinear", align_corners=False).flatten(2).transpose(1, 2)
        for hw in fill.scale_hws
    ]
    return (parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)).to(dtype)


def _at_positions(full_RLC: torch.Tensor, context: VARForwardContext) -> torch.Tensor:
    """A tensor over every token of the pass, restricted to the tokens ``context`` describes."""
    return full_RLC if context.positions is None else gather_tokens(full_RLC, context.positions)


def _earlier_scale(
    fill: EarlierScale, rows: int, context: VARForwardContext, dtype: Optional[torch.dtype]
) -> torch.Tensor:
    if len(context.scale_hws) != 1:
        raise ValueError(
            f"an earlier scale's tokens fill single-scale passes only; this pass decodes {len(context.scale_hws)} scales"
        )
    source = match_rows(fill.source, rows)
    source = source if dtype is None else source.to(dtype)
    return _at_positions(
        interpolate_tokens(source, fill.source_hw, context.scale_hws[0], fill.mode, fill.in_float32), context
    )


def _block_canvas(fill, x_RLC: torch.Tensor, context: VARForwardContext, dtype: torch.dtype) -> torch.Tensor:
    """A block's output at the positions its route does not compute, in ``dtype`` (the dtype the block's output
    stream has: a half-precision input promotes to the fp32 stream of the dense path, as the block's own residual
    additions do, so the computed tokens are never rounded to the input's dtype)."""
    if isinstance(fill, PassThrough):
        return x_RLC.to(dtype)
    if isinstance(fill, EarlierScale):
        return _earlier_scale(fill, x_RLC.shape[0], context, dtype)
    if isinstance(fill, LayerProxy):
        return x_RLC + _at_positions(_layer_proxy(fill, x_RLC.shape[0], dtype), context)
    raise TypeError(f"unknown fill {fill!r} of a block route")


def _update_canvas(
    fill, x_RLC: torch.Tensor, context: VARForwardContext, dtype: Optional[torch.dtype] = None
) -> torch.Tensor:
    """A sublayer's update at the positions its route does not compute (a zero update in ``dtype``, default
    ``x``'s)."""
    if isinstance(fill, PassThrough):
        return torch.zeros_like(x_RLC, dtype=dtype)
    if isinstance(fill, EarlierScale):
        return _earlier_scale(
            fill, x_RLC.shape[0], context, None if dtype is None else torch.promote_types(fill.source.dtype, dtype)
        )
    raise TypeError(f"a sublayer route fills with PassThrough or EarlierScale, got {fill!r}")


def _select(
    route: TokenRoute,
    x_RLC: torch.Tensor,
    context: Optional[VARForwardContext] = None,
    key: Optional[Tuple[int, str]] = None,
) -> torch.Tensor:
    """The route's ``(R, K)`` positions for these rows (a selector reads the residual stream). When the pass asks to
    keep the selection of the route at ``key`` (``RecordRequest.selections``), it goes into the pass's records: a
    selector returns its choice and writes nothing, and whoever needs it after the pass reads it there."""
    index_RK = route.selector(x_RLC) if route.selector is not None else match_rows(route.index, x_RLC.shape[0])
    if (
        key is not None
        and context is not None
        and context.routes is not None
        and key in context.routes.record.selections
    ):
        context.records.selections[key] = index_RK
    return index_RK


def _tokens_context(
    context: VARForwardContext, index_RK: torch.Tensor, route: TokenRoute, self_attention: bool = True
) -> VARForwardContext:
    """The context of gathered tokens; their sublayers run dense (routes act at the level they were declared).

    A route that keeps a fixed number of tokens per scale (``route.scale_counts``) says so, and a grouped pass then
    attends scale by scale without a mask and without reading the index. A cross-attention or FFN sublayer's tokens
    (``self_attention=False``) get no RoPE table or scale ids."""
    return replace(context.for_tokens(index_RK, route.scale_counts, self_attention), routes=None)


# ---------------------------------------------------------------------------------------------------------------------
# blocks
# ---------------------------------------------------------------------------------------------------------------------
def _routed_block(
    block,
    x_RLC: torch.Tensor,
    condition,
    context: VARForwardContext,
    route: Optional[TokenRoute],
    key: Optional[Tuple[int, str]] = None,
) -> torch.Tensor:
    if route is None:
        return block(x_RLC, condition, context)
    index_RK = _select(route, x_RLC, context, key)
    tally(context.work, block.layer_idx, "block", index_RK.shape[1])  # an inner route's count replaces this one
    if index_RK.shape[1] == 0:  # nothing computed: every position takes the fill
        return _block_canvas(route.fill, x_RLC, context, x_RLC.dtype)
    x_RKC = gather_tokens(x_RLC, index_RK)
    out_RKC = _routed_block(block, x_RKC, condition, _tokens_context(context, index_RK, route), route.inner)
    canvas = _block_canvas(route.fill, x_RLC, context, torch.promote_types(x_RLC.dtype, out_RKC.dtype))
    return scatter_tokens(canvas, index_RK, out_RKC)


def _spans(route: Optional[TokenRoute], other: Optional[TokenRoute]) -> bool:
    """Whether ``other`` continues the span of ``route`` (same tokens, both passing the others through)."""
    return (
        other is not None
        and isinstance(other.fill, PassThrough)
        and other.index is route.index
        and other.selector is route.selector
    )


def execute_blocks(
    blocks: Sequence[torch.nn.Module], x_RLC: torch.Tensor, condition, context: VARForwardContext
) -> torch.Tensor:
    """Run ``blocks`` over the pass's tokens as ``context.routes`` says (every token, every block without routes)."""
    routes = context.routes
    if routes is None or not (routes.routes or routes.record or routes.mixing):
        for block in blocks:
            x_RLC = block(x_RLC, condition, context)
        return x_RLC
    record = routes.record
    layer, num_layers = 0, len(blocks)
    while layer < num_layers:
        mixing = routes.mixing.get(layer)
        if mixing is not None:
            span = range(layer, mixing.end_layer)
            if mixing.end_layer <= layer or mixing.end_layer > num_layers:
                raise ValueError(
                    f"the mixing span from layer {layer} ends at {mixing.end_layer}; allowed: {layer + 1}..{num_layers}"
                )
            clash = [
                l
                for l in span
                if any((l, kind) in routes.routes for kind in SUBLAYER_KINDS)
                or l in record.block_deltas
                or (l != span[-1] and l in record.block_outputs)
            ]
            if clash:
                raise ValueError(
                    f"layers {clash} are in the mixing span {layer}..{mixing.end_layer - 1} and also routed or "
                    "recorded inside it; a span's blocks run on mixtures, not tokens"
                )
            x_RLC = _run_mixing(blocks[layer : mixing.end_layer], x_RLC, condition, context, mixing)
            if span[-1] in record.block_outputs:
                context.records.block_outputs[span[-1]] = x_RLC
            layer = mixing.end_layer
            continue
        route = routes.routes.get((layer, "block"))
        if route is not None and any((layer, kind) in routes.routes for kind in ("self_attn", "cross_attn", "ffn")):
            raise ValueError(f"layer {layer} has a block route and sublayer routes; a layer is routed at one level")
        recorded = layer in record.block_outputs or layer in record.block_deltas
        if route is not None and isinstance(route.fill, PassThrough) and not recorded:
            end = layer + 1
            while (
                end < num_layers
                and _spans(route, routes.routes.get((end, "block")))
                and end not in record.block_outputs
                and end not in record.block_deltas
            ):
                end += 1
            x_RLC = _run_span(
                blocks[layer:end],
                x_RLC,
                condition,
                context,
                [routes.routes[(j, "block")].inner for j in range(layer, end)],
                route,
                (layer, "block"),
            )
            layer = end
            continue
        out_RLC = _routed_block(blocks[layer], x_RLC, condition, context, route, (layer, "block"))
        if layer in record.block_outputs:
            context.records.block_outputs[layer] = out_RLC
        if layer in record.block_deltas:
            context.records.record_block_delta(record.block_deltas, layer, out_RLC, x_RLC)
        x_RLC = out_RLC
        layer += 1
    return x_RLC


def _without_autocast(device: torch.device):
    """Autocast off on ``device`` (nothing to turn off on the meta device of a FLOP count)."""
    return contextlib.nullcontext() if device.type == "meta" else torch.autocast(device.type, enabled=False)


def _run_mixing(
    blocks, x_RLC: torch.Tensor, condition, context: VARForwardContext, route: MixingRoute
) -> torch.Tensor:
    """A span of blocks on ``r`` mixtures ``P^T X`` of the tokens, written back at the mixer's positions onto the
    fill's canvas (:class:`~.plan.MixingRoute`)."""
    positions_Rr, projection_RLr = route.mixer(x_RLC)
    R, L, _ = x_RLC.shape
    r = positions_Rr.shape[1]
    if projection_RLr.shape != (R, L, r):
        raise ValueError(
            f"a mixer's projection must be (rows, tokens, r) = {(R, L, r)}, got {tuple(projection_RLr.shape)}"
        )
    with _without_autocast(x_RLC.device):  # the projection in fp32, as StageVAR's code
        y_RrC = torch.bmm(projection_RLr.float().transpose(1, 2), x_RLC.float()).to(x_RLC.dtype)
    if route.rope_positions == "first":  # the mixtures take the first r positions' RoPE
        taken_Rr = torch.arange(r, device=x_RLC.device).expand(R, r)
    else:  # the k-th mixture the k-th write position's
        taken_Rr = positions_Rr
    tokens_context = replace(context.for_tokens(taken_Rr, None), routes=None)
    for block in blocks:
        tally(context.work, block.layer_idx, "block", r)  # the span runs on r mixtures
        y_RrC = block(y_RrC, condition, tokens_context)
    canvas = _block_canvas(route.fill, x_RLC, context, torch.promote_types(x_RLC.dtype, y_RrC.dtype))
    return scatter_tokens(canvas, positions_Rr, y_RrC)


def _run_span(
    blocks,
    x_RLC,
    condition,
    context: VARForwardContext,
    inner_routes,
    route: TokenRoute,
    key: Optional[Tuple[int, str]] = None,
) -> torch.Tensor:
    """Consecutive blocks on the same kept tokens: one gather before, one scatter after (the selection is the first
    block's, ``key``)."""
    index_RK = _select(route, x_RLC, context, key)
    for block in blocks:
        tally(context.work, block.layer_idx, "block", index_RK.shape[1])
    if index_RK.shape[1] == 0:
        return x_RLC
    x_RKC = gather_tokens(x_RLC, index_RK)
    tokens_context = _tokens_context(context, index_RK, route)
    for block, inner in zip(blocks, inner_routes):
        x_RKC = _routed_block(block, x_RKC, condition, tokens_context, inner)
    canvas = x_RLC.to(torch.promote_types(x_RLC.dtype, x_RKC.dtype))
    return scatter_tokens(canvas, index_RK, x_RKC)


# ---------------------------------------------------------------------------------------------------------------------
# sublayers
# ---------------------------------------------------------------------------------------------------------------------
def run_sublayer(
    layer_idx: int, kind: str, x_RLC: torch.Tensor, compute: SublayerFn, context: VARForwardContext
) -> torch.Tensor:
    """``x + compute(x)``, or, under a route for ``(layer_idx, kind)``, ``x`` plus the update of the route's tokens
    filled in with the route's fill; the full update is recorded when the pass asks for it.

    A :class:`GatedUpdate` is added to the stream with one ``addcmul`` (``x + value * gate``, the product not rounded
    first) wherever its tokens are computed: on the dense path, on a recorded layer (the record is the product, the
    stream the same ``addcmul`` as without the record) and on a route's computed tokens whatever the fill, so a
    route or record that keeps every token gives the dense path's bits."""
    routes = context.routes
    route = routes.routes.get((layer_idx, kind)) if routes is not None else None
    recorded = routes is not None and (layer_idx, kind) in routes.record.sublayer_updates
    if route is None:
        update = compute(x_RLC, context)
        if isinstance(update, GatedUpdate):
            if recorded:
                context.records.sublayer_updates[(layer_idx, kind)] = update.resolve()
            return torch.addcmul(x_RLC, update.value, update.gate)  # x + value * gate, one kernel
        if recorded:
            context.records.sublayer_updates[(layer_idx, kind)] = update
        return x_RLC + update
    index_RK = _select(route, x_RLC, context, (layer_idx, kind))
    tally(context.work, layer_idx, kind, index_RK.shape[1])
    if not index_RK.shape[1]:
        update_RLC = _update_canvas(route.fill, x_RLC, context)
        if recorded:
            context.records.sublayer_updates[(layer_idx, kind)] = update_RLC
        return x_RLC + update_RLC
    x_RKC = gather_tokens(x_RLC, index_RK)
    computed = compute(x_RKC, _tokens_context(context, index_RK, route, self_attention=kind == "self_attn"))
    if not isinstance(computed, GatedUpdate):
        # x + update at every position: the computed tokens get x + their update, as on the dense path (the update
        # in the dtype the dense path adds: an fp32 update is not rounded to a bf16 stream's dtype)
        canvas = _update_canvas(route.fill, x_RLC, context, torch.promote_types(x_RLC.dtype, computed.dtype))
        update_RLC = scatter_tokens(canvas, index_RK, computed)
        if recorded:
            context.records.sublayer_updates[(layer_idx, kind)] = update_RLC
        return x_RLC + update_RLC
    # the kept tokens take x + value * gate in one addcmul as on the dense path (in the dtype the dense stream has
    # after this sublayer: a half-precision input promotes); the others x + their fill
    out_RKC = torch.addcmul(x_RKC, computed.value, computed.gate)
    if isinstance(route.fill, PassThrough) and not recorded:  # the other tokens' update is zero
        return scatter_tokens(x_RLC.to(out_RKC.dtype), index_RK, out_RKC)
    canvas = _update_canvas(route.fill, x_RLC, context, torch.promote_types(x_RLC.dtype, out_RKC.dtype))
    if recorded:
        context.records.sublayer_updates[(layer_idx, kind)] = scatter_tokens(canvas, index_RK, computed.resolve())
    return scatter_tokens(x_RLC + canvas, index_RK, out_RKC)


# ---------------------------------------------------------------------------------------------------------------------
# codes
# ---------------------------------------------------------------------------------------------------------------------
def keep_residual(codes_Bdhw: torch.Tensor, index_Bn: torch.Tensor) -> torch.Tensor:
    """The codes with a zero residual everywhere but the positions ``index`` (flat, per image)."""
    B, _, h, w = codes_Bdhw.shape
    keep_Bl = torch.zeros(B, h * w, dtype=torch.bool, device=codes_Bdhw.device).scatter_(1, index_Bn, True)
    return codes_Bdhw.masked_fill(~keep_Bl.view(B, 1, h, w), 0)


def weight_codes(codes_Bdhw: torch.Tensor, weights_Bhw: torch.Tensor) -> torch.Tensor:
    """The codes weighted per position (code blending)."""
    if weights_Bhw.is_meta and not codes_Bdhw.is_meta:  # a shape-only plan (FLOP counting): no values to weight by
        return codes_Bdhw
    return codes_Bdhw * weights_Bhw.unsqueeze(1).to(codes_Bdhw.dtype)


def on_computed_tokens(
    refine: Callable[..., torch.Tensor],
    residual_tokens: Optional[torch.Tensor],
    hidden_RLC: torch.Tensor,
    values_BLd: torch.Tensor,
    like_BLc: torch.Tensor,
) -> torch.Tensor:
    """A family's per-token refinement of one scale's codes (HART's residual diffusion head), computed only where the
    plan keeps a residual.

    ``refine(hidden_RnC, values_Bnd) -> (B, n, c)`` maps the hidden states of every row and the per-image values of
    ``n`` tokens to their refinement. With ``residual_tokens`` ``None`` it runs on every token; else on the ``(B, n)``
    positions it names (the same positions in every CFG half of ``hidden_RLC``) and the result is scattered into zeros
    shaped and typed like ``like_BLc`` (the other positions get no refinement: their codes are zeroed anyway).
    """
    if residual_tokens is None:
        return refine(hidden_RLC, values_BLd)
    hidden_RnC = gather_tokens(hidden_RLC, match_rows(residual_tokens, hidden_RLC.shape[0]))
    refined_Bnc = refine(hidden_RnC, gather_tokens(values_BLd, residual_tokens))
    return scatter_tokens(torch.zeros_like(like_BLc), residual_tokens, refined_Bnc)
