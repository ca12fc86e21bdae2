"""What a scheduler declares and the executor carries out: pass plans and per-pass token routes.

A scheduler **decides** and says so with these objects; it never moves a token itself.

* :class:`ScalePlan` (one per transformer pass, made once per call from the schedule): which scales the pass decodes,
  whether it is skipped, whether only the conditional CFG rows run, which self-attention maps are recorded.
* :class:`PassRoutes` (made before each pass, from what the call has seen so far): per block, or per sublayer, which
  tokens are computed (:class:`TokenRoute`), how the other positions are filled (:data:`Fill`), what is recorded for
  later scales, which positions of a scale get a zero residual and how a scale's codes are weighted.

Index tensors have sizes that come from the configuration and the schedule, never from the data, so every pass has
the same sequence of shapes for any prompt and seed.

Shape legend: ``B`` images, ``R`` rows (``2B`` under CFG, conditional first), ``L`` tokens of a pass, ``K`` kept
tokens, ``C`` width, ``l = h w`` tokens of a source scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Iterable, Mapping, Optional, Sequence, Tuple, Union

import torch

#: What a recorded self-attention map keeps (see ``ScalePlan.attention_map``).
ATTENTION_MAP_KINDS = ("key_mean", "full")

#: The sublayers a route may name; ``"block"`` routes a whole block.
SUBLAYER_KINDS = ("block", "self_attn", "cross_attn", "ffn")

#: Interpolation modes of the fills that read an earlier scale.
FILL_MODES = ("area", "bilinear", "bicubic", "nearest")


# ---------------------------------------------------------------------------------------------------------------------
# pass plans
# ---------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScalePlan:
    """What the loop does for one transformer pass.

    Args:
        scale_indices (`tuple[int]`): the scales decoded in this pass, consecutive and ascending. More than one means
            parallel decoding: every scale's input is interpolated from the summed latent before the pass, and the
            pass uses a block-causal attention mask (a scale sees earlier scales and itself).
        skip (`bool`, defaults to `False`): run no transformer pass and add no codes for these scales.
        cfg_halve (`bool`, defaults to `False`): under CFG, run only the conditional rows through the blocks; their
            output stands in for the unconditional rows (the guidance difference at these scales is zero).
        cfg_uncond_only (`bool`, defaults to `False`): under CFG, run only the **unconditional** rows (null text,
            unconditional AdaLN and head condition, their own KV history) and sample from their logits: guidance
            switched off towards the unconditional model (StageVAR's "cfg = 0" scales). Their keys stand in for the
            conditional rows' in the cache, so once a pass is unconditional-only every later pass that runs the
            blocks must be too (:func:`validate_plans`). Exclusive with ``cfg_halve``.
        record_attention_layers (`frozenset[int]`): self-attention layers whose probabilities are computed
            explicitly and handed to ``after_scale`` (in ``state.records.attention[layer]``).
        attention_map (`str`, defaults to `"key_mean"`): what is kept of a recorded map: ``"key_mean"`` the attention
            each key receives, averaged over heads and queries, ``(R, S)`` fp32 (small: one row per key); ``"full"``
            the probabilities ``(R, H, L, S)`` (memory grows with layers x heads x queries x keys).
    """

    scale_indices: Tuple[int, ...]
    skip: bool = False
    cfg_halve: bool = False
    record_attention_layers: FrozenSet[int] = field(default_factory=frozenset)
    attention_map: str = "key_mean"
    cfg_uncond_only: bool = False

    def __post_init__(self):
        if self.attention_map not in ATTENTION_MAP_KINDS:
            raise ValueError(f"attention_map must be one of {ATTENTION_MAP_KINDS}, got {self.attention_map!r}")
        if self.cfg_halve and self.cfg_uncond_only:
            raise ValueError(
                f"scales {tuple(self.scale_indices)}: cfg_halve (conditional rows only) and cfg_uncond_only "
                "(unconditional rows only) are two branch rules; a pass takes one"
            )


def validate_plans(plans: Sequence[ScalePlan], num_scales: int) -> None:
    """Every scale in exactly one plan, in order; groups consecutive; nothing beyond the last scale.

    Raises:
        ValueError: naming the offending plan and what is allowed.
    """
    expected = 0
    for plan in plans:
        idx = tuple(plan.scale_indices)
        if not idx:
            raise ValueError(f"a scale plan has no scale indices: {plan}")
        if idx[-1] >= num_scales:
            raise ValueError(f"plan {idx} crosses the last scale: scale indices must be < {num_scales}")
        if idx != tuple(range(expected, expected + len(idx))):
            raise ValueError(
                f"plan {idx} is out of order: the next plan must start at scale {expected} and be consecutive"
            )
        if 0 in idx and len(idx) > 1:
            raise ValueError(f"plan {idx} groups scale 0 with later scales; scale 0 (the start token) runs alone")
        expected += len(idx)
    running = [plan for plan in plans if not plan.skip]
    for earlier, later in zip(running, running[1:]):
        if earlier.cfg_uncond_only and not later.cfg_uncond_only:
            raise ValueError(
                f"plan {tuple(later.scale_indices)} runs both CFG rows after the unconditional-only plan "
                f"{tuple(earlier.scale_indices)}; unconditional-only passes must end the passes that run "
                "(their keys stand in for the conditional rows')"
            )
    if expected != num_scales:
        raise ValueError(f"plans cover scales 0..{expected - 1} but the schedule has {num_scales} scales")


def resolve_scale_index(index: int, num_scales: int, what: str = "scale index") -> int:
    """A scale index of a schedule with ``num_scales`` scales; negative values count from the end (-1 = last).

    Raises:
        ValueError: the index is outside ``[-num_scales, num_scales)``.
    """
    if not -num_scales <= int(index) < num_scales:
        raise ValueError(
            f"{what} {index} is outside the schedule's {num_scales} scales (allowed: {-num_scales}..{num_scales - 1})"
        )
    return int(index) % num_scales


@dataclass(frozen=True)
class ModelInfo:
    """What a scheduler may know of the model it plans for.

    Args:
        num_layers: transformer blocks.
        family: the model family (``"infinity"``, ``"hart"``).
    """

    num_layers: int
    family: str


# ---------------------------------------------------------------------------------------------------------------------
# fills: how the positions a route does not compute get their values
# ---------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PassThrough:
    """The other positions are left as they are: a block keeps its input, a sublayer adds a zero update."""


@dataclass(frozen=True)
class EarlierScale:
    """The other positions take an earlier scale's tensor, interpolated to this scale.

    For a sublayer route, ``source`` is that sublayer's update at the earlier scale (FastVAR's cached token
    restoration); for a block route, the block's output there (ARVAR's structural reconstruction canvas).

    Args:
        source: ``(R or B, l, C)`` tokens of the earlier scale (rows are matched to the pass, conditional first).
        source_hw: ``(h, w)`` of the earlier scale.
        mode: ``F.interpolate`` mode (one of :data:`FILL_MODES`).
        in_float32: interpolate in fp32 and cast back (else in the source's dtype).
    """

    source: torch.Tensor
    source_hw: Tuple[int, int]
    mode: str = "area"
    in_float32: bool = False


@dataclass(frozen=True)
class LayerProxy:
    """A block's other positions take ``input + up(delta)``: an earlier scale's upsampled layer delta (DepthVAR).

    Args:
        delta: ``(R or B, l, C)`` the earlier scale's ``output - input`` of this block.
        source_hw: ``(h, w)`` of that scale.
        scale_hws: ``(h, w)`` of every scale of the pass, in order (a grouped pass upsamples to each).
    """

    delta: torch.Tensor
    source_hw: Tuple[int, int]
    scale_hws: Tuple[Tuple[int, int], ...]


Fill = Union[PassThrough, EarlierScale, LayerProxy]
PASS_THROUGH = PassThrough()


#: ``selector(x_RLC) -> (R, K)`` indices, evaluated by the executor on the residual stream before the routed layer.
TokenSelector = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, eq=False)
class TokenRoute:
    """Which tokens one block (or one sublayer) computes and how the others are filled.

    Exactly one of ``index`` and ``selector`` is given.

    Args:
        index: ``(B or R, K)`` positions of the tokens computed, ascending, into the pass's tokens (or, for an
            ``inner`` route, into the outer route's kept tokens). ``B`` rows are one choice per image, shared by its
            conditional and unconditional rows.
        selector: a function of the residual stream before the routed layer giving ``(R, K)`` positions (FastVAR's
            pivotal tokens are chosen before every sublayer from the stream itself).
        fill: how the other positions get their values (:class:`PassThrough`, :class:`EarlierScale`,
            :class:`LayerProxy`).
        inner: a route applied within the kept tokens (nested selections: DepthVAR's depth within LazyVAR's kept
            tokens). Its ``index`` counts the outer route's kept tokens.
        scale_counts: for a grouped pass, how many of the kept tokens belong to each of its scales (in order, the
            index being ascending), when the route keeps a fixed number per scale: attention then runs scale by
            scale without a mask and without reading the index on the host. ``None``: not known.
    """

    index: Optional[torch.Tensor] = None
    selector: Optional[TokenSelector] = None
    fill: Fill = PASS_THROUGH
    inner: Optional["TokenRoute"] = None
    scale_counts: Optional[Tuple[int, ...]] = None

    def __post_init__(self):
        if (self.index is None) == (self.selector is None):
            raise ValueError("a TokenRoute takes exactly one of index and selector")

    @classmethod
    def none(
        cls, rows: int, device: Optional[Union[str, torch.device]] = None, fill: "Fill" = PASS_THROUGH
    ) -> "TokenRoute":
        """A route that computes no token: every position takes ``fill`` (with the default :class:`PassThrough`, a
        block keeps its input and a sublayer adds a zero update).

        Args:
            rows: ``B`` (one choice per image) or ``R`` (per row) of the index.
            device: the device of the index (the pass's).
            fill: how the positions get their values.
        """
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"a route's index needs at least one row, got rows={rows!r}")
        return cls(index=torch.empty(rows, 0, dtype=torch.long, device=device), fill=fill)

    def within(self, outer: "TokenRoute") -> "TokenRoute":
        """This route nested inside ``outer`` (``outer``'s kept tokens, then this route's selection among them)."""
        if outer.inner is not None:
            return TokenRoute(outer.index, outer.selector, outer.fill, self.within(outer.inner), outer.scale_counts)
        return TokenRoute(outer.index, outer.selector, outer.fill, self, outer.scale_counts)


@dataclass(frozen=True, eq=False)
class TokenSelection:
    """The tokens an earlier member of a composition keeps in a pass, handed to the members asked after it
    (:meth:`~diffusers_var_accel.schedulers.scheduling_var_base.VARAccelScheduler.route_pass_within`), so that they
    may select again within them (:meth:`TokenRoute.within`) without reading another member's routes.

    Args:
        route: the block route of the pass's first layer: the tokens the selecting member's blocks compute.
        tokens: ``{scale: (B, n) positions}`` of each scale of the pass that the route keeps, as the member names them
            (its ``residual_tokens``); a scale is missing when its positions are not known before the pass (a selector
            chooses them inside it).
    """

    route: TokenRoute
    tokens: Mapping[int, torch.Tensor]


#: ``mixer(x_RLC) -> (positions (R, r), projection (R, L, r))``: evaluated by the executor on the residual stream
#: entering a mixing span (the draws may depend on it, as StageVAR's write positions do).
TokenMixer = Callable[[torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True, eq=False)
class MixingRoute:
    """A span of blocks run on ``r`` mixtures of the pass's tokens instead of the tokens (StageVAR's random
    projection), written back at ``r`` positions onto a canvas.

    Before the span the executor computes ``Y = P^T X`` (``P`` the mixer's projection ``(R, L, r)``, in fp32 without
    autocast), runs the span's blocks on ``Y`` with the RoPE positions and context of ``r`` of the pass's tokens
    (``rope_positions``; their keys and values enter the KV cache), and returns the canvas (the fill, at every
    position) with the ``k``-th output written at the ``k``-th of the mixer's positions. Which mixture lands where is
    the method's choice (the positions need not be sorted, only distinct).

    Args:
        end_layer: the span is the layers from the route's key up to ``end_layer`` (excluded).
        mixer: :data:`TokenMixer`, called on the stream entering the span.
        fill: the canvas (:class:`EarlierScale`: an earlier scale's output of the span, interpolated).
        rope_positions: whose positions (RoPE, scale ids) the mixtures take: ``"first"``, the pass's first ``r``
            tokens in raster order (StageVAR's Infinity code); ``"drawn"``, the mixer's write positions, the
            ``k``-th mixture the ``k``-th position (its HART code).
    """

    end_layer: int
    mixer: TokenMixer
    fill: "Fill"
    rope_positions: str = "first"

    def __post_init__(self):
        if self.rope_positions not in MIXTURE_ROPE_POSITIONS:
            raise ValueError(
                f"rope_positions must be one of {list(MIXTURE_ROPE_POSITIONS)}, got {self.rope_positions!r}"
            )


#: The values of :attr:`MixingRoute.rope_positions`.
MIXTURE_ROPE_POSITIONS = ("first", "drawn")

#: What to do about a pass that draws random numbers inside it (a mixer): the end of the loop's and the pass
#: runners' errors.
DRAWING_PASSES_WAY_OUT = (
    "which captured and compiled passes do not support yet; call pipe.disable_cuda_graphs() to run "
    "the passes eagerly, or configure the method without its in-pass draws (StageVAR: "
    "projected_scales=())"
)


@dataclass(frozen=True)
class RecordRequest:
    """What one pass keeps for later scales (``state.records`` of ``after_scale``).

    Args:
        block_outputs: layers whose full block output ``(R, L, C)`` is kept (ARVAR's canvas source).
        block_deltas: layers whose ``output - input`` is kept (DepthVAR's proxies and ranking).
        sublayer_updates: ``(layer, sublayer)`` pairs whose full residual update is kept (FastVAR's cache scale).
        selections: ``(layer, sublayer)`` keys (``"block"`` for a block route) whose route's chosen positions
            ``(R, K)`` are kept (``records.selections``; a span of one block route: its first layer): what a selector
            chose inside the pass, for whoever needs it after the pass (the selector itself writes nothing).
    """

    block_outputs: FrozenSet[int] = frozenset()
    block_deltas: FrozenSet[int] = frozenset()
    sublayer_updates: FrozenSet[Tuple[int, str]] = frozenset()
    selections: FrozenSet[Tuple[int, str]] = frozenset()

    def __or__(self, other: "RecordRequest") -> "RecordRequest":
        return RecordRequest(
            self.block_outputs | other.block_outputs,
            self.block_deltas | other.block_deltas,
            self.sublayer_updates | other.sublayer_updates,
            self.selections | other.selections,
        )

    def __bool__(self) -> bool:
        return bool(self.block_outputs or self.block_deltas or self.sublayer_updates or self.selections)


NO_RECORD = RecordRequest()


class SelectedTokens(Mapping):
    """``{scale: (B, n) positions}`` that a route's selector chooses inside a pass, for ``PassRoutes.residual_tokens``
    when they are not known before the pass: the pass records the selection (``RecordRequest.selections``) and this
    mapping reads it from the pass's records once the pass has run (before, it is empty). The selector stays pure: it
    returns its positions and writes nothing.

    Args:
        records: returns the records of the current pass (``lambda: state.records``).
        key: the ``(layer, sublayer)`` whose selection is read.
        split: ``(R, K)`` selection -> ``{scale: (B, n)}`` positions.
    """

    def __init__(
        self,
        records: Callable[[], Any],
        key: Tuple[int, str],
        split: Callable[[torch.Tensor], Dict[int, torch.Tensor]],
    ):
        self._records, self.key, self._split = records, key, split
        self._chosen: Optional[Dict[int, torch.Tensor]] = None

    def _resolved(self) -> Dict[int, torch.Tensor]:
        if self._chosen is None:
            index = self._records().selections.get(self.key)
            if index is None:  # the pass has not run yet
                return {}
            self._chosen = self._split(index)  # the pass's choice, kept: later passes' records do not change it
        return self._chosen

    def __getitem__(self, scale: int) -> torch.Tensor:
        return self._resolved()[scale]

    def __iter__(self):
        return iter(self._resolved())

    def __len__(self) -> int:
        return len(self._resolved())


@dataclass
class PassRoutes:
    """Everything a scheduler asks of one pass beyond its :class:`ScalePlan`.

    Args:
        routes: ``{(layer, sublayer): TokenRoute}``; ``sublayer`` is ``"block"`` for a whole block or one of
            ``"self_attn"``, ``"cross_attn"``, ``"ffn"``. Missing entries run every token.
        record: what the executor keeps for later scales.
        residual_tokens: ``{scale: (B, n) positions}``: only these positions of the scale get a residual; the codes
            of the others are zero (LazyVAR), and heads that refine codes (HART's diffusion head) run only here.
        code_weights: ``{scale: (B, h, w)}`` weights of the scale's codes before they enter the summed latent
            (DepthVAR's code blending).
        mixing: ``{first layer: MixingRoute}``: spans of blocks run on mixtures of the tokens (StageVAR).
    """

    routes: Dict[Tuple[int, str], TokenRoute] = field(default_factory=dict)
    record: RecordRequest = NO_RECORD
    residual_tokens: Dict[int, torch.Tensor] = field(default_factory=dict)
    code_weights: Dict[int, torch.Tensor] = field(default_factory=dict)
    mixing: Dict[int, MixingRoute] = field(default_factory=dict)

    @classmethod
    def for_layers(
        cls, route: TokenRoute, layers: Iterable[int], sublayer: str = "block", **fields: Any
    ) -> "PassRoutes":
        """The same ``route`` on the ``sublayer`` of every layer of ``layers`` (one route object: the executor runs
        consecutive blocks of one block route as a span, gathering once and scattering once), with the other fields
        (``record``, ``residual_tokens``, ...) as given.

        Raises:
            ValueError: ``sublayer`` is not one of :data:`SUBLAYER_KINDS`, or a layer is not an integer >= 0.
        """
        if sublayer not in SUBLAYER_KINDS:
            raise ValueError(f"sublayer must be one of {list(SUBLAYER_KINDS)}, got {sublayer!r}")
        layers = list(layers)
        bad = [layer for layer in layers if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0]
        if bad:
            raise ValueError(f"layers must be integers >= 0, got {bad[0]!r}")
        return cls(routes={(layer, sublayer): route for layer in layers}, **fields)

    def routed_layers(self) -> FrozenSet[int]:
        """The layers any route touches."""
        spans = (layer for start, m in self.mixing.items() for layer in range(start, m.end_layer))
        return frozenset(layer for layer, _ in self.routes) | frozenset(spans)

    @property
    def acts_on_blocks(self) -> bool:
        """Whether the pass routes whole blocks, runs blocks on mixtures or records block outputs or deltas: what
        :func:`~.executor.execute_blocks` carries out around the blocks (sublayer routes are the blocks' own)."""
        return bool(
            self.mixing
            or self.record.block_outputs
            or self.record.block_deltas
            or any(kind == "block" for _, kind in self.routes)
        )

    def acts_on_layer(self, layer: int) -> bool:
        """Whether a sublayer of ``layer`` is routed or its update recorded (otherwise the block runs every token of
        every sublayer, as on the dense path)."""
        return any(self.acts_on_sublayer(layer, kind) for kind in SUBLAYER_KINDS if kind != "block")

    def acts_on_sublayer(self, layer: int, kind: str) -> bool:
        """Whether the sublayer ``kind`` of ``layer`` is routed or its update recorded (otherwise its update is only
        added to the stream, as on the dense path)."""
        return (layer, kind) in self.routes or (layer, kind) in self.record.sublayer_updates

    def __bool__(self) -> bool:
        return bool(self.routes or self.record or self.residual_tokens or self.code_weights or self.mixing)
