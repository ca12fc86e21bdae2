"""What one transformer pass over the tokens of one scale (or one group of scales) needs besides the weights.

The next-scale loop builds a :class:`VARForwardContext` per pass and hands it down to the blocks, which hand it to
their attention processors. Nothing here outlives the call: the KV cache, recorded tensors and the routes belong to
the loop's per-call state. A context describes the tokens it goes with: the executor derives one per gathered token
set (:meth:`VARForwardContext.for_tokens`), so blocks and processors never index anything themselves.

Shape legend: ``R`` rows (batch, doubled under CFG), ``L`` tokens of this pass, ``K`` kept tokens, ``C`` width,
``H`` heads, ``c`` head dim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import replace
from typing import Any, Callable, Dict, FrozenSet, Hashable, Optional, Set, Tuple

import torch

from .cache import ScaleKVCache
from .plan import PassRoutes


@dataclass
class VARForwardContext:
    """Per-pass inputs of the transformer blocks.

    Args:
        kv_cache (`ScaleKVCache`, *optional*): keys/values of the earlier scales; this pass appends its own.
        rope_cos_sin (`torch.Tensor`): ``(2, 1 or R, 1, L, d)`` cosines and sines of the RoPE angles of this pass's
            tokens (Infinity: ``d = c/2``, shared by all rows; HART: ``d = c``, one table per row); ``None`` in the
            context of a routed cross-attention or FFN sublayer, where no self-attention runs, and in the context of
            gathered tokens, which take theirs from ``rope_source``.
        rope_source (`tuple`, *optional*): ``(outer context, (R, K) index)`` of a context of gathered tokens
            (:meth:`for_tokens`): their RoPE tables are the outer context's processed tables (built once per pass)
            at ``index``, one gather per token set instead of a gather and the processing per set.
        token_scale_ids (`torch.Tensor`, *optional*): ``(L,)`` scale index of every token when several scales are
            decoded in one pass; self-attention then applies the block-causal mask (a token sees the cache, and the
            tokens of its own and earlier scales). ``None`` for a single scale (all keys visible).
        routes (`PassRoutes`, *optional*): the scheduler's token routes and record requests for this pass (carried out
            by :mod:`~diffusers_var_accel.next_scale.executor`); ``None`` computes every token.
        record_attention_layers (`set[int]`): layers whose self-attention probabilities are stored in
            ``attention_maps`` (explicit softmax instead of the fused kernel).
        attention_map (`str`): ``"key_mean"`` stores ``(R, S)``, the attention each key receives averaged over heads
            and queries; ``"full"`` stores the ``(R, H, L, S)`` probabilities.
        cache_rows (`int`, *optional*): rows held by the KV cache when the blocks run fewer rows (CFG halving: only
            the conditional half runs, and its keys/values are copied to the unconditional rows of the cache).
        cache_row_start (`int`): the first cached row of the rows the blocks run (``B`` when only the unconditional
            half runs: they attend to their own history).
        scale_hws (`tuple`): ``(h, w)`` of every scale of the pass, in order.
        positions (`torch.Tensor`, *optional*): ``(R, K)`` positions, among the pass's tokens, of the tokens this
            context describes; ``None`` = all of them, in order.
        records (`PassRecords`): what the executor kept for later scales (filled during the pass).
        scale_lengths (`tuple[int]`, *optional*): how many of the tokens this context describes belong to each scale
            of the pass, in order (the tokens are in scale order). Known statically for the pass's own tokens (from
            ``scale_hws``) and for routes that keep a fixed count per scale; ``None`` when not known, and then a
            grouped pass keeps its block-causal structure with a mask built on the device.
        call_cache (`dict`, *optional*): per-call constants, owned by the caller (one dict per generation, the same
            for every pass): models store there, lazily, what depends only on the weights and the call's condition
            (cross-attention text keys/values, AdaLN terms, concatenated biases ...), keyed by ``(name, layer, ...)``.
            ``None`` computes them at every use (same values).
        pass_cache (`dict`): constants of these tokens derived once per pass (RoPE tables in the layout the
            processors use); a context for other tokens (:meth:`for_tokens`) starts an empty one.
        static_pass (`bool`): the pass is captured as a graph or compiled (its runner sets it): nothing in it may read
            the device on the host, so a step that would (a grouped pass whose tokens per scale are unknown, taken
            scale by scale) raises instead.
        decisions (`dict`): what the pass decides once and every token set of it reads (how the attention runs:
            the kernel, a grouped pass's strategy), shared by the contexts :meth:`for_tokens` derives.
    """

    kv_cache: Optional[ScaleKVCache]
    rope_cos_sin: Optional[torch.Tensor]
    token_scale_ids: Optional[torch.Tensor] = None
    routes: Optional[PassRoutes] = None
    record_attention_layers: Set[int] = field(default_factory=set)
    attention_maps: Dict[int, torch.Tensor] = field(default_factory=dict)
    attention_map: str = "key_mean"
    cache_rows: Optional[int] = None
    scale_hws: Tuple[Tuple[int, int], ...] = ()
    positions: Optional[torch.Tensor] = None
    records: "PassRecords" = field(default_factory=lambda: PassRecords())
    scale_lengths: Optional[Tuple[int, ...]] = None
    call_cache: Optional[Dict[Hashable, Any]] = None
    cache_row_start: int = 0
    pass_cache: Dict[Hashable, Any] = field(default_factory=dict, repr=False, compare=False)
    rope_source: Optional[Tuple["VARForwardContext", torch.Tensor]] = field(default=None, repr=False, compare=False)
    static_pass: bool = False
    decisions: Dict[Hashable, Any] = field(default_factory=dict, repr=False, compare=False)
    #: ``{(layer, level): tokens per row}`` the executor computed where a route acted (:mod:`.work`), shared by the
    #: contexts :meth:`for_tokens` derives; ``None``: not recorded
    work: Optional[Dict[Tuple[int, str], int]] = field(default=None, repr=False, compare=False)

    def for_tokens(
        self, index_RK: torch.Tensor, scale_lengths: Optional[Tuple[int, ...]] = None, self_attention: bool = True
    ) -> "VARForwardContext":
        """The context of the tokens ``index`` selects among this context's tokens: their RoPE table, scale ids and
        pass positions (and, when the caller knows them, ``scale_lengths``); the KV cache, recorded maps, records and
        call cache are shared. ``self_attention=False`` (a cross-attention or FFN sublayer's tokens): no
        self-attention runs in it, so the RoPE table and scale ids are not gathered (``rope_cos_sin`` is ``None``):
        two index kernels less per routed sublayer. The RoPE table is not gathered here either: the processors
        gather their processed tables from this context's (``rope_source``), when self-attention asks for them."""
        positions = index_RK if self.positions is None else torch.gather(self.positions, 1, index_RK)
        if not self_attention:
            return replace(
                self,
                rope_cos_sin=None,
                token_scale_ids=None,
                positions=positions,
                scale_lengths=scale_lengths,
                pass_cache={},
                rope_source=None,
            )
        return replace(
            self,
            rope_cos_sin=None,
            rope_source=(self, index_RK),
            token_scale_ids=gather_scale_ids(self.token_scale_ids, index_RK),
            positions=positions,
            scale_lengths=scale_lengths,
            pass_cache={},
        )

    def rope_table_like(self) -> Optional[torch.Tensor]:
        """The raw RoPE table of the pass this context's tokens come from (for its dtype, device and width; its
        rows and tokens are the outermost context's)."""
        context = self
        while context.rope_source is not None:
            context = context.rope_source[0]
        return context.rope_cos_sin

    def cached(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()``, stored under ``key`` in :attr:`call_cache` the first time (every time without one)."""
        if self.call_cache is None:
            return compute()
        value = self.call_cache.get(key)
        if value is None:
            value = compute()
            self.call_cache[key] = value
        return value

    def decided(self, key: Hashable, decide: Callable[[], Any]) -> Any:
        """``decide()``, once per pass (stored under ``key`` in :attr:`decisions`, which every token set shares)."""
        value = self.decisions.get(key)
        if value is None:
            value = self.decisions[key] = decide()
        return value

    def pass_cached(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()``, stored under ``key`` in :attr:`pass_cache` the first time."""
        value = self.pass_cache.get(key)
        if value is None:
            value = compute()
            self.pass_cache[key] = value
        return value

    def token_scale_lengths(self, num_tokens: int) -> Optional[Tuple[int, ...]]:
        """Tokens per scale of this context's ``num_tokens`` tokens, read from shapes only (never from the
        device): :attr:`scale_lengths`, else, for the pass's own tokens, the products of :attr:`scale_hws`."""
        if self.scale_lengths is not None:
            return self.scale_lengths if sum(self.scale_lengths) == num_tokens else None
        if self.positions is not None or not self.scale_hws:
            return None
        lengths = tuple(int(h) * int(w) for h, w in self.scale_hws)
        return lengths if sum(lengths) == num_tokens else None


@dataclass
class PassRecords:
    """What one pass kept for later scales (``state.records`` in ``after_scale``).

    Args:
        attention: ``{layer: map}`` recorded self-attention (``ScalePlan.record_attention_layers``).
        block_outputs: ``{layer: (R, L, C)}`` full block outputs.
        block_deltas: ``{layer: (R, L, C)}`` block output minus input.
        sublayer_updates: ``{(layer, sublayer): (R, L, C)}`` full residual updates.
        selections: ``{(layer, sublayer): (R, K)}`` the positions a route chose (``RecordRequest.selections``).
        buffers: ``buffers(name, shape, dtype, device) -> tensor``, where a record written whole into one buffer
            (:attr:`block_delta_stack`) gets it; ``None``: a new tensor per pass. A pass runner that captures passes
            gives its own, so that the buffer is made by the eager warm-up and kept across calls (as the KV cache is)
            instead of being owned by each graph.
    """

    attention: Dict[int, torch.Tensor] = field(default_factory=dict)
    block_outputs: Dict[int, torch.Tensor] = field(default_factory=dict)
    block_deltas: Dict[int, torch.Tensor] = field(default_factory=dict)
    sublayer_updates: Dict[Tuple[int, str], torch.Tensor] = field(default_factory=dict)
    selections: Dict[Tuple[int, str], torch.Tensor] = field(default_factory=dict)
    #: ``(n, R, L, C)``: the recorded block deltas, in layer order, written into one buffer (``block_deltas`` holds
    #: its slices) when every one has the first one's shape and dtype; ``None`` otherwise. A reader may reduce over
    #: all layers in a few kernels instead of a few per layer.
    block_delta_stack: Optional[torch.Tensor] = None
    buffers: Optional[Callable[..., torch.Tensor]] = field(default=None, repr=False, compare=False)

    def record_block_delta(
        self, layers: FrozenSet[int], layer: int, out_RLC: torch.Tensor, x_RLC: torch.Tensor
    ) -> None:
        """Keep ``out - x`` of ``layer``, one of the recorded ``layers``: into :attr:`block_delta_stack` (allocated
        at the first recorded layer for all of them; the same values as ``out - x``, one kernel)."""
        order = sorted(layers)
        dtype = torch.promote_types(out_RLC.dtype, x_RLC.dtype)
        if self.block_delta_stack is None and not self.block_deltas:
            shape = (len(order), *out_RLC.shape)
            if self.buffers is None:
                self.block_delta_stack = out_RLC.new_empty(shape, dtype=dtype)
            else:
                self.block_delta_stack = self.buffers("block_delta_stack", shape, dtype, out_RLC.device)
        stack = self.block_delta_stack
        if stack is not None and stack.shape[1:] == out_RLC.shape and stack.dtype == dtype:
            self.block_deltas[layer] = torch.sub(out_RLC, x_RLC, out=stack[order.index(layer)])
        else:  # another shape or dtype: no stack for this pass
            self.block_delta_stack = None
            self.block_deltas[layer] = out_RLC - x_RLC


def gather_rope_tables(tables_2RL11c: torch.Tensor, index_RK: torch.Tensor) -> torch.Tensor:
    """The processed RoPE tables of the kept tokens (the processors' ``(2, 1 or R, L, 1, 1, c)`` layout) ->
    ``(2, R, K, 1, 1, c)``: a gather commutes with the elementwise processing, so the values are those of the kept
    tokens' own tables bit for bit. A table shared by all rows is indexed directly, per-row tables row by row."""
    R, K = index_RK.shape
    tail = tables_2RL11c.shape[3:]
    if tables_2RL11c.shape[1] == 1:
        return tables_2RL11c[:, 0, index_RK.reshape(-1)].view(2, R, K, *tail)
    flat = tables_2RL11c.flatten(3)  # (2, R, L, c)
    index = index_RK.view(1, R, K, 1).expand(2, R, K, flat.shape[-1])
    return torch.gather(flat, 2, index).view(2, R, K, *tail)


def gather_rope(rope_cos_sin: torch.Tensor, index_RK: torch.Tensor) -> torch.Tensor:
    """The RoPE table of the kept tokens: ``(2, 1 or R, 1, L, d)`` -> ``(2, R, 1, K, d)``.

    A table shared by all rows (Infinity) is indexed directly; per-row tables (HART, whose positions depend on each
    row's text length) are gathered row by row.
    """
    table_RLD = rope_cos_sin[:, :, 0]  # (2, 1 or R, L, d)
    R, K = index_RK.shape
    d = table_RLD.shape[-1]
    if table_RLD.shape[1] == 1:
        gathered = table_RLD[:, 0, index_RK.reshape(-1)]  # (2, R*K, d)
        return gathered.view(2, R, 1, K, d)
    index = index_RK.view(1, R, K, 1).expand(2, R, K, d)
    return torch.gather(table_RLD, 2, index).unsqueeze(2)


def gather_scale_ids(token_scale_ids: Optional[torch.Tensor], index_RK: torch.Tensor) -> Optional[torch.Tensor]:
    """Scale ids of the kept tokens, ``(R, K)``, or ``None`` for a single-scale pass."""
    if token_scale_ids is None:
        return None
    if token_scale_ids.dim() == 1:  # (L,): the pass's own tokens
        return token_scale_ids[index_RK]
    return torch.gather(token_scale_ids, 1, index_RK)  # (R, K): tokens already selected by an outer route


def block_causal_mask(cache_length: int, scale_ids: torch.Tensor) -> torch.Tensor:
    """Boolean mask (True = visible) of a grouped pass: every cached key, plus keys of the same or earlier scales.

    ``scale_ids`` is ``(L,)`` for all tokens of the pass (mask ``(L, cache + L)``) or ``(R, K)`` for routed tokens
    (mask ``(R, 1, K, cache + K)``, one per row since rows may keep different tokens).
    """
    within = scale_ids.unsqueeze(-1) >= scale_ids.unsqueeze(-2)  # query scale >= key scale
    cache = torch.ones(*within.shape[:-1], cache_length, dtype=torch.bool, device=scale_ids.device)
    mask = torch.cat((cache, within), dim=-1)
    return mask if scale_ids.dim() == 1 else mask.unsqueeze(1)
