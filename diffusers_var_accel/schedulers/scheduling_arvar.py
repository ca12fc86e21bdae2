"""ARVAR (ECCV 2026): branch halving, attention-retrospect pruning and structural reconstruction.

Two independent schedules (no public code: ambiguities are resolved as marked *choice*, see ``docs/arvar.md``;
equation numbers are ours):

* **Branch halving (BH)** at ``branch_halving_scales``: only the conditional CFG rows run the blocks and the head,
  their keys/values stand in for the unconditional rows in the KV cache, and the scale is sampled with guidance 1.
  *Choice*: BH on a run without CFG raises a ``ValueError`` naming the scales and the fix (nothing silently ignored).
* **Attention retrospect (AR)**: a pruned scale ``T`` reads the same layer's self-attention at the small scale ``T - M``
  (only that pass computes it explicitly, ``ScalePlan.record_attention_layers``; all others keep SDPA / flash). A key's
  saliency is the attention it receives, averaged over heads and the scale's queries, on the self-attention part
  only (the ``h x w`` keys of ``T - M``, not the cache; *choice*: not renormalised per query)::

      s^l(p) = mean_{head, q} A^l_{T-M}[head, q, p]      for p in the h_{T-M} x w_{T-M} keys of scale T-M      (1)
      I^l_T  = TopK(Up(s^l, (h_T, w_T)), K),             K = L - int(L * r)                                    (2)

  (*choice*: ``Up`` is ``upsample_mode``, bilinear by default; FastVAR's ``K``; ties go to the earlier position). The
  whole block (attention, cross-attention, FFN) runs on the kept tokens only (``"block"`` routing); only their
  keys/values enter the KV cache; each CFG row keeps its own positions.
* **Structural reconstruction**: the same layer's block output at ``T - N`` (that pass routes every token of the
  pruned layers, bit-identical to dense) is upsampled (same mode) into a canvas that the kept outputs overwrite::

      Y^l_T = Scatter(Up(Y^l_{T-N}, (h_T, w_T)), I^l_T, Yhat^l_T)                                               (3)

Ratio 0 prunes nothing (dense, nothing recorded: bit-identical to the baseline); ratio 1 keeps no token (the canvas).
``T - M`` and ``T - N`` must lie in the schedule and not be pruned. If the CFG rows of a source and of ``T`` differ
(one is halved), the conditional rows stand in for the unconditional ones.

Shape legend: ``R`` rows (``2B`` under CFG, conditional first), ``H`` heads, ``L = h_T w_T`` tokens of a pruned scale,
``l = h w`` of a source scale, ``S`` keys, ``K`` kept tokens, ``C`` width.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

import torch
from diffusers.configuration_utils import register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin  # noqa: F401 (diffusers' from_pretrained looks the
#   loadable base class up in the module named in model_index.json)

from ..next_scale.maps import resize_token_map
from ..next_scale.plan import EarlierScale, PassRoutes, RecordRequest, TokenRoute
from .presets import PackagedPresets
from .scheduling_var_base import ScalePlan, VARAccelScheduler, check_ratio, resolve_scale_index

UPSAMPLE_MODES = ("bilinear", "bicubic", "area", "nearest")
#: Without a :class:`ModelInfo` (a caller that plans without the model), ``pruned_layers=None`` records the attention
#: of the layers below this bound (a deeper model stops with a "no attention map" error at the pruned scale). The loop
#: gives the model, and the plans then record exactly the pruned layers it has.
_LAYERS_WITHOUT_MODEL = 1024


# ---------------------------------------------------------------------------------------------------------------------
# Eqs. (1)-(3)
# ---------------------------------------------------------------------------------------------------------------------
def num_kept_tokens(num_tokens: int, ratio: float) -> int:
    """``K = L - int(L * r)``: the tokens a scale of ``L`` tokens keeps when a fraction ``r`` is pruned."""
    return num_tokens - int(num_tokens * float(ratio))


def self_attention_saliency(probs_RHqS: torch.Tensor, source_hw) -> torch.Tensor:
    """Eq. (1): the attention each key of the scale itself (the last ``h*w`` keys) receives, mean over heads and
    queries, in fp32: ``(R, h, w)``. Takes the full map ``(R, H, q, S)`` or the loop's ``"key_mean"`` map ``(R, S)``
    (already averaged over heads and queries: the mean commutes with taking the last ``h*w`` keys)."""
    h, w = source_hw
    if probs_RHqS.dim() == 2:
        return probs_RHqS[:, -h * w :].float().reshape(-1, h, w)
    return probs_RHqS[..., -h * w :].mean(dim=(1, 2), dtype=torch.float32).view(-1, h, w)


def retrospect_tokens(saliency_Rhw: torch.Tensor, hw, ratio: float, mode: str = "bilinear") -> torch.Tensor:
    """Eq. (2): per row, the ``K`` most salient positions of the saliency interpolated to ``hw``, in position order
    ``(R, K)`` (a stable sort: ties go to the earlier position)."""
    score_RL = resize_token_map(saliency_Rhw.flatten(1), tuple(saliency_Rhw.shape[-2:]), hw, mode)
    keep = num_kept_tokens(score_RL.shape[1], ratio)
    return torch.sort(score_RL, dim=1, descending=True, stable=True).indices[:, :keep].sort(dim=1).values


#: Branch halving on the last 8 scales, the widest setting of the calibration grids.
_LAST_8 = list(range(-8, 0))


@dataclass
class ARVARCallState:
    """What ARVAR keeps during one call.

    Args:
        saliency: ``{source scale: {layer: (R, h, w)}}`` Eq. (1) of the recorded attention.
        outputs: ``{source scale: {layer: (R, l, C)}}`` block outputs for Eq. (3).
        kept: ``{(T, layer): (R, K)}`` the positions each pruned layer computed.
    """

    saliency: Dict[int, Dict[int, torch.Tensor]] = field(default_factory=dict)
    outputs: Dict[int, Dict[int, torch.Tensor]] = field(default_factory=dict)
    kept: Dict[Tuple[int, int], torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class ARVARScales:
    """On one schedule: BH scales, ``r`` per pruned scale, ``T -> T - M`` / ``T - N`` for ``r > 0`` (indices >= 0)."""

    halved: FrozenSet[int]
    prune_ratios: Dict[int, float]
    attention_sources: Dict[int, int]
    activation_sources: Dict[int, int]


# ---------------------------------------------------------------------------------------------------------------------
# scheduler
# ---------------------------------------------------------------------------------------------------------------------
class ARVARScheduler(VARAccelScheduler, method="arvar"):
    r"""ARVAR (ECCV 2026): branch halving at late scales, attention-retrospect pruning with structural reconstruction.

    Scale indices may be negative (``-1`` is the last scale), so one setting fits every aspect ratio and pixel budget.
    Presets: ``"hart"`` is the paper's HART default (BH at step 13, AR at step 14 with 75 % pruned, ``M = 3``, ``N = 2``,
    of 14 steps): BH at ``-2``, AR at ``-1``. ``"infinity"``: the same on Infinity's 13 scales (1M pixels: BH at 48x48,
    AR at 64x64 with saliency from 32x32 and canvas from 40x40), every layer pruned.

    Args:
        branch_halving_scales (`tuple[int]`, defaults to `(-2,)`): scales where only the conditional rows run (BH).
        pruned_scales (`tuple[int]`, defaults to `(-1,)`): the AR scales ``T``.
        prune_ratios (`tuple[float]`, defaults to `(0.75,)`): the fraction ``r`` in [0, 1] pruned at each ``T`` (one
            value per pruned scale, or one for all); ``L - int(L * r)`` tokens are kept.
        attention_distance (`int`, defaults to 3): ``M``; the saliency of ``T`` comes from scale ``T - M``.
        activation_distance (`int`, defaults to 2): ``N``; the canvas of ``T`` comes from scale ``T - N``.
        pruned_layers (`tuple[int, int]`, *optional*): the layers ``[start, end)`` AR prunes (``end`` may exceed the
            depth); `None` (default) prunes every layer.
        upsample_mode (`str`, defaults to `"bilinear"`): the ``F.interpolate`` mode of the saliency (Eq. 2) and the
            canvas (Eq. 3): ``"bilinear"``, ``"bicubic"``, ``"area"`` or ``"nearest"``.
        model_family (`str`, *optional*): the model family the setting is for (a scheduler for another family is
            refused); `None`, the default, fits every family (`from_preset(family)` sets it).

    Examples:
        ```py
        >>> from diffusers_var_accel import ARVARScheduler
        >>> from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

        >>> pipe = build_tiny_infinity_pipeline(seed=0)
        >>> arvar = ARVARScheduler.from_preset("infinity", prune_ratios=(0.5,))
        >>> image = pipe("a red fox in the snow", height=256, width=256, acceleration=arvar).images[0]
        ```
    """

    #: ``{family: kwargs}`` read from the packaged JSON presets ``infinity-2b/arvar`` and ``hart-0.7b/arvar``.
    presets = PackagedPresets("arvar")
    call_state_class = ARVARCallState

    @register_to_config
    def __init__(
        self,
        branch_halving_scales: Sequence[int] = (-2,),
        pruned_scales: Sequence[int] = (-1,),
        prune_ratios: Sequence[float] = (0.75,),
        attention_distance: int = 3,
        activation_distance: int = 2,
        pruned_layers: Optional[Sequence[int]] = None,
        upsample_mode: str = "bilinear",
        model_family: Optional[str] = None,
    ):
        super().__init__()
        self._check_family_name(model_family)
        halved, pruned = (
            _scale_list(branch_halving_scales, "branch_halving_scales"),
            _scale_list(pruned_scales, "pruned_scales"),
        )
        ratios = [check_ratio(r, f"prune_ratios[{i}]") for i, r in enumerate(prune_ratios)]
        if len(ratios) not in (1, len(pruned)):
            raise ValueError(
                f"prune_ratios has {len(ratios)} values for {len(pruned)} pruned_scales; give one per scale or one"
            )
        for name, value in (("attention_distance", attention_distance), ("activation_distance", activation_distance)):
            if not _is_index(value) or value < 1 or any(0 <= t < value for t in pruned):
                raise ValueError(
                    f"{name} must be an integer >= 1 that reaches no further back than scale 0 from the pruned "
                    f"scales {pruned}, got {value!r}"
                )
        if pruned_layers is not None:
            pruned_layers = list(pruned_layers)
            if (
                len(pruned_layers) != 2
                or not all(_is_index(v) for v in pruned_layers)
                or not 0 <= pruned_layers[0] < pruned_layers[1]
            ):
                raise ValueError(
                    f"pruned_layers must be a range [start, end) with 0 <= start < end, or None; got {pruned_layers!r}"
                )
        if upsample_mode not in UPSAMPLE_MODES:
            raise ValueError(f"upsample_mode must be one of {list(UPSAMPLE_MODES)}, got {upsample_mode!r}")
        # the stored configuration holds the validated values (ratios as floats, index lists as lists)
        self.register_to_config(
            branch_halving_scales=halved, pruned_scales=pruned, prune_ratios=ratios, pruned_layers=pruned_layers
        )

    # -- the setting on one schedule ------------------------------------------------------------------------------------
    def resolve(self, scale_schedule: Sequence[Tuple[int, ...]]) -> ARVARScales:
        """The BH, pruned and source scales of ``scale_schedule`` as non-negative indices.

        Raises:
            ValueError: an index outside the schedule, a scale named twice, a source before scale 0 or itself pruned.
        """
        n, cfg = len(scale_schedule), self.config
        halved = [resolve_scale_index(s, n, "branch halving scale") for s in cfg.branch_halving_scales]
        ratios = list(cfg.prune_ratios) * (len(cfg.pruned_scales) if len(cfg.prune_ratios) == 1 else 1)
        prune = {resolve_scale_index(s, n, "pruned scale"): float(r) for s, r in zip(cfg.pruned_scales, ratios)}
        if len(set(halved)) != len(halved) or len(prune) != len(cfg.pruned_scales):
            raise ValueError(
                f"branch_halving_scales {list(cfg.branch_halving_scales)} or pruned_scales {list(cfg.pruned_scales)} "
                f"name one scale twice on {n} scales"
            )
        sources = {}
        for name, distance in (("attention", cfg.attention_distance), ("activation", cfg.activation_distance)):
            for t in prune:
                if t - distance < 0:
                    raise ValueError(
                        f"{name}_distance {distance} reaches before scale 0 from pruned scale {t} of the {n}-scale "
                        f"schedule; use a distance <= {t} or a later pruned scale"
                    )
                if t - distance in prune:
                    raise ValueError(
                        f"the {name} source {t - distance} of pruned scale {t} is pruned too; sources run in full"
                    )
            sources[name] = {t: t - distance for t, r in prune.items() if r > 0}
        return ARVARScales(frozenset(halved), prune, sources["attention"], sources["activation"])

    def _layers(self, num_layers: int) -> range:
        start, end = self.config.pruned_layers or (0, num_layers)
        if start >= num_layers:
            raise ValueError(
                f"pruned_layers {list(self.config.pruned_layers)} selects no layer of a {num_layers}-layer model"
            )
        return range(start, min(end, num_layers))

    def kept_tokens(self, state) -> Dict[Tuple[int, int], torch.Tensor]:
        """The positions each pruned layer computed in the call of ``state``: ``{(T, layer): (R of T - M, K)}``."""
        return self.call_state(state).kept

    # -- calibration ----------------------------------------------------------------------------------------------------
    @classmethod
    def calibration_grid(cls, num_layers: int) -> List[Dict[str, Any]]:
        """Branch halving at none / the 2nd last / the last / the last 2, 3, 4, 5 or 8 scales, and attention
        retrospect pruning of none / the last / the last 2 scales at 25, 50 or 75 %. (The last 8: on a schedule with
        many small late steps, such as the embedded model's 13 scales, halving only the last 5 leaves most of the
        guided cost; a model with fewer than 8 scales records those settings as not runnable.)"""
        grid = []
        for halved in ([], [-2], [-1], [-2, -1], [-3, -2, -1], [-4, -3, -2, -1], [-5, -4, -3, -2, -1], _LAST_8):
            for pruned, ratio in [([], None)] + [(p, r) for p in ([-1], [-2, -1]) for r in (0.25, 0.5, 0.75)]:
                if not halved and not pruned:
                    continue
                grid.append(
                    dict(branch_halving_scales=halved, pruned_scales=pruned, prune_ratios=[ratio if ratio else 0.75])
                )
        return grid

    @classmethod
    def composition_calibration_grid(cls, num_layers: int) -> List[Dict[str, Any]]:
        """Branch halving only (the last 1, 2, 3, 5 or 8 scales): its attention-retrospect pruning routes the same
        blocks as the other methods' token selections, which a composition refuses."""
        return [
            dict(branch_halving_scales=h, pruned_scales=[], prune_ratios=[0.75])
            for h in ([-1], [-2, -1], [-3, -2, -1], [-5, -4, -3, -2, -1], _LAST_8)
        ]

    # -- extension points ---------------------------------------------------------------------------------------------
    def plan_scales(self, scale_schedule, model=None):
        """BH scales halve the CFG rows; each attention source ``T - M`` records the pruned layers' attention (those
        of ``model``; without it, every layer the setting could name)."""
        scales = self.resolve(scale_schedule)
        if model is not None:
            record = frozenset(self._layers(model.num_layers))
        else:
            record = frozenset(range(*(self.config.pruned_layers or (0, _LAYERS_WITHOUT_MODEL))))
        recorded = set(scales.attention_sources.values())
        return [
            ScalePlan(
                (k,), cfg_halve=k in scales.halved, record_attention_layers=record if k in recorded else frozenset()
            )
            for k in range(len(scale_schedule))
        ]

    def before_scale(self, state, plan):
        halved = self.resolve(state.scale_schedule).halved
        if halved and state.rows == state.batch_size:
            raise ValueError(
                f"branch halving at scales {sorted(halved)} needs classifier-free guidance, but this run has none "
                f"(no unconditional rows: Infinity guidance_scale 1, HART guidance_scale 0); enable guidance or set "
                f"branch_halving_scales=()"
            )

    def acted_scales(self, scale_schedule):
        scales = self.resolve(scale_schedule)
        return (
            scales.halved
            | frozenset(k for k, r in scales.prune_ratios.items() if r > 0)
            | frozenset(scales.attention_sources.values())
            | frozenset(scales.activation_sources.values())
        )

    def route_pass(self, state, plan):
        """A canvas source ``T - N`` records its block outputs; a pruned scale ``T`` routes every pruned block to its
        retrospect tokens (Eq. 2) and fills the others with the upsampled canvas (Eq. 3)."""
        scales, scale_set = self.resolve(state.scale_schedule), set(plan.scale_indices)
        ours = scale_set & {
            *scales.attention_sources,
            *scales.attention_sources.values(),
            *scales.activation_sources.values(),
        }
        if len(scale_set) > 1 and ours:
            raise ValueError(
                f"ARVAR's pruned and source scales {sorted(ours)} must run alone, not in the group {plan.scale_indices}"
            )
        k, call, layers = plan.scale_indices[0], self.call_state(state), self._layers(state.model.num_layers)
        if k in scales.activation_sources.values():
            return PassRoutes(record=RecordRequest(block_outputs=frozenset(layers)))
        if k not in scales.attention_sources:
            return None
        m_source, n_source = scales.attention_sources[k], scales.activation_sources[k]
        saliency, outputs = call.saliency.pop(m_source, {}), call.outputs.pop(n_source, {})
        if any(layer not in saliency or layer not in outputs for layer in layers):
            raise RuntimeError(
                f"ARVAR has no attention map or block output of some of layers {list(layers)} for pruned scale {k}: its "
                f"sources {m_source} / {n_source} did not run in full (skipped or routed by another scheduler?)"
            )
        hw, ratio, mode = tuple(state.scale_schedule[k][-2:]), scales.prune_ratios[k], self.config.upsample_mode
        source_hw = tuple(state.scale_schedule[n_source][-2:])
        # Eq. (2) of every pruned layer at once (rows are independent: the same tokens as layer by layer, in a
        # few kernels instead of a few per layer)
        maps = torch.stack([saliency[layer] for layer in layers])  # (n, R, h, w)
        kept_all = retrospect_tokens(maps.flatten(0, 1), hw, ratio, mode).view(len(layers), maps.shape[1], -1)
        routes = {}
        for i, layer in enumerate(layers):
            kept = call.kept[(k, layer)] = kept_all[i]
            canvas = EarlierScale(outputs[layer], source_hw, mode=mode, in_float32=True)
            routes[(layer, "block")] = TokenRoute(index=kept, fill=canvas)
        return PassRoutes(routes=routes)

    def after_scale(self, state, plan, hidden_states_RLC):
        k, scales = plan.scale_indices[0], self.resolve(state.scale_schedule)
        call, layers = self.call_state(state), set(self._layers(state.model.num_layers))
        if k in scales.activation_sources.values():
            call.outputs[k] = {layer: out for layer, out in state.records.block_outputs.items() if layer in layers}
        if k not in scales.attention_sources.values():
            return
        hw, saliency = tuple(state.scale_schedule[k][-2:]), call.saliency.setdefault(k, {})
        for layer in sorted(state.records.attention.keys() & layers):  # missing: see T
            probs = state.records.attention[layer]
            if probs.dim() == 4 and probs.shape[-2] != hw[0] * hw[1]:  # a "full" map tells how many queries ran
                raise RuntimeError(
                    f"the attention source scale {k} computed {probs.shape[-2]} of its {hw[0] * hw[1]} tokens in "
                    f"layer {layer}; it must run in full (routed by another scheduler?)"
                )
            saliency[layer] = self_attention_saliency(probs, hw)


def _is_index(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _scale_list(values, name: str):
    if not all(_is_index(v) for v in values) or len(set(values)) != len(values):
        raise ValueError(
            f"{name} must be distinct integer scale indices (negative = from the end), got {list(values)!r}"
        )
    return list(values)
