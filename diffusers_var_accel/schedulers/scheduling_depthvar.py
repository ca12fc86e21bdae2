"""DepthVAR: every token of a late scale gets a number of layers instead of keep / drop (CVPR 2026 Findings).

The paper names a repository (``STOVAGtz/DepthVAR``), not retrievable here, so this follows the paper's text;
where it is ambiguous the choice is ours, stated here and in ``docs/depthvar.md``. Equations
are numbered in the method's order (``shared/docs/methods.md``). For a dynamic scale ``i`` of ``N = h w`` tokens and
a model of ``L`` layers:

1. **Ranking map** ``B_{i-1} = sum_l mean_c |r_{i-1}^l - r_{i-1}^{l-1}|``: each position's absolute change across the
   layers of the previous scale (mean over the CFG rows of an image), bilinearly resized to ``(h_i, w_i)``.     (1)
2. **Scheduling function with cyclic percentile rotation.** ``rho = (rank + 1/2) / N`` (ascending change, ties by
   position); ``S_i = G'(rho) = s + (1 - s) ((rho + phi_i) mod 1) ** gamma_i`` with ``s = min_depth / L`` and
   ``gamma_i = (1 - s) / (f_i - s) - 1``, so the mean score is the budget ``f_i = min(1, N_R / N_i)``: a dynamic
   scale costs what the reference scale ``R`` costs at full depth (``f_i = 1``: ``S = 1``; ``f_i <= s``: ``S = s``).
   ``phi_i = rotation_step * (i - start) mod 1``: the deep band of percentiles moves down the ranking from one
   dynamic scale to the next and wraps around, so positions that ran shallow at one scale run deep later.      (2)
3. **Bit-reversal depth mapping.** ``D = clamp(floor(S L), min_depth, L)``; a token runs ``D`` consecutive entries of
   the bit-reversal sequence of ``0..L-1`` (L = 32, D = 5 from the start: {0, 16, 8, 24, 4}) starting at its offset
   ``o = rank mod L`` (``cyclic_layer_offsets``; else ``o = 0``, the literal "first D entries"). Tokens of one depth
   have consecutive ranks, so every layer computes about ``f_i`` of the tokens. ``L`` not a power of two: bit-reverse
   over the next power of two, drop values ``>= L``, keep the order. ``M_i(l, m, n) = 1[l in layers(m, n)]``.    (3)
4. **Cached proxy** ``r_i^l = Layer_l(r_i^{l-1} . M) + up(r_{i-1}^l - r_{i-1}^{l-1}) . (1 - M)``, ``up`` bilinear.
   Computed tokens run the whole block on the gathered tokens (attention to the KV cache and this scale's tokens of
   layer ``l``); only they enter layer ``l``'s KV cache: later scales see there only the positions that ran it. (4)
5. **Code blending** ``z_i = S_i . lookup(p_i)``.                                                                (5)

``rho``, ``S``, ``D`` and the per-layer token counts depend on ranks only: no shape depends on values (meta-tensor
FLOP counts work). The scale before the first dynamic one routes every token (bit-identical to dense) to record.

Shape legend: ``B`` images, ``R`` rows (``2B`` under CFG), ``N`` tokens of a scale, ``K`` of one layer, ``C`` width.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from diffusers.configuration_utils import register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin  # noqa: F401 (diffusers' from_pretrained looks the
#   loadable base class up in the module named in model_index.json)

from ..next_scale.maps import place_values, resize_map, unpermute, values_at
from ..next_scale.plan import LayerProxy, PassRoutes, RecordRequest, TokenRoute, TokenSelection
from ..next_scale.executor import match_rows
from .presets import PackagedPresets
from .scheduling_var_base import VARAccelScheduler, resolve_scale_index


#: The default percentile rotation per dynamic scale (Eq. 2). The paper states no step; 0.25 had the highest mean SSIM
#: to the baseline on the 12 calibration prompts among 0, 0.25, 1/3 and 0.5 (docs/depthvar.md).
ROTATION_STEP = 0.25


def bit_reversal_permutation(num_layers: int) -> List[int]:
    """Eq. (3): ``0..L-1`` in bit-reversed order (over the next power of two, values ``>= L`` dropped)."""
    if not _is_int(num_layers) or num_layers < 1:
        raise ValueError(f"num_layers must be an integer >= 1, got {num_layers!r}")
    bits = max(1, (num_layers - 1).bit_length())
    order = (int(format(i, f"0{bits}b")[::-1], 2) for i in range(2**bits))
    return [layer for layer in order if layer < num_layers]


def scheduling_function(rho: torch.Tensor, budget: float, phase: float = 0.0, min_score: float = 0.0) -> torch.Tensor:
    """Eq. (2): ``S = G'(rho)``, rotated by ``phase``, with scores in ``[min_score, 1]`` and mean ``budget``."""
    for name, value in (("budget", budget), ("min_score", min_score), ("every percentile rho", rho)):
        _check_unit_interval(value, name)
    u = torch.remainder(rho + phase, 1.0)
    if budget >= 1.0:
        return torch.ones_like(u)
    if budget <= min_score:
        return torch.full_like(u, min_score)
    gamma = (1.0 - min_score) / (budget - min_score) - 1.0
    return min_score + (1.0 - min_score) * u.pow(gamma)


