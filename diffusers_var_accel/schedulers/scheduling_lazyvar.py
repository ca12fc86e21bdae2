"""LazyVAR (CVPR 2026): update-index token pruning and parallel group decoding of the last scales.

Notation as in the paper (and ``docs/methods.md``): scales ``k`` with token maps ``h_k x w_k``; the aggregated latent
``f_hat_k = f_hat_{k-1} + Interpolate(r_k, (h_K, w_K))`` lives at the final resolution ``(H, W) = (h_K, w_K)``.

1. **Update index** (UIGTP): ``u_k = 1 - cos(f_hat_{k-1}, f_hat_k)`` per position, the cosine taken over the ``d``
   code channels at the final resolution; ``u_k`` is in ``[0, 2]`` and small where scale ``k`` barely changed the
   latent. ``f_hat_{-1} := 0``, and the cosine with a zero vector is 0, so ``u_0 = 1`` everywhere (every position is
   new). The index after scale ``k-1`` decides which tokens scale ``k`` computes: ``u_{k-1}`` is area-interpolated
   (averaged) to ``(h_k, w_k)`` and the top ``n_k = ceil(rho_k * h_k * w_k)`` tokens are kept (a positive keep ratio
   ``rho_k`` keeps at least one token; 0 keeps none). Pruned positions get a **zero residual**: their codes are
   zeroed before they enter ``f_hat`` (the pass's ``residual_tokens``).
2. **Parallel group decoding** (PGD): the group ``i .. i+p-1`` runs in one pass; every input is interpolated from
   ``f_hat_{i-1}`` (``r~'_{i+m} = Interpolate(f_hat_{i-1}, (h_{i+m}, w_{i+m}))``, done by the loop for a grouped plan)
   and the block-causal mask lets a scale see the cache, earlier scales of the group and itself. All scales of the
   group are pruned with the same index ``u_{i-1}``. The kept tokens run every block (one block route for all
   layers: the executor gathers them once and scatters them once); pruned tokens keep their input and their
   keys/values never enter the KV cache.
3. **Cumulative retained index**: scales of a group must not update the same positions; the highest-update tokens go
   to the largest scale. The paper sorts the downsampled index of scale ``i+m`` descending, skips the first ``cum``
   tokens and keeps the next ``n_{i+m}``, with ``cum_{i+m} = sum_{k > i+m in the group} n_k (h_K w_K) / (h_k w_k)``:
   the area claimed by the larger scales, counted at the final resolution ``K``; at the resolution of scale ``i+m``
   that is ``cum_{i+m} h_{i+m} w_{i+m} / (h_K w_K)`` tokens (``cumulative_index="count"``, rounded to the nearest
   integer). The count equals the claimed positions only when the rankings at the different resolutions nest, so the
   default (``"claimed"``) skips the claimed tokens themselves: a token of scale ``j`` covers the final positions
   ``(Y, X)`` with ``(Y h_j // H, X w_j // W)`` equal to its own ``(y, x)``; a token covering a position kept by a
   larger scale is ranked after every free one. Scales are then disjoint at the final resolution whenever a scale
   has at least ``n`` free tokens (always with the presets; a heavy setting whose kept positions reach most tokens of
   a smaller scale overlaps there, as the paper's count would).

Shape legend: ``B`` images, ``R`` rows (``2B`` under CFG), ``d`` code channels, ``H W`` the final latent, ``h w`` one
scale, ``l = h*w`` its tokens, ``n`` kept tokens of one scale, ``K`` kept tokens of one pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin  # noqa: F401 (diffusers' from_pretrained looks the
#   loadable base class up in the module named in model_index.json)

from ..next_scale.maps import cells_marked, position_mask, resize_map, values_at
from ..next_scale.plan import PassRoutes, RecordRequest, SelectedTokens, TokenRoute
from .presets import PackagedPresets
from .scheduling_fastvar import pivotal_token_scores
from .scheduling_var_base import ScalePlan, VARAccelScheduler, check_ratio, resolve_scale_index

CUMULATIVE_INDEX_MODES = ("claimed", "count", None)
#: What ranks a pass's tokens (``token_scores``).
TOKEN_SCORES = ("update_index", "pivotal")
#: Where a pivotal-score pass records its selection: the block route of its first layer (one span over every layer).
PIVOTAL_SELECTION = (0, "block")


def update_index(f_hat_prev_BdHW: Optional[torch.Tensor], f_hat_BdHW: torch.Tensor) -> torch.Tensor:
    """``u = 1 - cos(f_hat_prev, f_hat)`` over the channels, per position: ``(B, H, W)``; ``None`` = a zero latent."""
    f_hat_BdHW = f_hat_BdHW.float()
    prev_BdHW = torch.zeros_like(f_hat_BdHW) if f_hat_prev_BdHW is None else f_hat_prev_BdHW.float()
    return 1 - F.cosine_similarity(prev_BdHW, f_hat_BdHW, dim=1)


def num_kept_tokens(keep_ratio: float, num_tokens: int) -> int:
    """``n = ceil(rho * l)`` (with a rounding guard: ``0.2 * 1600`` is 320, not 321), in ``[0, l]``."""
    return min(num_tokens, max(0, math.ceil(keep_ratio * num_tokens - 1e-6)))


def _cell_of_position(hw: Tuple[int, int], final_hw: Tuple[int, int], device) -> torch.Tensor:
    """``(H*W,)``: the flat index of the token of an ``h x w`` map that covers each final position (nearest)."""
    (h, w), (H, W) = hw, final_hw
    rows = torch.arange(H, device=device) * h // H
    cols = torch.arange(W, device=device) * w // W
    return (rows[:, None] * w + cols[None, :]).flatten()


def lazyvar_keep_indices(
    update_index_BHW: torch.Tensor,
    scale_hws: Sequence[Tuple[int, int]],
    keep_ratios: Sequence[float],
    cumulative_index: Optional[str] = "claimed",
) -> List[torch.Tensor]:
    """The tokens that each scale of a group computes, chosen by one update index (steps 1 and 3 of the method).

    Args:
        update_index_BHW (`torch.Tensor`): the update index after the scale before the group, ``(B, H, W)``.
        scale_hws (`list[tuple[int, int]]`): ``(h, w)`` of the group's scales, smallest first.
        keep_ratios (`list[float]`): ``rho`` per scale.
        cumulative_index (`str`, *optional*, defaults to `"claimed"`): ``"claimed"`` (skip tokens over positions
            kept by larger scales), ``"count"`` (skip a count ``cum`` of the first tokens: our reading of the paper's
            cumulative index as a number, not its literal text) or ``None``
            (every scale keeps its own top ``n``: the paper's "without cumulative index").

    Returns:
        `list[torch.Tensor]`: per scale, ``(B, n)`` flat token indices in ascending order (the same ``n`` per row).
    """
    B, H, W = update_index_BHW.shape
    areas = [h * w for h, w in scale_hws]
    counts = [num_kept_tokens(r, l) for r, l in zip(keep_ratios, areas)]
    claimed_BP = torch.zeros(B, H * W, dtype=torch.bool, device=update_index_BHW.device)
    kept: List[Optional[torch.Tensor]] = [None] * len(scale_hws)
    for m in reversed(range(len(scale_hws))):  # the largest scale takes the highest-update tokens
        (h, w), n, l = scale_hws[m], counts[m], areas[m]
        u_Bl = resize_map(update_index_BHW, (h, w), "area")  # the index averaged over each token's area
        skip = 0
        if cumulative_index == "claimed":
            cell_P = _cell_of_position((h, w), (H, W), u_Bl.device).expand(B, -1)
            u_Bl = u_Bl - 3.0 * cells_marked(
                claimed_BP, cell_P, l
            )  # u is in [0, 2]: claimed tokens sort after free ones
        elif cumulative_index == "count":
            cum_final = sum(counts[k] * (H * W) / areas[k] for k in range(m + 1, len(scale_hws)))
            skip = min(l, round(cum_final * l / (H * W)))
        order_Bl = torch.sort(u_Bl, dim=1, descending=True, stable=True).indices
        kept[m] = order_Bl[:, skip : skip + n].sort(dim=1).values
        if cumulative_index == "claimed":
            claimed_BP |= values_at(position_mask(kept[m], l), cell_P)
    return kept


class PivotalGroupTokens:
    """LazyVAR's tokens chosen by FastVAR's pivotal-token score (PTS) of the pass's input: each scale of the pass keeps
    its ``n`` highest-scoring tokens, chosen on the conditional rows and shared by an image's two CFG rows. The
    executor evaluates it once, before the first block. It is pure: it returns the positions of the pass's tokens and
    writes nothing; :meth:`split` turns them into each scale's own positions (the pass's zero-residual positions and
    the call's kept tokens, read from the pass's records after it ran)."""

    def __init__(self, scale_indices: Sequence[int], lengths: Sequence[int], counts: Sequence[int], batch_size: int):
        self.scale_indices, self.lengths, self.counts = tuple(scale_indices), tuple(lengths), tuple(counts)
        self.batch_size = batch_size

    def __call__(self, x_RLC: torch.Tensor) -> torch.Tensor:
        parts, offset = [], 0
        for length, n in zip(self.lengths, self.counts):
            scores_Bl = pivotal_token_scores(x_RLC[: self.batch_size, offset : offset + length])
            index_Bn = scores_Bl.topk(n, dim=1, sorted=False).indices.sort(dim=1).values
            parts.append(index_Bn + offset)
            offset += length
        index_BK = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        return index_BK.repeat(x_RLC.shape[0] // self.batch_size, 1)

    def split(self, index_RK: torch.Tensor) -> Dict[int, torch.Tensor]:
        """``{scale: (B, n)}`` each scale's chosen positions (counted within the scale) from a selection of this
        selector (the first ``B`` rows: an image's CFG rows share its choice)."""
        chosen, start, offset = {}, 0, 0
        for k, length, n in zip(self.scale_indices, self.lengths, self.counts):
            chosen[k] = index_RK[: self.batch_size, start : start + n] - offset
            start, offset = start + n, offset + length
        return chosen


@dataclass
class LazyVARCallState:
    """What LazyVAR keeps during one call.

    Args:
        f_hat_before: the summed latent before the scale whose update index is read.
        update_index: ``(B, H, W)`` the last update index.
        kept: ``{scale: (B, n)}`` the positions each pruned scale computes.
        chosen: the positions the current pass's selector chooses (pivotal scores), until ``after_scale`` keeps them.
    """

    f_hat_before: Optional[torch.Tensor] = None
    update_index: Optional[torch.Tensor] = None
    kept: Dict[int, torch.Tensor] = field(default_factory=dict)
    chosen: Optional[Mapping[int, torch.Tensor]] = None


class LazyVARScheduler(VARAccelScheduler, method="lazyvar"):
    r"""LazyVAR: prune the last scales by their update index and decode them in one parallel group.

    Scales before the group run in full; the group's scales run in one pass (or, without parallel decoding, one after
    another, each pruned by the index after the previous scale: the paper's "without PGD" ablation).

    Presets: ``"infinity"`` is the paper's setting on Infinity's 13 scales: scales 1-9 in full, group {10, 11, 12,
    13} (sides 32, 40, 48, 64 at 1M pixels) with keep ratios 20%, 10%, 5%, 1%. Counted from the end, the same group
    is the last four scales of every aspect ratio and pixel budget. ``"hart"``: the paper reports 32.09 TFLOPs for
    HART-0.7B (baseline 45.59) without giving its setting; the preset groups HART's last two scales (48, 64) with
    keep ratios 50% and 35%, the setting whose FLOPs saving (13.48 TFLOPs) matches the paper's (13.50) under the
    counting convention that reproduces the FastVAR paper's HART saving exactly (linear layers only, ``docs/flops.md``).
    Infinity's ratios on HART's last four scales would save 21.7 TFLOPs, 1.6x the paper's. HART's residual diffusion
    head runs only on the last scale's kept tokens; pruned positions get a zero residual, diffusion part included.

    Args:
        group_scales (`tuple[int]`, *optional*, defaults to `(-4, -3, -2, -1)`): consecutive scale indices of the
            group (negative = from the end); scale 0 cannot be in it.
        keep_ratios (`tuple[float]`, *optional*, defaults to `(0.20, 0.10, 0.05, 0.01)`): ``rho`` per scale of the
            group, in [0, 1]; ``n = ceil(rho * h * w)`` tokens are computed.
        cumulative_index (`str`, *optional*, defaults to `"claimed"`): how a group's scales avoid the positions of
            larger scales: ``"claimed"``, ``"count"`` (a count of the first tokens, our reading of the paper's) or
            ``None`` (no cumulative index). Only a
            parallel group uses it.
        parallel_decoding (`bool`, *optional*, defaults to `True`): decode the group in one pass (PGD).
        token_scores (`str`, *optional*, defaults to `"update_index"`): what ranks the tokens: the update index, or
            ``"pivotal"``: FastVAR's pivotal-token score of the pass's input tokens (the paper's "PTS instead of the
            update index" ablation; each scale of the pass keeps its own top ``n``, no cumulative index).
        model_family (`str`, *optional*): the model family the setting is meant for (a scheduler for another
            family is refused); `None`, the default, fits every family (`from_preset(family)` sets it).

    Examples:
        ```py
        >>> from diffusers_var_accel.schedulers import LazyVARScheduler
        >>> from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

        >>> pipe = build_tiny_infinity_pipeline(seed=0)
        >>> lazyvar = LazyVARScheduler.from_preset("infinity", keep_ratios=(0.4, 0.2, 0.1, 0.02))
        >>> image = pipe("a red fox in the snow", height=256, width=256, acceleration=lazyvar).images[0]
        ```
    """

    #: ``{family: kwargs}`` read from the packaged JSON presets ``infinity-2b/lazyvar`` and ``hart-0.7b/lazyvar``.
    presets = PackagedPresets("lazyvar")
    call_state_class = LazyVARCallState
    selects_tokens = True

    @register_to_config
    def __init__(
        self,
        group_scales: Sequence[int] = (-4, -3, -2, -1),
        keep_ratios: Sequence[float] = (0.20, 0.10, 0.05, 0.01),
        cumulative_index: Optional[str] = "claimed",
        parallel_decoding: bool = True,
        token_scores: str = "update_index",
        model_family: Optional[str] = None,
    ):
        super().__init__()
        self._check_family_name(model_family)
        group = tuple(group_scales)
        if not group or not all(isinstance(s, int) and not isinstance(s, bool) for s in group):
            raise ValueError(f"group_scales must be a non-empty list of scale indices, got {group_scales!r}")
        if len(keep_ratios) != len(group):
            raise ValueError(
                f"need one keep ratio per scale of the group: {len(group)} scales, {len(keep_ratios)} ratios"
            )
        for i, r in enumerate(keep_ratios):
            check_ratio(r, f"keep_ratios[{i}]")
        if 0 in group:
            raise ValueError(f"group_scales {group} contains scale 0; the start token always runs alone and in full")
        if len({s < 0 for s in group}) == 1 and group != tuple(range(group[0], group[0] + len(group))):
            raise ValueError(f"group_scales {group} must be consecutive and ascending, e.g. (-4, -3, -2, -1)")
        if cumulative_index not in CUMULATIVE_INDEX_MODES:
            raise ValueError(
                f"cumulative_index must be one of {list(CUMULATIVE_INDEX_MODES)}, got {cumulative_index!r}"
            )
        if token_scores not in TOKEN_SCORES:
            raise ValueError(f"token_scores must be one of {list(TOKEN_SCORES)}, got {token_scores!r}")
        if not isinstance(parallel_decoding, bool):
            raise ValueError(f"parallel_decoding must be True or False, got {parallel_decoding!r}")

    # -- the group on a schedule -------------------------------------------------------------------------------------
    def group(self, num_scales: int) -> Tuple[int, ...]:
        """The group's scale indices on a schedule of ``num_scales`` scales.

        Raises:
            ValueError: an index is outside the schedule, the resolved group is not consecutive, or it holds scale 0.
        """
        given = tuple(self.config.group_scales)
        group = tuple(resolve_scale_index(s, num_scales, "LazyVAR group scale") for s in given)
        if group != tuple(range(group[0], group[0] + len(group))):
            raise ValueError(f"group_scales {given} resolve to {group} on {num_scales} scales: not consecutive")
        if group[0] == 0:
            raise ValueError(f"group_scales {given} include scale 0 on {num_scales} scales; it runs alone and in full")
        return group

    def _indexed_scales(self, group: Tuple[int, ...]) -> Tuple[int, ...]:
        """The scales whose update index is read: the one before the group (and, without PGD, the group's own)."""
        return tuple(range(group[0] - 1, group[-1] if not self.config.parallel_decoding else group[0]))

    def kept_tokens(self, state) -> Dict[int, torch.Tensor]:
        """The tokens each pruned scale computed in the call of ``state``: ``{scale: (B, n) flat indices}``."""
        return self.call_state(state).kept

    # -- calibration ----------------------------------------------------------------------------------------------------
    @classmethod
    def calibration_grid(cls, num_layers: int) -> List[Dict[str, Any]]:
        """The last scale alone, or a group of the last 2, 3 or 4 scales decoded in one pass or scale by scale; keep
        ratios flat or halving towards the largest scale (the paper's 20/10/5/1 % halve), starting at 85, 70, 50, 35,
        20 or 10 %."""
        grid = []
        firsts = (0.85, 0.7, 0.5, 0.35, 0.2, 0.1)
        for first in firsts:
            grid.append(dict(group_scales=[-1], keep_ratios=[first], parallel_decoding=False))
        for size in (2, 3, 4):
            for parallel in (False, True):
                for profile in ("flat", "halving"):
                    for first in firsts:
                        ratios = [round(first * (0.5**i if profile == "halving" else 1.0), 4) for i in range(size)]
                        grid.append(
                            dict(group_scales=list(range(-size, 0)), keep_ratios=ratios, parallel_decoding=parallel)
                        )
        return grid

    @classmethod
    def composition_calibration_grid(cls, num_layers: int) -> List[Dict[str, Any]]:
        """The last one, two, three or four scales, pruned scale by scale or as one parallel group."""
        return [
            dict(group_scales=[-1], keep_ratios=[0.5], parallel_decoding=False),
            dict(group_scales=[-1], keep_ratios=[0.2], parallel_decoding=False),
            dict(group_scales=[-2, -1], keep_ratios=[0.5, 0.25], parallel_decoding=False),
            dict(group_scales=[-2, -1], keep_ratios=[0.35, 0.35], parallel_decoding=False),
            dict(group_scales=[-2, -1], keep_ratios=[0.2, 0.1], parallel_decoding=True),
            dict(group_scales=[-3, -2, -1], keep_ratios=[0.5, 0.25, 0.125], parallel_decoding=True),
            dict(group_scales=[-4, -3, -2, -1], keep_ratios=[0.25, 0.25, 0.25, 0.25], parallel_decoding=False),
            dict(group_scales=[-4, -3, -2, -1], keep_ratios=[0.1, 0.1, 0.1, 0.1], parallel_decoding=False),
        ]

    # -- extension points ---------------------------------------------------------------------------------------------
    def acted_scales(self, scale_schedule):
        group = self.group(len(scale_schedule))
        return frozenset(group) | frozenset(self._indexed_scales(group))

    def plan_scales(self, scale_schedule, model=None):
        num_scales = len(scale_schedule)
        group, ratios = self.group(num_scales), [float(r) for r in self.config.keep_ratios]
        plans = [ScalePlan((k,)) for k in range(group[0])]
        if self.config.parallel_decoding:
            plans.append(ScalePlan(group, skip=not any(ratios)))
        else:
            # a scale that keeps nothing is skipped; the next one reads the index before it (after_scale is not called)
            plans += [ScalePlan((k,), skip=r == 0) for k, r in zip(group, ratios)]
        return plans + [ScalePlan((k,)) for k in range(group[-1] + 1, num_scales)]

    def before_scale(self, state, plan):
        group = self.group(state.num_scales)
        call = self.call_state(state)
        if plan.scale_indices[-1] in self._indexed_scales(group):
            call.f_hat_before = state.f_hat
        if plan.scale_indices[0] not in group or plan.skip or self.config.token_scores == "pivotal":
            return
        hws = [tuple(state.scale_schedule[k][-2:]) for k in plan.scale_indices]
        ratios = [self.config.keep_ratios[k - group[0]] for k in plan.scale_indices]
        mode = self.config.cumulative_index if self.config.parallel_decoding else None
        if call.update_index is None:
            raise ValueError(f"LazyVAR needs the update index of scale {plan.scale_indices[0] - 1}, which did not run")
        kept = lazyvar_keep_indices(call.update_index, hws, ratios, mode)
        call.kept.update(zip(plan.scale_indices, kept))

    def route_pass(self, state, plan):
        """The kept tokens of the pass run every block (one span: gathered once, scattered once); the other
        positions pass through and get a zero residual."""
        kept = self.call_state(state).kept
        if (
            self.config.token_scores == "pivotal"
            and plan.scale_indices[0] in self.group(state.num_scales)
            and not plan.skip
        ):
            return self._pivotal_routes(state, plan)
        if plan.scale_indices[0] not in kept:
            return None
        schedule, offset, parts = state.scale_schedule, 0, []
        for k in plan.scale_indices:
            parts.append(kept[k] + offset)
            offset += schedule[k][-2] * schedule[k][-1]
        index_BK = torch.cat(parts, dim=1)
        if index_BK.shape[1] == offset:
            return None  # every token kept: the dense pass
        counts = tuple(int(kept[k].shape[1]) for k in plan.scale_indices) if len(plan.scale_indices) > 1 else None
        route = TokenRoute(index=index_BK, scale_counts=counts)
        return PassRoutes.for_layers(
            route, range(state.model.num_layers), residual_tokens={k: kept[k] for k in plan.scale_indices}
        )

    def _pivotal_routes(self, state, plan) -> PassRoutes:
        group, schedule = self.group(state.num_scales), state.scale_schedule
        lengths = [int(schedule[k][-2] * schedule[k][-1]) for k in plan.scale_indices]
        counts = [
            num_kept_tokens(self.config.keep_ratios[k - group[0]], l) for k, l in zip(plan.scale_indices, lengths)
        ]
        select = PivotalGroupTokens(plan.scale_indices, lengths, counts, state.batch_size)
        route = TokenRoute(selector=select, scale_counts=tuple(counts) if len(counts) > 1 else None)
        # the zero-residual positions are the selector's choice, recorded by the pass and read from its records after it
        chosen = SelectedTokens(lambda: state.records, PIVOTAL_SELECTION, select.split)
        self.call_state(state).chosen = chosen
        return PassRoutes.for_layers(
            route,
            range(state.model.num_layers),
            record=RecordRequest(selections=frozenset({PIVOTAL_SELECTION})),
            residual_tokens=chosen,
        )

    def after_scale(self, state, plan, hidden_states_RLC):
        call = self.call_state(state)
        if call.chosen is not None:  # the tokens the pass's selector chose (pivotal scores)
            call.kept.update(call.chosen)
            call.chosen = None
        if plan.scale_indices[-1] in self._indexed_scales(self.group(state.num_scales)):
            call.update_index = update_index(call.f_hat_before, state.f_hat)
            call.f_hat_before = None
