"""Composition: several acceleration methods in one schedule (:class:`ComposedScheduler`), and the rules by which
their plans and routes are merged."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple, Union

from diffusers.configuration_utils import register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin  # noqa: F401 (diffusers' from_pretrained looks the
#   loadable base class up in the module named in model_index.json)

from ..next_scale.plan import PassRoutes, TokenSelection, validate_plans
from .scheduling_var_base import VARAccelScheduler, scheduler_from_dict


class ComposedScheduler(VARAccelScheduler):
    """Several methods in one schedule: composition is configuration (a list of scheduler configs).

    Rules, per pass:

    * **Passes.** At most one member may group scales (its plans define the passes). A pass is skipped if any member
      skips one of its scales; that is an error only when another member acts on the skipped scale
      (:meth:`VARAccelScheduler.acted_scales`), and the error names both members and the scale.
    * **Rows and maps.** A pass is CFG-halved if any member halves one of its scales (halving combines with every
      routing); the recorded attention layers are the union of the members'.
    * **Routes.** Members are asked in order, the ones that select tokens first. Once a member routes the pass's
      first block, the members asked after it get its selection handed to them
      (:meth:`VARAccelScheduler.route_pass_within` with a :class:`~diffusers_var_accel.next_scale.plan.TokenSelection`;
      no member reads another's routes). Two members may shape one layer only by nesting: the later one selects within
      the earlier one's kept tokens (:meth:`TokenRoute.within`: DepthVAR's depth within LazyVAR's kept tokens). Any other pair of routes on one
      layer, or a layer that one member records (attention, outputs, deltas, updates) while another routes it, is an
      error naming both members, the layer and the scales. Zero-residual positions of one scale may come from one
      member only; code weights multiply.
    * ``before_scale`` and ``after_scale`` call every member in order.

    Args:
        schedulers (`list[dict | VARAccelScheduler]`): the members, as instances or as ``to_dict()`` configs.
        model_family (`str`, *optional*): the family all members must fit.
    """

    @register_to_config
    def __init__(
        self, schedulers: Sequence[Union[Dict[str, Any], VARAccelScheduler]] = (), model_family: Optional[str] = None
    ):
        super().__init__()
        self._check_family_name(model_family)
        members = [s if isinstance(s, VARAccelScheduler) else scheduler_from_dict(dict(s)) for s in schedulers]
        if not members:
            raise ValueError("ComposedScheduler needs at least one member scheduler")
        for m in members:
            if model_family is not None and m.model_family not in (None, model_family):
                raise ValueError(
                    f"member {type(m).__name__} is for {m.model_family!r}, the composition for {model_family!r}"
                )
        self.members = members
        # the stored configuration holds plain dicts, so JSON round-trips it
        self.register_to_config(schedulers=[m.to_dict() for m in members])

    @property
    def batch_equals_single_runs(self) -> bool:  # type: ignore[override]
        return all(m.batch_equals_single_runs for m in self.members)

    @property
    def draws_inside_passes(self) -> bool:  # type: ignore[override]
        return any(m.draws_inside_passes for m in self.members)

    @property
    def model_family(self) -> Optional[str]:
        families = {m.model_family for m in self.members} - {None}
        return self.config.get("model_family") or (families.pop() if len(families) == 1 else None)

    def check_model_family(self, family: str) -> None:
        super().check_model_family(family)
        for m in self.members:
            m.check_model_family(family)

    def _names(self) -> List[str]:
        return [f"{type(m).__name__} (member {i})" for i, m in enumerate(self.members)]

    def acted_scales(self, scale_schedule):
        return frozenset().union(*(m.acted_scales(scale_schedule) for m in self.members))

    def plan_scales(self, scale_schedule, model=None):
        num_scales, names = len(scale_schedule), self._names()
        member_plans = [m.plan_scales(scale_schedule, model) for m in self.members]
        for plans in member_plans:
            validate_plans(plans, num_scales)
        groupers = [i for i, p in enumerate(member_plans) if any(len(x.scale_indices) > 1 for x in p)]
        if len(groupers) > 1:
            raise ValueError(
                f"{names[groupers[0]]} and {names[groupers[1]]} both group scales; a composition allows one grouping"
            )
        acted = [m.acted_scales(scale_schedule) for m in self.members]
        for i, plans in enumerate(member_plans):
            for si in sorted({k for x in plans if x.skip for k in x.scale_indices}):
                for j, scales in enumerate(acted):
                    if j != i and si in scales:
                        raise ValueError(
                            f"{names[i]} skips scale {si}, which {names[j]} acts on; compose them on other scales "
                            f"(or drop the skip)"
                        )
        base = member_plans[groupers[0]] if groupers else member_plans[0]
        merged = []
        for plan in base:
            scales = set(plan.scale_indices)
            overlapping = [x for plans in member_plans for x in plans if scales & set(x.scale_indices)]
            merged.append(
                replace(
                    plan,
                    skip=any(x.skip for x in overlapping),
                    cfg_halve=any(x.cfg_halve for x in overlapping),
                    cfg_uncond_only=any(x.cfg_uncond_only for x in overlapping),
                    record_attention_layers=frozenset().union(*(x.record_attention_layers for x in overlapping)),
                    attention_map="full" if any(x.attention_map == "full" for x in overlapping) else "key_mean",
                )
            )
        return merged

    def before_scale(self, state, plan):
        for m in self.members:
            m.before_scale(state, plan)

    def route_pass(self, state, plan):
        names, merged = self._names(), PassRoutes()
        owner: Dict[Tuple[int, str], int] = {}
        records: List[Tuple[int, str, FrozenSet[int]]] = []  # (member, what, layers) for the conflict check
        scales = set(plan.scale_indices)
        # token selections that pass the other positions through are declared first, so that other members may nest
        # within them whatever the order of the list (DepthVAR's depth within LazyVAR's kept tokens)
        order = sorted(range(len(self.members)), key=lambda i: not self.members[i].selects_tokens)
        for i in order:
            m = self.members[i]
            recorded = frozenset().union(
                *(
                    x.record_attention_layers
                    for x in m.plan_scales(state.scale_schedule, state.model)
                    if scales & set(x.scale_indices)
                )
            )
            if recorded:
                records.append((i, "attention map", recorded))
            outer = merged.routes.get((0, "block"))
            if outer is None:
                routes = m.route_pass(state, plan)
            else:  # what the earlier members keep, handed over (the residual positions they name per scale)
                routes = m.route_pass_within(state, plan, TokenSelection(outer, merged.residual_tokens))
            if not routes:
                continue
            for key, route in routes.routes.items():
                if (key[0], "mixing") in owner:
                    raise ValueError(
                        f"{names[i]} routes {key[1]} of layer {key[0]} at scales {list(plan.scale_indices)}, which "
                        f"{names[owner[(key[0], 'mixing')]]} runs on token mixtures there; a mixing span takes its "
                        "layers whole"
                    )
                if key in merged.routes and not _nests(route, merged.routes[key]):
                    raise ValueError(
                        f"{names[owner[key]]} and {names[i]} both route {key[1]} of layer {key[0]} at scales "
                        f"{list(plan.scale_indices)}; two methods may share a layer only by nesting one selection "
                        "in the other"
                    )
                level = [
                    k for k in owner if k[0] == key[0] and (k[1] == "block") != (key[1] == "block") and owner[k] != i
                ]
                if level:
                    raise ValueError(
                        f"{names[owner[level[0]]]} routes {level[0][1]} of layer {key[0]} and {names[i]} routes its "
                        f"{key[1]} at scales {list(plan.scale_indices)}; a layer is routed as a whole block or per "
                        "sublayer, not both"
                    )
                merged.routes[key] = route
                owner[key] = i
            for start, mixing in routes.mixing.items():
                span = set(range(start, mixing.end_layer))
                taken = sorted({k[0] for k in owner} & span) or sorted(
                    l for s0, m0 in merged.mixing.items() for l in range(s0, m0.end_layer) if l in span
                )
                if taken:
                    raise ValueError(
                        f"{names[i]} runs layers {start}..{mixing.end_layer - 1} on token mixtures at scales "
                        f"{list(plan.scale_indices)}, but another member routes layers {taken} there; a "
                        "mixing span takes its layers whole"
                    )
                merged.mixing[start] = mixing
                for layer in span:
                    owner[(layer, "mixing")] = i
            rec = routes.record
            for what, layers in (
                ("block output", rec.block_outputs),
                ("block delta", rec.block_deltas),
                ("sublayer update", frozenset(layer for layer, _ in rec.sublayer_updates)),
            ):
                if layers:
                    records.append((i, what, frozenset(layers)))
            merged.record = merged.record | rec
            if routes.residual_tokens is not None and not merged.residual_tokens:
                merged.residual_tokens = routes.residual_tokens  # shared: a selector may fill it during the pass
            else:
                for si, index in routes.residual_tokens.items():
                    if si in merged.residual_tokens:
                        raise ValueError(
                            f"two members choose the zero-residual positions of scale {si}; one method may do so "
                            "per scale"
                        )
                    merged.residual_tokens[si] = index
            for si, weights in routes.code_weights.items():
                merged.code_weights[si] = merged.code_weights[si] * weights if si in merged.code_weights else weights
        for i, what, layers in records:
            for key, j in owner.items():
                if j != i and key[0] in layers:
                    raise ValueError(
                        f"{names[i]} records the {what} of layer {key[0]} at scales {list(plan.scale_indices)}, "
                        f"but {names[j]} routes that layer there: the recorded tensor would come from routed "
                        "tokens; compose them on other scales"
                    )
        return merged if merged else None

    def after_scale(self, state, plan, hidden_states_RLC):
        for m in self.members:
            m.after_scale(state, plan, hidden_states_RLC)


def _nests(route, outer) -> bool:
    """Whether ``route`` is a selection nested inside ``outer`` (same outer tokens and fill, plus an inner route)."""
    return (
        route.inner is not None
        and route.index is outer.index
        and route.selector is outer.selector
        and route.fill is outer.fill
    )