def layer_masks(
    scores: torch.Tensor, num_layers: int, offsets: Optional[torch.Tensor] = None, min_depth: int = 0
) -> torch.Tensor:
    """Eq. (3): ``M[..., l]``, whether a token of depth score ``S`` runs layer ``l`` (bool, ``(..., L)``).

    Raises:
        ValueError: a depth score outside [0, 1], or ``min_depth`` outside ``0..L``.
    """
    _check_unit_interval(scores, "every depth score")
    if not 0 <= min_depth <= num_layers:
        raise ValueError(f"min_depth {min_depth} is outside 0..{num_layers} for a {num_layers}-layer model")
    order = torch.tensor(bit_reversal_permutation(num_layers))
    position = torch.argsort(order)  # layer -> place in the sequence (the inverse permutation)
    depth = (scores * num_layers).floor().clamp(min_depth, num_layers).long()
    offsets = torch.zeros_like(depth) if offsets is None else offsets.long()
    return torch.remainder(position - offsets.unsqueeze(-1), num_layers) < depth.unsqueeze(-1)


@dataclass(frozen=True)
class ScaleDepth:
    """The depth plan of one dynamic scale: ``scores`` / ``depth`` ``(B, h, w)``, tokens per layer ``{l: (B, K_l)}``
    (ascending; views of one ``(B, sum K_l)`` tensor, layer by layer, when :func:`plan_depth` made it)."""

    scores: torch.Tensor
    depth: torch.Tensor
    layer_index: Dict[int, torch.Tensor]
    #: ``(B, sum K_l)``: every layer's tokens, layer after layer (``layer_index`` are its slices); ``None``: not kept.
    flat_index: Optional[torch.Tensor] = None

    def index_rows(self, rows: int, tables=None) -> Dict[int, torch.Tensor]:
        """``{l: (rows, K_l)}``, each image's tokens repeated for its CFG rows (conditional rows first), every layer's
        tensor contiguous: one copy for all layers (a gather by a cached permutation) instead of one per layer."""
        B = next(iter(self.layer_index.values())).shape[0]
        if self.flat_index is None or (rows == B == 1):
            return {l: match_rows(index, rows) for l, index in self.layer_index.items()}
        if rows % B:
            raise ValueError(f"cannot lay out {B} images' depth plans as {rows} rows (conditional rows first)")
        counts = tuple(int(index.shape[1]) for index in self.layer_index.values())
        perm = _layer_major_permutation(counts, B, rows, self.flat_index.device, tables)
        flat = self.flat_index.reshape(-1)[perm]
        out, start = {}, 0
        for l, count in zip(self.layer_index, counts):
            out[l] = flat[start : start + rows * count].view(rows, count)
            start += rows * count
        return out


