"""FastVAR: pivotal token selection and cached token restoration (arXiv:2503.23367, code: csguoh/FastVAR).

The late scales of a next-scale model hold most tokens but change the image little. FastVAR computes only the
*pivotal* tokens of those scales and restores the others from a cached earlier scale:

* **PTS (pivotal token selection).** Before every sublayer (self-attention, cross-attention, FFN) of a pruned layer,
  score each token of the residual stream ``x`` (before the sublayer's norm) by its squared distance to the mean
  token of its row, ``s_i = sum_c (x_ic - mean_j x_jc)^2``, and keep the ``K = L - int(L * r)`` highest-scoring
  tokens per row (conditional and unconditional CFG rows choose independently).
* **CTR (cached token restoration).** At the cache scale every layer runs dense and its sublayer updates (after the
  gain) are kept. At a pruned scale a sublayer runs on the ``K`` kept tokens only; its update of the others is the
  cached update, area-interpolated to ``h x w``; the fresh updates overwrite the kept positions. Only the kept
  tokens' keys/values enter the KV cache. The cache is not refreshed at pruned scales.
* **Scale skipping.** The official Infinity setting drops the last two scales entirely: no pass, no codes, the image
  is decoded from the earlier ones (``skip_last_scales=False`` keeps them, to tell the two gains apart).

Unlike the official code (keyed on scale *width*, 1:1 at 1M pixels, batch 1, caches left on the modules), scales are
chosen by index (negative = from the end) so one preset fits every aspect ratio and pixel budget, any batch works
(rows are independent), and the cache lives in the call's state (:class:`FastVARCallState`).

Kept indices are returned in position order (the official code keeps descending-score order; only the set matters,
and with ``r = 0`` the routed pass is then bit-identical to the dense one). To observe the decisions, wrap
:meth:`FastVARScheduler.route_pass` (each route's selector returns the kept indices of one layer / sublayer).

Shape legend: ``R`` rows (``2B`` under CFG), ``L`` tokens of the scale, ``K`` kept tokens, ``C`` width,
``l`` tokens of the cache scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

import torch
from diffusers.configuration_utils import register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin  # noqa: F401 (diffusers' from_pretrained looks the
#   loadable base class up in the module named in model_index.json)

from ..next_scale.plan import EarlierScale, PassRoutes, RecordRequest, TokenRoute
from .presets import PackagedPresets
from .scheduling_var_base import ScalePlan, VARAccelScheduler, check_ratio, resolve_scale_index

#: The sublayers PTS prunes (the router is also asked about ``"block"``, which FastVAR never routes).
PRUNED_SUBLAYERS = ("self_attn", "cross_attn", "ffn")


# ---------------------------------------------------------------------------------------------------------------------
# PTS and CTR
# ---------------------------------------------------------------------------------------------------------------------
def num_kept_tokens(num_tokens: int, ratio: float) -> int:
    """``K = L - int(L * r)``: the tokens a scale of ``L`` tokens keeps at prune ratio ``r`` (official rounding)."""
    return num_tokens - int(num_tokens * float(ratio))


def pivotal_token_scores(x_RLC: torch.Tensor) -> torch.Tensor:
    """PTS scores ``s_i = sum_c (x_ic - mean_j x_jc)^2`` per row, in fp32, shape (R, L)."""
    x = x_RLC.float()
    return (x - x.mean(dim=1, keepdim=True)).square().sum(dim=-1)


def pivotal_tokens(x_RLC: torch.Tensor, ratio: float) -> torch.Tensor:
    """Indices (R, K) of the ``K = L - int(L * r)`` highest-scoring tokens of every row, in position order."""
    keep = num_kept_tokens(x_RLC.shape[1], ratio)
    return pivotal_token_scores(x_RLC).topk(keep, dim=-1, sorted=False).indices.sort(dim=-1).values


class PivotalTokens:
    """PTS as a selector: the executor calls it on the residual stream before every pruned sublayer."""

    def __init__(self, ratio: float):
        self.ratio = ratio

    def __call__(self, x_RLC: torch.Tensor) -> torch.Tensor:
        return pivotal_tokens(x_RLC, self.ratio)


@dataclass
class FastVARCallState:
    """What FastVAR keeps during one call: the cache scale's sublayer updates ``{(layer, sublayer): (R, l, C)}``."""

    cache: Dict[Tuple[int, str], torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class FastVARScales:
    """A FastVAR configuration resolved against one scale schedule (non-negative scale indices).

    Args:
        prune_ratios: ratio ``r`` per pruned scale index.
        cache_scale: the scale whose updates are cached (``None`` when nothing is pruned).
        skipped: the scales that run no pass.
    """

    prune_ratios: Dict[int, float]
    cache_scale: Optional[int]
    skipped: FrozenSet[int]


# ---------------------------------------------------------------------------------------------------------------------
# scheduler
# ---------------------------------------------------------------------------------------------------------------------
class FastVARScheduler(VARAccelScheduler, method="fastvar"):
    r"""FastVAR (arXiv:2503.23367): prune late scales by PTS, restore the rest by CTR, optionally skip the last scales.

    Scale indices may be negative (``-1`` is the last scale of the schedule), so one setting fits every aspect ratio
    and pixel budget. Presets (``FastVARScheduler.from_preset(family)``): ``"infinity"`` prunes the 4th/3rd scales
    from the end (sides 32 / 40 of the 1M schedule) at r = 0.4 / 0.5 in layers 3..27, caches the 5th from the end
    (24x24) and skips the last two; ``"hart"`` prunes the last two (48 / 64) at r = 0.5 / 0.75 in all layers, caches
    36x36 (``-3``) and skips nothing.

    Args:
        prune_scales (`tuple[int]`, defaults to `(-4, -3)`): the scales PTS prunes (index; negative from the end).
        prune_ratios (`tuple[float]`, defaults to `(0.4, 0.5)`): ratio ``r`` in [0, 1] of each pruned scale; it keeps
            ``L - int(L * r)`` tokens (r = 1 restores every token from the cache; to drop a scale, skip it).
        pruned_layers (`tuple[int, int]`, *optional*, defaults to `(3, 28)`): the layers ``[start, end)`` that prune;
            other layers run dense. `None` prunes every layer; ``end`` may exceed the model's depth.
        cache_scale (`int`, defaults to `-5`): the scale whose sublayer updates CTR restores from; before every pruned
            scale.
        skip_last_scales (`bool`, defaults to `True`): skip ``skipped_scales`` (no pass, no codes); `False` gives the
            prune-only variant.
        skipped_scales (`tuple[int]`, defaults to `(-2, -1)`): the scales skipped when ``skip_last_scales``.
        model_family (`str`, *optional*): the model family the setting is for (a scheduler for another family is
            refused); `None`, the default, fits every family (`from_preset(family)` sets it).

    Examples:
        ```py
        >>> from diffusers_var_accel import FastVARScheduler
        >>> from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

        >>> pipe = build_tiny_infinity_pipeline(depth=8)
        >>> fastvar = FastVARScheduler.from_preset("infinity", skip_last_scales=False, pruned_layers=None)
        >>> image = pipe("a red fox in the snow", height=512, width=512, acceleration=fastvar).images[0]
        ```
    """

    #: ``{family: kwargs}`` read from the packaged JSON presets ``infinity-2b/fastvar`` and ``hart-0.7b/fastvar``.
    presets = PackagedPresets("fastvar")
    call_state_class = FastVARCallState

    @register_to_config
    def __init__(
        self,
        prune_scales: Sequence[int] = (-4, -3),
        prune_ratios: Sequence[float] = (0.4, 0.5),
        pruned_layers: Optional[Sequence[int]] = (3, 28),
        cache_scale: int = -5,
        skip_last_scales: bool = True,
        skipped_scales: Sequence[int] = (-2, -1),
        model_family: Optional[str] = None,
    ):
        super().__init__()
        self._check_family_name(model_family)
        prune_scales, skipped_scales = (
            _scale_list(prune_scales, "prune_scales"),
            _scale_list(skipped_scales, "skipped_scales"),
        )
        prune_ratios = [check_ratio(r, "every prune ratio") for r in prune_ratios]
        if len(prune_ratios) != len(prune_scales):
            raise ValueError(
                f"prune_ratios has {len(prune_ratios)} values for {len(prune_scales)} prune_scales; give one ratio per pruned scale"
            )
        if not _is_index(cache_scale):
            raise ValueError(f"cache_scale must be an integer scale index, got {cache_scale!r}")
        same_side = [s for s in prune_scales if (s < 0) == (cache_scale < 0)]
        if same_side and cache_scale >= min(same_side):
            raise ValueError(f"cache_scale {cache_scale} must come before every pruned scale {prune_scales}")
        if pruned_layers is not None:
            pruned_layers = list(pruned_layers)
            if (
                len(pruned_layers) != 2
                or not all(_is_index(v) for v in pruned_layers)
                or not 0 <= pruned_layers[0] < pruned_layers[1]
            ):
                raise ValueError(
                    f"pruned_layers must be a layer range [start, end) with 0 <= start < end, or None for all layers; got {pruned_layers!r}"
                )
        if not isinstance(skip_last_scales, bool):
            raise ValueError(f"skip_last_scales must be a bool, got {skip_last_scales!r}")
        if skip_last_scales and set(skipped_scales) & set(prune_scales):
            raise ValueError(f"scales {sorted(set(skipped_scales) & set(prune_scales))} are both pruned and skipped")
        # the stored configuration holds the validated values (ratios as floats, index lists as lists)
        self.register_to_config(
            prune_scales=prune_scales,
            prune_ratios=prune_ratios,
            pruned_layers=pruned_layers,
            skipped_scales=skipped_scales,
        )

    # -- the setting on one schedule ------------------------------------------------------------------------------------
    def resolve(self, scale_schedule: Sequence[Tuple[int, ...]]) -> FastVARScales:
        """The pruned, cache and skipped scales of ``scale_schedule`` as non-negative indices.

        Raises:
            ValueError: an index outside the schedule, two settings for one scale, a cache scale not before every
                pruned scale, a skipped cache scale, or a scale both pruned and skipped.
        """
        n, cfg = len(scale_schedule), self.config
        prune = {resolve_scale_index(s, n, "prune scale"): r for s, r in zip(cfg.prune_scales, cfg.prune_ratios)}
        if len(prune) != len(cfg.prune_scales):
            raise ValueError(f"prune_scales {list(cfg.prune_scales)} name one scale twice in a schedule of {n} scales")
        skipped = (
            frozenset(resolve_scale_index(s, n, "skipped scale") for s in cfg.skipped_scales)
            if cfg.skip_last_scales
            else frozenset()
        )
        if skipped & set(prune):
            raise ValueError(
                f"scales {sorted(skipped & set(prune))} of the {n}-scale schedule are both pruned and skipped"
            )
        cache = None
        if prune:
            cache = resolve_scale_index(cfg.cache_scale, n, "cache_scale")
            if cache >= min(prune):
                raise ValueError(
                    f"cache scale {cache} is not before the pruned scales {sorted(prune)} of the {n}-scale schedule"
                )
            if cache in skipped:
                raise ValueError(f"cache scale {cache} is skipped: it must run to fill the cache")
        return FastVARScales(prune, cache, skipped)

    def _layers(self, num_layers: int) -> range:
        if self.config.pruned_layers is None:
            return range(num_layers)
        start, end = self.config.pruned_layers
        if start >= num_layers:
            raise ValueError(
                f"pruned_layers {list(self.config.pruned_layers)} selects no layer of a {num_layers}-layer model"
            )
        return range(start, min(end, num_layers))

    # -- calibration ----------------------------------------------------------------------------------------------------
    @classmethod
    def calibration_grid(cls, num_layers: int) -> List[Dict[str, Any]]:
        """Prune the last 2 or 3 computed scales at r = 0.25 .. 0.9, in all layers or from layer 1 on; skip the last
        scale or not; the cache scale is the one before the first pruned scale."""
        grid = []
        for skip in (False, True):
            for count in (2, 3):
                last = -2 if skip else -1
                prune = list(range(last - count + 1, last + 1))
                for layers in (None, [1, num_layers]):
                    for ratio in (0.25, 0.5, 0.75, 0.9):
                        grid.append(
                            dict(
                                prune_scales=prune,
                                prune_ratios=[ratio] * count,
                                pruned_layers=layers,
                                cache_scale=prune[0] - 1,
                                skip_last_scales=skip,
                                skipped_scales=[-1] if skip else [],
                            )
                        )
        return grid

    @classmethod
    def composition_calibration_grid(cls, num_layers: int) -> List[Dict[str, Any]]:
        """The last two scales pruned from layer 1 on (nothing skipped), or the two before the last with the last one
        skipped."""
        return [
            dict(
                prune_scales=[-2, -1],
                prune_ratios=[r, r],
                pruned_layers=[1, num_layers],
                cache_scale=-3,
                skip_last_scales=False,
                skipped_scales=[],
            )
            for r in (0.25, 0.5, 0.75)
        ] + [
            dict(
                prune_scales=[-3, -2],
                prune_ratios=[0.5, 0.5],
                pruned_layers=[1, num_layers],
                cache_scale=-4,
                skip_last_scales=True,
                skipped_scales=[-1],
            )
        ]

    # -- extension points ---------------------------------------------------------------------------------------------
    def acted_scales(self, scale_schedule):
        scales = self.resolve(scale_schedule)
        return frozenset(scales.prune_ratios) | (
            frozenset() if scales.cache_scale is None else frozenset({scales.cache_scale})
        )

    def plan_scales(self, scale_schedule, model=None):
        skipped = self.resolve(scale_schedule).skipped
        return [ScalePlan((i,), skip=i in skipped) for i in range(len(scale_schedule))]

    def route_pass(self, state, plan):
        """The cache scale records every pruned sublayer's update (CTR); a pruned scale routes every pruned sublayer
        to its pivotal tokens (PTS, chosen before each sublayer) and fills the others from the cached update."""
        scales = self.resolve(state.scale_schedule)
        routed = [k for k in plan.scale_indices if k in scales.prune_ratios or k == scales.cache_scale]
        if not routed:
            return None
        if len(plan.scale_indices) > 1:
            raise ValueError(
                f"FastVAR routes single-scale passes; scale {routed[0]} is decoded in the group {plan.scale_indices}"
            )
        k, schedule = routed[0], state.scale_schedule
        layers = self._layers(state.model.num_layers)
        if k == scales.cache_scale:
            return PassRoutes(
                record=RecordRequest(sublayer_updates=frozenset((l, s) for l in layers for s in PRUNED_SUBLAYERS))
            )
        cache = self.call_state(state).cache
        missing = [l for l in layers if not any((l, s) in cache for s in PRUNED_SUBLAYERS)]
        if missing:
            raise RuntimeError(
                f"FastVAR has no cached updates of layers {missing} for scale {k}: the cache scale {scales.cache_scale} did not "
                "run dense in this call (skipped or routed by another scheduler?)"
            )
        cached_hw, select = tuple(schedule[scales.cache_scale][-2:]), PivotalTokens(scales.prune_ratios[k])
        routes = {
            key: TokenRoute(selector=select, fill=EarlierScale(update, cached_hw, mode="area"))
            for key, update in cache.items()
            if key[0] in layers
        }
        return PassRoutes(routes=routes)

    def after_scale(self, state, plan, hidden_states_RLC):
        if plan.scale_indices[0] == self.resolve(state.scale_schedule).cache_scale:
            self.call_state(state).cache = dict(state.records.sublayer_updates)


def _is_index(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _scale_list(values, name: str):
    values = list(values)
    if not all(_is_index(v) for v in values):
        raise ValueError(f"{name} must be integer scale indices (negative = from the end), got {values!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"{name} names a scale twice: {values!r}")
    return values