@dataclass(frozen=True)
class RankDepthPlan:
    """The data-independent part of Eqs. (2)-(3) for ``N`` ranks, on one device: the score and depth of every rank
    ``(N,)`` and, per layer, the ranks that run it ``{l: (K_l,)}`` in increasing order; ``flat_ranks`` is every
    layer's ranks one layer after another ``(sum K_l,)``, and ``layer_keys`` ``l * N`` at each of its entries (a key
    that sorts every layer's tokens in one call)."""

    scores: torch.Tensor
    depth: torch.Tensor
    ranks: Dict[int, torch.Tensor]
    flat_ranks: torch.Tensor
    layer_keys: torch.Tensor


@functools.lru_cache(maxsize=256)
def _rank_depth_plan_host(
    N: int, num_layers: int, budget: float, phase: float, min_depth: int, cyclic_layer_offsets: bool
) -> RankDepthPlan:
    rho = (torch.arange(N, dtype=torch.float64) + 0.5) / N
    scores = scheduling_function(rho, budget, phase, min(1.0, min_depth / num_layers))  # layer_masks checks min_depth
    offsets = torch.arange(N) % num_layers if cyclic_layer_offsets else None
    mask = layer_masks(scores, num_layers, offsets, min_depth)  # (N, L), by rank
    ranks = {l: mask[:, l].nonzero()[:, 0] for l in range(num_layers)}
    keys = torch.cat([torch.full((len(r),), l * N, dtype=torch.long) for l, r in ranks.items()])
    return RankDepthPlan(scores.float(), mask.sum(-1), ranks, torch.cat(list(ranks.values())), keys)


def _on_device(key: tuple, host, device: torch.device, move_all, tables=None):
    """``host`` (a plan of host tensors) on ``device``: copied once per key into ``tables`` (the pipeline's
    :class:`~diffusers_var_accel.next_scale.state.ScheduleTables`, so later calls read it back with no upload), or
    copied for this use alone without them."""
    if device.type == "cpu":
        return host

    def move(t):  # pinned host memory: the copy is queued without waiting for the device
        return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)

    if tables is None:
        return move_all(move)
    return tables.get(("depthvar",) + key + (str(device),), lambda: move_all(move))


def rank_depth_plan(
    N: int,
    num_layers: int,
    budget: float,
    phase: float,
    min_depth: int,
    cyclic_layer_offsets: bool,
    device=None,
    tables=None,
) -> RankDepthPlan:
    """The rank-space depth plan (it depends on the setting and the token count only, never on the data), computed
    once on the host per setting and kept on ``device``: a generation that meets a setting again reads nothing back
    from the device (no ``nonzero`` per layer) and uploads nothing (the copies are cached too)."""
    key = ("ranks", N, num_layers, float(budget), float(phase), min_depth, bool(cyclic_layer_offsets))
    host = _rank_depth_plan_host(*key[1:])
    device = torch.device("cpu") if device is None else torch.device(device)
    return _on_device(
        key,
        host,
        device,
        tables=tables,
        move_all=lambda move: RankDepthPlan(
            move(host.scores),
            move(host.depth),
            {l: move(r) for l, r in host.ranks.items()},
            move(host.flat_ranks),
            move(host.layer_keys),
        ),
    )


@functools.lru_cache(maxsize=256)
def _layer_major_permutation_host(counts: Tuple[int, ...], B: int, rows: int) -> torch.Tensor:
    # entry (l, r, k) of the output reads entry (r mod B, offset_l + k) of the (B, sum K) input
    total, parts, offset = sum(counts), [], 0
    for count in counts:
        image = torch.arange(rows).remainder(B).view(rows, 1)
        parts.append((image * total + offset + torch.arange(count).view(1, count)).reshape(-1))
        offset += count
    return torch.cat(parts)


def _layer_major_permutation(
    counts: Tuple[int, ...], B: int, rows: int, device: torch.device, tables=None
) -> torch.Tensor:
    host = _layer_major_permutation_host(counts, B, rows)
    return _on_device(("rows", counts, B, rows), host, device, lambda move: move(host), tables)


def plan_depth(
    ranking_BN: torch.Tensor,
    hw: Tuple[int, int],
    num_layers: int,
    budget: float,
    phase: float,
    min_depth: int,
    cyclic_layer_offsets: bool,
    tables=None,
) -> ScaleDepth:
    """Eqs. (2)-(3) for one scale from its ranking map. Everything but the final gather lives in rank space.

    Every layer's tokens are sorted in one call: the token ids of all layers, one layer after another, keyed by
    ``l * N + token`` (distinct keys, so one sort orders each layer's tokens and keeps the layers in place)."""
    B, N = ranking_BN.shape
    order_BN = ranking_BN.argsort(dim=1, stable=True)  # rank -> token
    device = order_BN.device
    ranks = rank_depth_plan(N, num_layers, budget, phase, min_depth, cyclic_layer_offsets, device, tables)

    def by_token(values_N):  # a value per rank -> a (B, h, w) map
        return unpermute(values_N.expand(B, N), order_BN).view(B, *hw)

    flat = (order_BN[:, ranks.flat_ranks] + ranks.layer_keys).sort(dim=1).values - ranks.layer_keys
    layer_index, start = {}, 0
    for l in range(num_layers):
        count = int(ranks.ranks[l].shape[0])
        layer_index[l] = flat[:, start : start + count]
        start += count
    return ScaleDepth(by_token(ranks.scores), by_token(ranks.depth), layer_index, flat)


@dataclass
class DepthSource:
    """One scale's record for the next pass: its layer deltas ``{l: (R, N, C)}`` and the summed change of Eq. (1)
    ``(R, N)``."""

    scale: int
    hw: Tuple[int, int]
    deltas: Dict[int, torch.Tensor]
    change: torch.Tensor


@dataclass
class DepthVARCallState:
    """What DepthVAR keeps during one call: the last source scale and the depth plan of every dynamic scale."""

    source: Optional[DepthSource] = None
    plans: Dict[int, ScaleDepth] = field(default_factory=dict)


class DepthVARScheduler(VARAccelScheduler, method="depthvar"):
    r"""DepthVAR (CVPR 2026 Findings): dynamic per-token depth on the late scales, proxies for skipped layers.

    Late scales give each token a depth score ``S`` from the previous scale's per-position change (Eqs. 1-2), run it
    through ``floor(S L)`` layers spread by bit reversal (Eq. 3), fill the skipped layers with the previous scale's
    upsampled layer delta (Eq. 4) and weight its codes by ``S`` (Eq. 5). The mean depth of scale ``i`` is
    ``min(1, N_R / N_i)`` of the model (the full-depth cost of scale ``R``), so a smaller ``R`` runs fewer layers.

    Presets: ``"infinity"`` is the paper's R = 9 point (1.7x latency; scales 10..13 of 1M are dynamic), and
    ``reference_scale=7`` its R = 7 point (3.1x); ``"hart"``: R = 10 of 14 scales (21x21, 5th from the end as R = 9).

    Args:
        reference_scale (`int`, defaults to 9): the paper's ``R``, **1-based** as in the paper (9 = the 9th scale,
            24x24 at 1M pixels); negative counts from the end (-1 = the last scale). It must exist in the schedule.
        start_scale (`int`, *optional*): first scale with dynamic depth, a 0-based scale index as everywhere in the
            library (negative = from the end); `None` = the scale after ``R``. Earlier scales run at full depth. Scales
            up to ``R`` have budget 1 (full depth, ``S = 1``) even when dynamic.
        end_scale (`int`, *optional*): last scale with dynamic depth (0-based, negative = from the end); `None` = the
            last scale. Later scales run at full depth, so DepthVAR can stand before another method's scales (a
            LazyVAR group).
        rotation_step (`float`, defaults to 0.25): percentile rotation per dynamic scale, in [0, 1); 0 disables it
            (the paper's "without rotation" ablation). The paper calls the rotation its key step but states no step,
            so 0.25 was chosen on the 12 calibration prompts alone by the calibration's rule (highest mean SSIM to the
            baseline; docs/depthvar.md, "How the defaults were decided"). Every packaged preset uses it.
        min_depth (`int`, defaults to 1): every token runs at least this many layers (0 allows pure-proxy tokens).
        cyclic_layer_offsets (`bool`, defaults to `True`): start each token's bit-reversal sequence at ``rank mod L``
            (balanced layers); `False` starts every token at layer 0 (the literal "first D entries").
        code_blending (`bool`, defaults to `True`): weight the codes of dynamic scales by ``S`` (Eq. 5).
        model_family (`str`, *optional*): the model family the setting is for (a scheduler for another family is
            refused); `None`, the default, fits every family (`from_preset(family)` sets it).

    Examples:
        ```py
        >>> import torch
        >>> from diffusers_var_accel import DepthVARScheduler
        >>> from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

        >>> pipe = build_tiny_infinity_pipeline(depth=8)
        >>> depthvar = DepthVARScheduler.from_preset("infinity", reference_scale=7)
        >>> image = pipe("a red fox in the snow", height=512, width=512, acceleration=depthvar).images[0]
        ```
    """

    #: ``{family: kwargs}`` read from the packaged JSON presets ``infinity-2b/depthvar`` and ``hart-0.7b/depthvar``.
    presets = PackagedPresets("depthvar")
    call_state_class = DepthVARCallState
    #: Eq. (2) ranks every token of a dynamic scale by the previous scale's change, a sum of GEMM outputs: batched
    #: rounding (~1e-6) can swap two near-tied ranks, which changes their depths and code weights (docs/depthvar.md).
    batch_equals_single_runs = False

    @register_to_config
    def __init__(
        self,
        reference_scale: int = 9,
        start_scale: Optional[int] = None,
        end_scale: Optional[int] = None,
        rotation_step: float = ROTATION_STEP,
        min_depth: int = 1,
        cyclic_layer_offsets: bool = True,
        code_blending: bool = True,
        model_family: Optional[str] = None,
    ):
        super().__init__()
        self._check_family_name(model_family)
        if not _is_int(reference_scale) or reference_scale == 0:
            raise ValueError(
                f"reference_scale must be a 1-based scale number (1, 2, ...) or negative from the end (-1 = last), got {reference_scale!r}"
            )
        if start_scale is not None and not _is_int(start_scale):
            raise ValueError(
                f"start_scale must be a scale index (negative = from the end) or None, got {start_scale!r}"
            )
        if end_scale is not None and not _is_int(end_scale):
            raise ValueError(f"end_scale must be a scale index (negative = from the end) or None, got {end_scale!r}")
        if (
            isinstance(rotation_step, bool)
            or not isinstance(rotation_step, (int, float))
            or not 0 <= rotation_step < 1
        ):
            raise ValueError(f"rotation_step must be a percentile shift in [0, 1), got {rotation_step!r}")
        if not _is_int(min_depth) or min_depth < 0:
            raise ValueError(f"min_depth must be a number of layers >= 0, got {min_depth!r}")
        for name, value in (("cyclic_layer_offsets", cyclic_layer_offsets), ("code_blending", code_blending)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")

    # -- the setting on one schedule ---------------------------------------------------------------------------------
    def budgets(self, scale_schedule) -> Dict[int, float]:
        """``{dynamic scale index: f_i = min(1, N_R / N_i)}`` on ``scale_schedule``.

        Raises:
            ValueError: ``R`` or ``start_scale`` outside the schedule, or ``start_scale`` resolving to scale 0.
        """
        n, R = len(scale_schedule), self.config.reference_scale
        if not (1 <= R <= n or -n <= R <= -1):
            raise ValueError(
                f"reference_scale R={R} is outside the schedule's {n} scales (allowed: 1..{n}, or -{n}..-1 from the end)"
            )
        ref = R - 1 if R > 0 else n + R
        start = (
            ref + 1
            if self.config.start_scale is None
            else resolve_scale_index(self.config.start_scale, n, "start_scale")
        )
        if start == 0:
            raise ValueError(
                "start_scale resolves to scale 0, which has no previous scale to rank its tokens by; use >= 1"
            )
        end = n - 1 if self.config.end_scale is None else resolve_scale_index(self.config.end_scale, n, "end_scale")
        if end < start:
            raise ValueError(
                f"end_scale {self.config.end_scale} resolves to scale {end}, before the first dynamic scale {start} "
                f"of the {n}-scale schedule"
            )
        tokens = [int(s[-2]) * int(s[-1]) for s in scale_schedule]
        return {i: min(1.0, tokens[ref] / tokens[i]) for i in range(start, end + 1)}

    def depth_plans(self, state) -> Dict[int, ScaleDepth]:
        """The depth plan of every dynamic scale of the call of ``state`` (per call: it lives in the loop's state)."""
        return self.call_state(state).plans

    def _phase(self, scale_index: int, budgets: Dict[int, float]) -> float:
        """The percentile rotation of a dynamic scale."""
        return (self.config.rotation_step * (scale_index - min(budgets))) % 1.0

    # -- calibration ----------------------------------------------------------------------------------------------------
    @classmethod
    def calibration_grid(cls, num_layers: int) -> List[Dict[str, Any]]:
        """Reference scale R = -2 .. -6 (from the end), code blending on or off; and, blending on, a deeper R = -6 ..
        -8 whose dynamic scales start later (the last two or three scales); the default rotation step.

        The later starts fill the budgets that R alone skips: with the dynamic scales right after R (the paper's
        reading), each step of R changes the depth of every scale after it, and on a schedule with many small late
        steps (the embedded model's 13 scales) R = -5 gives 1.48x counted FLOPs and R = -6 2.00x, nothing between.
        The rotation step is a decided default (0.25, chosen once on the calibration prompts), not a tuned knob, so
        the grid does not search it. Settings that do not fit a short schedule are recorded as not runnable.
        """
        after_reference = [
            dict(reference_scale=reference, rotation_step=ROTATION_STEP, code_blending=blending)
            for reference in (-2, -3, -4, -5, -6)
            for blending in (True, False)
        ]
        later_start = [
            dict(reference_scale=reference, start_scale=start, rotation_step=ROTATION_STEP, code_blending=True)
            for reference, start in ((-6, -2), (-7, -2), (-8, -2), (-7, -3), (-8, -3))
        ]
        return after_reference + later_start

    @classmethod
    def composition_calibration_grid(cls, num_layers: int) -> List[Dict[str, Any]]:
        """Reference scale R = -2, -3 or -4, the default rotation step, code blending on."""
        return [dict(reference_scale=r, rotation_step=ROTATION_STEP, code_blending=True) for r in (-2, -3, -4)]

    # -- extension points ---------------------------------------------------------------------------------------------
    def acted_scales(self, scale_schedule):
        budgets = self.budgets(scale_schedule)
        return frozenset(budgets) | {min(budgets) - 1}

    def plan_scales(self, scale_schedule, model=None):
        self.budgets(scale_schedule)  # raise early on a setting that does not fit the schedule
        return super().plan_scales(scale_schedule, model)

    def before_scale(self, state, plan):
        """Eqs. (1)-(3) for the dynamic scales of the pass, ranked by the last scale before it (in a grouped pass every
        scale is ranked by the scale before the group, as the group's inputs all come from it)."""
        budgets, call = self.budgets(state.scale_schedule), self.call_state(state)
        if state.pass_index == 0:
            # the rank-space plans of every dynamic scale (host work, cached per setting) before the first pass, so
            # that none is computed between passes
            for k in budgets:
                hw = tuple(int(v) for v in state.scale_schedule[k][-2:])
                rank_depth_plan(
                    hw[0] * hw[1],
                    state.model.num_layers,
                    budgets[k],
                    self._phase(k, budgets),
                    self.config.min_depth,
                    self.config.cyclic_layer_offsets,
                )
        dynamic = [k for k in plan.scale_indices if k in budgets]
        if not dynamic or plan.skip:
            return
        source = call.source
        previous = state.previous_plan()
        if source is None or previous is None or source.scale != previous.scale_indices[-1]:
            raise RuntimeError(
                f"DepthVAR needs the layer deltas of scale {plan.scale_indices[0] - 1} for scale {dynamic[0]}, but "
                "that scale did not run through DepthVAR (skipped, grouped with others, or routed by another "
                "scheduler?)"
            )
        B = state.batch_size
        ranking_BHW = source.change.view(-1, B, *source.hw).mean(0)  # Eq. (1), mean over an image's CFG rows
        for k in dynamic:
            hw = tuple(int(v) for v in state.scale_schedule[k][-2:])
            phase = self._phase(k, budgets)
            call.plans[k] = plan_depth(
                resize_map(ranking_BHW, hw, "bilinear"),
                hw,
                state.model.num_layers,
                budgets[k],
                phase,
                self.config.min_depth,
                self.config.cyclic_layer_offsets,
                tables=state.tables,
            )

    def route_pass(self, state, plan):
        """Eq. (4): layer ``l`` computes the tokens whose depth reaches it, the others take the source's upsampled
        layer delta; Eq. (5): codes weighted by the score. A pass whose next pass is dynamic records its deltas."""
        return self._depth_routes(state, plan, None)

    def route_pass_within(self, state, plan, selection):
        """:meth:`route_pass` within an earlier member's kept tokens (a composition): the depths are planned among the
        tokens ``selection`` keeps, and every layer's route nests inside its route."""
        return self._depth_routes(state, plan, selection)

    def _depth_routes(self, state, plan, selection: Optional[TokenSelection]) -> Optional[PassRoutes]:
        budgets, call = self.budgets(state.scale_schedule), self.call_state(state)
        nxt = state.next_plan()
        record = nxt is not None and not nxt.skip and any(k in budgets for k in nxt.scale_indices)
        if record and len(plan.scale_indices) > 1:
            raise ValueError(
                f"DepthVAR ranks scale {nxt.scale_indices[0]} by the scale before it, but that scale is decoded in "
                f"the group {list(plan.scale_indices)}; end the dynamic scales before the group (end_scale)"
            )
        num_layers = state.model.num_layers
        routes = PassRoutes(
            record=RecordRequest(block_deltas=frozenset(range(num_layers))) if record else RecordRequest()
        )
        if not any(k in call.plans for k in plan.scale_indices):
            return routes if routes else None
        outer = selection.route if selection is not None else None
        kept = selection.tokens if selection is not None else {}
        if outer is not None and any(k not in kept for k in plan.scale_indices):
            raise ValueError(
                f"DepthVAR nests within another member's kept tokens only when it names them per scale "
                f"(residual_tokens); scales {list(plan.scale_indices)}"
            )
        schedule, source = state.scale_schedule, call.source
        hws = tuple((int(schedule[k][-2]), int(schedule[k][-1])) for k in plan.scale_indices)
        per_layer: Dict[int, List[torch.Tensor]] = {l: [] for l in range(num_layers)}
        # the rows the pass runs (a per-image plan is laid out for them once, not by the executor per layer)
        rows = state.layout.for_plan(plan).run_rows if state.layout is not None else state.rows
        offset = 0
        for k, hw in zip(plan.scale_indices, hws):
            depth = call.plans.get(k)
            count = kept[k].shape[1] if outer is not None else hw[0] * hw[1]
            if depth is not None and outer is not None:  # rank the kept tokens only (sizes stay configured)
                ranking = values_at(
                    resize_map(call.source.change.view(-1, state.batch_size, *source.hw).mean(0), hw, "bilinear"),
                    kept[k],
                )
                phase = self._phase(k, budgets)
                depth = plan_depth(
                    ranking,
                    (count,),
                    num_layers,
                    budgets[k],
                    phase,
                    self.config.min_depth,
                    self.config.cyclic_layer_offsets,
                    tables=state.tables,
                )
                full = torch.ones(state.batch_size, hw[0] * hw[1], device=depth.scores.device)
                call.plans[k] = ScaleDepth(
                    place_values(full, kept[k], depth.scores).view(state.batch_size, *hw),
                    depth.depth,
                    depth.layer_index,
                )
            single = depth is not None and outer is None and len(hws) == 1
            by_layer = depth.index_rows(rows, state.tables) if single else None
            for l in range(num_layers):
                if depth is None:  # a scale of the pass at full depth
                    index = torch.arange(offset, offset + count, device=source.change.device).expand(
                        state.batch_size, -1
                    )
                else:
                    index = depth.layer_index[l] if by_layer is None else by_layer[l]
                    index = index + offset if offset else index
                per_layer[l].append(index)
            if depth is not None and self.config.code_blending:
                routes.code_weights[k] = call.plans[k].scores  # Eq. (5)
            offset += count
        for l in range(num_layers):
            index = per_layer[l][0] if len(per_layer[l]) == 1 else torch.cat(per_layer[l], dim=1)
            # tokens per scale from shapes (the rank plans fix them): a grouped pass attends scale by scale without
            # reading the index on the host
            counts = tuple(int(part.shape[1]) for part in per_layer[l]) if len(per_layer[l]) > 1 else None
            route = TokenRoute(index=index, fill=LayerProxy(source.deltas[l], source.hw, hws), scale_counts=counts)
            routes.routes[(l, "block")] = route.within(outer) if outer is not None else route
        return routes

    def after_scale(self, state, plan, hidden_states_RLC):
        deltas = state.records.block_deltas
        if not deltas:
            return
        stack = state.records.block_delta_stack  # the deltas in one buffer (the executor's), when they fit one
        change = summed_change(
            stack if stack is not None and stack.shape[0] == len(deltas) else [deltas[l] for l in sorted(deltas)]
        )
        k = plan.scale_indices[0]
        self.call_state(state).source = DepthSource(
            k, tuple(int(v) for v in state.scale_schedule[k][-2:]), dict(deltas), change
        )


#: Layers of recorded deltas taken at once by :func:`summed_change` (a fixed count, so that the number of kernels
#: does not depend on the width; its fp32 copy of ``|delta|`` is at most this many layers).
CHANGE_LAYERS_PER_CHUNK = 8


def summed_change(deltas_nRLC: Union[torch.Tensor, Sequence[torch.Tensor]]) -> torch.Tensor:
    """Eq. (1): ``sum_l mean_c |delta_l|`` ``(R, L)`` in fp32, of the layer deltas in layer order: stacked
    ``(n, R, L, C)`` (two kernels per :data:`CHANGE_LAYERS_PER_CHUNK` layers and one sum) or a list of ``(R, L, C)``
    (a mean per layer). Both give the same bits: each layer's mean, then one sum over the layers (torch's reduction
    order, not a chain of additions)."""
    if isinstance(deltas_nRLC, torch.Tensor):
        n = deltas_nRLC.shape[0]
        means = torch.empty(deltas_nRLC.shape[:-1], dtype=torch.float32, device=deltas_nRLC.device)
        for start in range(0, n, CHANGE_LAYERS_PER_CHUNK):
            end = min(start + CHANGE_LAYERS_PER_CHUNK, n)
            torch.mean(deltas_nRLC[start:end].float().abs(), dim=-1, out=means[start:end])
    else:
        n = len(deltas_nRLC)
        means = torch.stack([delta.float().abs().mean(dim=-1) for delta in deltas_nRLC])
    return means[0] if n == 1 else means.sum(0)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_unit_interval(value, name: str) -> None:
    """A ``ValueError`` naming ``value`` unless it (every element of a tensor) lies in [0, 1]."""
    if isinstance(value, torch.Tensor):
        if value.numel() and not bool(((value >= 0) & (value <= 1)).all()):
            raise ValueError(f"{name} must be in [0, 1], got values from {value.min().item()} to {value.max().item()}")
    elif not (isinstance(value, (int, float)) and 0.0 <= float(value) <= 1.0):
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
