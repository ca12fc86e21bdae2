"""The acceleration-scheduler protocol of the next-scale loop, the identity scheduler and composition.

A scheduler decides; the executor (:mod:`diffusers_var_accel.next_scale.executor`) and the loop carry the decision
out. The loop consults a scheduler at these named extension points:

* :meth:`VARAccelScheduler.plan_scales` - one :class:`ScalePlan` per transformer pass: which scales it decodes
  (several = one pass with a block-causal mask), whether it is skipped, whether only the conditional CFG half runs,
  and whose self-attention maps are recorded.
* :meth:`VARAccelScheduler.before_scale` - called before each pass (read ``state``: f_hat, what earlier passes kept).
* :meth:`VARAccelScheduler.route_pass` - the pass's :class:`~diffusers_var_accel.next_scale.plan.PassRoutes`: which
  tokens each block or sublayer computes and how the others are filled, what is recorded for later scales, which
  positions get a zero residual and how codes are weighted.
* :meth:`VARAccelScheduler.after_scale` - called after the pass and its sampling, with what the pass recorded
  (``state.records``), before the next plan.

Plans are keyed by scale index, never by width; configurations may count scales from the end (``-1`` is the last
scale) so that one preset fits every pixel budget of a model. All per-call data lives in the loop's
``NextScaleState`` (each method's in a typed object, :meth:`VARAccelScheduler.call_state`). Schedulers are
``ConfigMixin`` objects saved as ``acceleration_config.json``.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple, Type, Union

from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from ..families import MODEL_FAMILIES  # noqa: F401  (re-exported: the registry of model families)
from ..next_scale.plan import (  # noqa: F401  (re-exported for the methods)
    ATTENTION_MAP_KINDS,
    ModelInfo,
    PassRoutes,
    ScalePlan,
    TokenSelection,
    resolve_scale_index,
    validate_plans,
)
from .registry import BASELINE, COMPOSE_SEPARATOR, METHODS, get_method, method_names, register_method

if TYPE_CHECKING:  # pragma: no cover
    from ..next_scale.state import NextScaleState

_SCHEDULER_CLASSES: Dict[str, Type["VARAccelScheduler"]] = {}


def plain_config_value(value: Any) -> Any:
    """``value`` with every tuple, at any depth of lists, tuples and dicts, as a list (what JSON gives back)."""
    if isinstance(value, (list, tuple)):
        return [plain_config_value(v) for v in value]
    if isinstance(value, dict):
        return {k: plain_config_value(v) for k, v in value.items()}
    return value


def check_ratio(value: float, name: str) -> float:
    """A ratio in [0, 1], or a ``ValueError`` naming it."""
    if not (isinstance(value, (int, float)) and 0.0 <= float(value) <= 1.0):
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return float(value)


class VARAccelScheduler(SchedulerMixin, ConfigMixin):
    """Base class of the acceleration schedulers; the default behaviour of every hook is "no acceleration".

    Subclasses register their configuration with ``@register_to_config`` (always including ``model_family``),
    override only the extension points they need, and may ship ``presets``: ``{model_family: constructor kwargs}``
    (the library's methods read theirs from the packaged JSON presets, see :mod:`.presets`).

    Saving and loading follow diffusers' schedulers: ``save_pretrained(dir)`` writes ``acceleration_config.json``
    (``push_to_hub(repo_id, subfolder=...)`` uploads the same file); ``from_pretrained(name, subfolder=..., **overrides)``
    reads it back from a packaged preset (``"infinity-2b/lazyvar"``), a folder or a Hub repo, keyword arguments
    overriding the stored values (an unknown keyword raises).
    """

    config_name = "acceleration_config.json"
    _compatibles: List[str] = []
    #: Per model family, the constructor arguments of the method's published setting.
    presets: Dict[str, Dict[str, Any]] = {}

    def __init_subclass__(cls, method: Optional[str] = None, **kwargs):
        """Record the class by name (configurations name it) and, with ``method="name"`` on the class line, register
        it as an acceleration method (:mod:`.registry`): ``class LazyVARScheduler(VARAccelScheduler, method="lazyvar")``."""
        super().__init_subclass__(**kwargs)
        _SCHEDULER_CLASSES[cls.__name__] = cls
        if method is not None:
            register_method(method, cls)

    # -- identity of the configuration -------------------------------------------------------------------------------
    @property
    def model_family(self) -> Optional[str]:
        return self.config.get("model_family") if hasattr(self, "config") else None

    def check_model_family(self, family: str) -> None:
        """Raise if this scheduler was configured for another model family than ``family``."""
        if self.model_family is not None and self.model_family != family:
            raise ValueError(
                f"{type(self).__name__} was built for model family {self.model_family!r}, not {family!r}; "
                f"use {type(self).__name__}.from_preset({family!r}) or set model_family={family!r}"
            )

    @staticmethod
    def _check_family_name(model_family: Optional[str]) -> None:
        if model_family is not None and model_family not in MODEL_FAMILIES:
            raise ValueError(f"model_family must be one of {sorted(MODEL_FAMILIES)} or None, got {model_family!r}")

    # -- construction -------------------------------------------------------------------------------------------------
    @classmethod
    def from_preset(cls, model_family: str, **overrides) -> "VARAccelScheduler":
        """The method's published setting for ``model_family``, with keyword overrides."""
        if model_family not in cls.presets:
            raise ValueError(f"{cls.__name__} has no preset for {model_family!r}; presets exist for {sorted(cls.presets)}")
        cls._check_overrides(overrides)
        return cls(**{**cls.presets[model_family], **overrides})

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path=None, subfolder: Optional[str] = None, return_unused_kwargs=False, **kwargs):
        """Load ``acceleration_config.json`` from a packaged preset, a folder or a Hub repo; kwargs override it.

        Args:
            pretrained_model_name_or_path (`str` or `os.PathLike`): a packaged preset name (``"infinity-2b/lazyvar"``,
                see :func:`~diffusers_var_accel.schedulers.presets.available_presets`), a folder holding
                ``acceleration_config.json``, or a Hub repo id. An existing local path wins over a preset name, and a
                preset name over a Hub repo of the same name.
            subfolder (`str`, *optional*): the folder inside it (``from_pretrained(repo_id, subfolder="lazyvar")``;
                ``("infinity-2b", subfolder="lazyvar")`` is the packaged preset ``"infinity-2b/lazyvar"``).
            **kwargs (`Any`): Hub arguments (``cache_dir``, ``force_download``, ``proxies``, ``local_files_only``,
                ``token``, ``revision``) and settings of the class overriding the stored ones.

        Raises:
            ValueError: an unknown preset name (the message lists the available ones), a configuration of another
                scheduler class than ``cls``, or an unknown setting.
        """
        from .presets import PRESET_CONFIG_NAME, available_presets, close_preset_names, preset_folder, presets_for_class, resolve_preset_reference

        hub_keys = {"cache_dir", "force_download", "proxies", "local_files_only", "token", "revision"}
        overrides = {k: v for k, v in kwargs.items() if k not in hub_keys}
        hub_kwargs = {k: v for k, v in kwargs.items() if k in hub_keys}
        preset = resolve_preset_reference(pretrained_model_name_or_path, subfolder)
        source = pretrained_model_name_or_path
        if preset is not None:
            source, subfolder = str(preset_folder(preset)), None
        try:
            config = cls.load_config(source, subfolder=subfolder, **hub_kwargs)
        except OSError as err:
            if preset is None and isinstance(source, str) and not os.path.exists(source) and source.count("/") <= 1:
                presets = available_presets()
                hint = close_preset_names(source)
                raise OSError(f"{err}\n({source!r} is not a packaged acceleration preset either{hint}; available presets: "
                              f"{presets})") from err
            raise
        where = (os.path.join(os.fspath(source), subfolder or "", PRESET_CONFIG_NAME)
                 if isinstance(source, (str, os.PathLike)) and os.path.isdir(source) else (preset or pretrained_model_name_or_path))
        stored = config.get("_class_name")
        if stored is None and cls is VARAccelScheduler:
            raise ValueError(f"{where} has no _class_name: VARAccelScheduler.from_pretrained cannot tell which scheduler it "
                             f"holds; allowed: {sorted(_SCHEDULER_CLASSES)}")
        if stored is not None and stored not in _SCHEDULER_CLASSES:
            raise ValueError(f"{where} names the scheduler class {stored!r}, which does not exist"
                             f"{_close_class_names(str(stored))}; allowed: {sorted(_SCHEDULER_CLASSES)}")
        target = cls
        if stored and stored != cls.__name__:
            if cls is not VARAccelScheduler and not issubclass(_SCHEDULER_CLASSES.get(stored, object), cls):
                name = preset or pretrained_model_name_or_path
                own = presets_for_class(cls.__name__)
                raise ValueError(
                    f"{name} holds a {stored} configuration, not a {cls.__name__}: load it with {stored}.from_pretrained "
                    f"or VARAccelScheduler.from_pretrained" + (f"; {cls.__name__} presets: {own}" if own else "")
                )
            target = _SCHEDULER_CLASSES.get(stored, cls)
        stored_settings = {k: v for k, v in config.items() if not k.startswith("_")}
        try:
            target._check_overrides(stored_settings)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        target._check_overrides(overrides)
        try:
            scheduler = target.from_config({**config, **overrides})
        except ValueError as err:
            if overrides:  # name the file only when its own settings are at fault
                try:
                    target.from_config(config)
                except ValueError:
                    raise ValueError(f"{where}: {err}") from None
                raise
            raise ValueError(f"{where}: {err}") from None
        return (scheduler, {}) if return_unused_kwargs else scheduler

    @classmethod
    def from_config(cls, config=None, return_unused_kwargs=False, **kwargs):
        """``ConfigMixin.from_config``, strict: a ``_class_name`` that names no scheduler class and a setting the class
        does not have are errors (diffusers would only log them and build a scheduler without them)."""
        if config is not None:
            config = dict(config)
            stored = config.get("_class_name")
            if stored is not None and stored not in _SCHEDULER_CLASSES:
                raise ValueError(f"the configuration names the scheduler class {stored!r}, which does not exist"
                                 f"{_close_class_names(str(stored))}; allowed: {sorted(_SCHEDULER_CLASSES)}")
            cls._check_overrides({k: v for k, v in config.items() if not k.startswith("_")})
        return super().from_config(config, return_unused_kwargs=return_unused_kwargs, **kwargs)

    @classmethod
    def _check_overrides(cls, overrides: Dict[str, Any]) -> None:
        allowed = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "args", "kwargs")]
        unknown = sorted(set(overrides) - set(allowed))
        if unknown:
            raise ValueError(f"{cls.__name__} has no setting(s) {unknown}; allowed: {allowed}")

    # -- calibration ----------------------------------------------------------------------------------------------------
    @classmethod
    def calibration_grid(cls, num_layers: int) -> List[Dict[str, Any]]:
        """The settings ``var-accel calibrate`` searches for this method on a model of ``num_layers`` blocks, in search
        order: a small, explicit and deterministic grid of the constructor's real settings (scale indices counted
        from the end, so one grid fits every schedule), each a dict of constructor keywords (``model_family`` is
        added by the search). A method ships one by overriding this classmethod; the default says it has none
        (:func:`~diffusers_var_accel.calibration.calibrate` then refuses the method, naming the ones that have one).

        Raises:
            NotImplementedError: the method has no calibration grid.
        """
        raise NotImplementedError(f"{cls.__name__} has no calibration grid (override {cls.__name__}.calibration_grid)")

    @classmethod
    def composition_calibration_grid(cls, num_layers: int) -> List[Dict[str, Any]]:
        """The settings this method takes as a member of a calibrated composition (``var-accel calibrate --method
        a+b``): few, and on scales or routes the other methods can share; the search tries the product of the
        members' lists. Default: the method has none.

        Raises:
            NotImplementedError: the method has no composition settings.
        """
        raise NotImplementedError(f"{cls.__name__} has no calibration settings as a composition member (override "
                                  f"{cls.__name__}.composition_calibration_grid)")

    @classmethod
    def has_calibration_grid(cls, as_member: bool = False) -> bool:
        """Whether the method overrides :meth:`calibration_grid` (with ``as_member``:
        :meth:`composition_calibration_grid`)."""
        name = "composition_calibration_grid" if as_member else "calibration_grid"
        return getattr(cls, name).__func__ is not getattr(VARAccelScheduler, name).__func__

    def to_dict(self) -> Dict[str, Any]:
        """The configuration with the class name (what ``acceleration_config.json`` holds), in plain JSON types: every
        tuple, at any depth, as a list (settings given as tuples, as presets and defaults often are, would otherwise
        reach the Hub model card's YAML as ``!!python/tuple`` and compare unequal to the same configuration loaded
        from JSON). This is the one place a configuration is normalised for output."""
        settings = {k: v for k, v in dict(self.config).items() if not k.startswith("_")}
        return {"_class_name": type(self).__name__, **{k: plain_config_value(v) for k, v in settings.items()}}

    # -- extension points ---------------------------------------------------------------------------------------------
    def plan_scales(self, scale_schedule: Sequence[Tuple[int, ...]], model: Optional[ModelInfo] = None) -> List[ScalePlan]:
        """One plan per transformer pass; the default decodes every scale alone and in full.

        Args:
            scale_schedule: the call's ``(t, h, w)`` per scale.
            model (`ModelInfo`, *optional*): the model the plans are for (its depth and family), as the loop gives it
                (``ModelInfo(num_layers, family)``); `None` when a caller plans without a model (a method whose plans
                depend on the depth then plans for every layer it could have).
        """
        return [ScalePlan((i,)) for i in range(len(scale_schedule))]

    def before_scale(self, state: "NextScaleState", plan: ScalePlan) -> None:
        """Hook before a pass (default: nothing)."""

    def route_pass(self, state: "NextScaleState", plan: ScalePlan) -> Optional[PassRoutes]:
        """What the pass computes beyond its plan (token routes, records, residual positions, code weights), or
        ``None`` for a dense pass (default)."""
        return None

    def route_pass_within(self, state: "NextScaleState", plan: ScalePlan, selection: TokenSelection) -> Optional[PassRoutes]:
        """:meth:`route_pass` in a composition whose earlier member keeps only some tokens of the pass
        (``selection``: its route and, per scale, the positions it keeps). A method that can select within another's
        tokens nests its routes inside ``selection.route`` (:meth:`TokenRoute.within`); the default ignores the
        selection (``route_pass``), and the composition then refuses a route of this method on a layer the selection
        routes."""
        return self.route_pass(state, plan)

    def after_scale(self, state: "NextScaleState", plan: ScalePlan, hidden_states_RLC) -> None:
        """Hook after a pass and its sampling, before the next plan (default: nothing); ``state.records`` holds
        what the pass recorded."""

    def acted_scales(self, scale_schedule: Sequence[Tuple[int, ...]]) -> FrozenSet[int]:
        """The scales this method changes or reads from (a composition refuses to skip them); default: none."""
        return frozenset()

    #: Whether the method's routes keep a subset of tokens and pass the others through, so that other methods of a
    #: composition may select again within its kept tokens (they are asked after it).
    selects_tokens: bool = False

    #: Whether a batch with one generator per image equals the images generated one at a time, bit for bit (on HART
    #: up to the model's own near-tie token flips, see docs/hart.md). A method whose decisions order *every* token by
    #: a continuous score says ``False``: a batched GEMM rounds differently from a single one (by ~1e-6, differently
    #: on different CPUs), which can swap two near-tied ranks and so change what those tokens compute. Such a method
    #: still keeps every image of a batch independent of the others (tested bit for bit at equal batch size).
    batch_equals_single_runs: bool = True

    #: Whether the method's routes draw random numbers inside a pass (a mixing span's mixer): such passes cannot be
    #: captured or compiled (``enable_cuda_graphs()`` / ``compile_passes()`` refuse them).
    draws_inside_passes: bool = False

    #: The typed per-call object of the method (a dataclass with defaults), or ``None`` when it keeps nothing.
    call_state_class: Optional[Callable[[], Any]] = None

    def call_state(self, state: "NextScaleState"):
        """This scheduler's per-call object in the call of ``state`` (made on first use, dropped with the call)."""
        if self.call_state_class is None:
            raise TypeError(f"{type(self).__name__} keeps no per-call state (call_state_class is None)")
        return state.call_state(self, self.call_state_class)

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if k != "_class_name")
        return f"{type(self).__name__}({settings})"


class IdentityScheduler(VARAccelScheduler):
    """No acceleration: the baseline is the same loop run with this scheduler. Fits every model family."""

    @register_to_config
    def __init__(self, model_family: Optional[str] = None):
        super().__init__()
        self._check_family_name(model_family)


def _close_class_names(name: str) -> str:
    from .presets import close_names

    return close_names(name, sorted(_SCHEDULER_CLASSES))


def scheduler_from_dict(config: Dict[str, Any]) -> VARAccelScheduler:
    """Rebuild a scheduler from ``to_dict()`` output (``_class_name`` + settings)."""
    name = config.get("_class_name")
    if name not in _SCHEDULER_CLASSES:
        raise ValueError(f"unknown acceleration scheduler {name!r}{_close_class_names(str(name))}; known: {sorted(_SCHEDULER_CLASSES)}")
    cls = _SCHEDULER_CLASSES[name]
    settings = {k: v for k, v in config.items() if not k.startswith("_")}
    cls._check_overrides(settings)
    return cls(**settings)


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
    def __init__(self, schedulers: Sequence[Union[Dict[str, Any], VARAccelScheduler]] = (), model_family: Optional[str] = None):
        super().__init__()
        self._check_family_name(model_family)
        members = [s if isinstance(s, VARAccelScheduler) else scheduler_from_dict(dict(s)) for s in schedulers]
        if not members:
            raise ValueError("ComposedScheduler needs at least one member scheduler")
        for m in members:
            if model_family is not None and m.model_family not in (None, model_family):
                raise ValueError(f"member {type(m).__name__} is for {m.model_family!r}, the composition for {model_family!r}")
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
            raise ValueError(f"{names[groupers[0]]} and {names[groupers[1]]} both group scales; a composition allows one grouping")
        acted = [m.acted_scales(scale_schedule) for m in self.members]
        for i, plans in enumerate(member_plans):
            for si in sorted({k for x in plans if x.skip for k in x.scale_indices}):
                for j, scales in enumerate(acted):
                    if j != i and si in scales:
                        raise ValueError(f"{names[i]} skips scale {si}, which {names[j]} acts on; compose them on other scales "
                                         f"(or drop the skip)")
        base = member_plans[groupers[0]] if groupers else member_plans[0]
        merged = []
        for plan in base:
            scales = set(plan.scale_indices)
            overlapping = [x for plans in member_plans for x in plans if scales & set(x.scale_indices)]
            merged.append(replace(
                plan,
                skip=any(x.skip for x in overlapping),
                cfg_halve=any(x.cfg_halve for x in overlapping),
                cfg_uncond_only=any(x.cfg_uncond_only for x in overlapping),
                record_attention_layers=frozenset().union(*(x.record_attention_layers for x in overlapping)),
                attention_map="full" if any(x.attention_map == "full" for x in overlapping) else "key_mean",
            ))
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
            recorded = frozenset().union(*(x.record_attention_layers for x in m.plan_scales(state.scale_schedule, state.model)
                                           if scales & set(x.scale_indices)))
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
                    raise ValueError(f"{names[i]} routes {key[1]} of layer {key[0]} at scales {list(plan.scale_indices)}, which "
                                     f"{names[owner[(key[0], 'mixing')]]} runs on token mixtures there; a mixing span takes its "
                                     "layers whole")
                if key in merged.routes and not _nests(route, merged.routes[key]):
                    raise ValueError(f"{names[owner[key]]} and {names[i]} both route {key[1]} of layer {key[0]} at scales "
                                     f"{list(plan.scale_indices)}; two methods may share a layer only by nesting one selection "
                                     "in the other")
                level = [k for k in owner if k[0] == key[0] and (k[1] == "block") != (key[1] == "block") and owner[k] != i]
                if level:
                    raise ValueError(f"{names[owner[level[0]]]} routes {level[0][1]} of layer {key[0]} and {names[i]} routes its "
                                     f"{key[1]} at scales {list(plan.scale_indices)}; a layer is routed as a whole block or per "
                                     "sublayer, not both")
                merged.routes[key] = route
                owner[key] = i
            for start, mixing in routes.mixing.items():
                span = set(range(start, mixing.end_layer))
                taken = sorted({k[0] for k in owner} & span) or sorted(
                    l for s0, m0 in merged.mixing.items() for l in range(s0, m0.end_layer) if l in span)
                if taken:
                    raise ValueError(f"{names[i]} runs layers {start}..{mixing.end_layer - 1} on token mixtures at scales "
                                     f"{list(plan.scale_indices)}, but another member routes layers {taken} there; a "
                                     "mixing span takes its layers whole")
                merged.mixing[start] = mixing
                for layer in span:
                    owner[(layer, "mixing")] = i
            rec = routes.record
            for what, layers in (("block output", rec.block_outputs), ("block delta", rec.block_deltas),
                                 ("sublayer update", frozenset(layer for layer, _ in rec.sublayer_updates))):
                if layers:
                    records.append((i, what, frozenset(layers)))
            merged.record = merged.record | rec
            if routes.residual_tokens is not None and not merged.residual_tokens:
                merged.residual_tokens = routes.residual_tokens  # shared: a selector may fill it during the pass
            else:
                for si, index in routes.residual_tokens.items():
                    if si in merged.residual_tokens:
                        raise ValueError(f"two members choose the zero-residual positions of scale {si}; one method may do so "
                                         "per scale")
                    merged.residual_tokens[si] = index
            for si, weights in routes.code_weights.items():
                merged.code_weights[si] = merged.code_weights[si] * weights if si in merged.code_weights else weights
        for i, what, layers in records:
            for key, j in owner.items():
                if j != i and key[0] in layers:
                    raise ValueError(f"{names[i]} records the {what} of layer {key[0]} at scales {list(plan.scale_indices)}, "
                                     f"but {names[j]} routes that layer there: the recorded tensor would come from routed "
                                     "tokens; compose them on other scales")
        return merged if merged else None

    def after_scale(self, state, plan, hidden_states_RLC):
        for m in self.members:
            m.after_scale(state, plan, hidden_states_RLC)


def _nests(route, outer) -> bool:
    """Whether ``route`` is a selection nested inside ``outer`` (same outer tokens and fill, plus an inner route)."""
    return (route.inner is not None and route.index is outer.index and route.selector is outer.selector
            and route.fill is outer.fill)


def load_acceleration(spec: Optional[str], model_family: str, preset_model: Optional[str] = None) -> Optional[VARAccelScheduler]:
    """A scheduler from a short spec, for command lines and benchmarks.

    ``preset_model`` (``pipe.preset_model``): the model whose packaged presets a method name stands for, when it has
    one for that method (``"embedded"``: ``embedded/lazyvar``); by default, and for a method it has none of, the
    family's (``infinity-2b/lazyvar``).

    * ``"baseline"`` / ``"none"`` / ``None``: no acceleration (``None``);
    * ``"<method>"`` (a name of :func:`~.registry.method_names`: ``fastvar``, ``lazyvar``, ...): the method's preset
      for ``model_family``;
    * ``"<method>+<method>"`` (``lazyvar+arvar``): a :class:`ComposedScheduler` of the presets (no overrides);
    * ``"<model>/<method>"`` (``infinity-2b/lazyvar``, ``hart-0.7b/fastvar``): that packaged preset (it must be for
      ``model_family``);
    * either with ``":key=value,key=value"``: the preset with overrides (values parsed as JSON, e.g.
      ``fastvar:skip_last_scales=false``, ``infinity-2b/lazyvar:keep_ratios=[0.4,0.2,0.1,0.05]``);
    * a folder or an ``acceleration_config.json`` file: :meth:`VARAccelScheduler.from_pretrained`.
    """
    import json

    from .presets import available_presets, is_preset_name

    if spec is None or spec.lower() in (BASELINE, "none"):
        return None
    if os.path.isdir(spec) or spec.endswith(".json"):
        path = (os.path.dirname(spec) or ".") if spec.endswith(".json") else spec
        return VARAccelScheduler.from_pretrained(path)
    name, _, overrides_text = spec.partition(":")
    if "/" not in name and COMPOSE_SEPARATOR in name:
        if overrides_text:
            raise ValueError(f"{spec!r}: a composition ({name!r}) takes no ':key=value' overrides (they would be "
                             "ambiguous between its members); save the composed scheduler's configuration and pass its "
                             "folder, or use pipe.enable_acceleration(name, <method>={...})")
        return build_acceleration(name.lower(), model_family, preset_model=preset_model)
    by_method = {method: METHODS[method] for method in method_names()}
    if "/" in name:
        if not is_preset_name(name):
            raise ValueError(f"unknown acceleration preset {name!r}; available presets: {available_presets()} (a Hub repo "
                             "loads with VARAccelScheduler.from_pretrained(repo_id, subfolder=...))")
    elif name.lower() not in by_method:
        raise ValueError(f"unknown acceleration {name!r}; known: {list(by_method) + [BASELINE]}, methods joined with "
                         f"{COMPOSE_SEPARATOR!r} ('lazyvar{COMPOSE_SEPARATOR}arvar'), a preset name "
                         f"({', '.join(available_presets())}) or a config folder/JSON file")
    overrides = {}
    for item in _split_top_level(overrides_text):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"override {item!r} in {spec!r} is not key=value")
        try:
            overrides[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key.strip()] = value
    if "/" in name:
        scheduler = VARAccelScheduler.from_pretrained(name, **overrides)
        if scheduler.model_family not in (None, model_family):
            raise ValueError(f"the preset {name!r} is for model family {scheduler.model_family!r}, not {model_family!r}; "
                             f"presets for {model_family!r}: {[n for n in available_presets() if _preset_family(n) == model_family]}")
        return scheduler
    own = own_preset_name(preset_model, model_family, name.lower())
    if own is not None:
        return preset_scheduler(by_method[name.lower()], own, model_family, overrides)
    return by_method[name.lower()].from_preset(model_family, **overrides)


def own_preset_name(preset_model: Optional[str], model_family: str, method: str) -> Optional[str]:
    """``"<preset_model>/<method>"`` when ``preset_model`` is not the family's preset model and has a packaged preset
    of ``method``, else ``None`` (the family's preset applies)."""
    from .presets import FAMILY_PRESET_MODELS, is_preset_name

    if preset_model is None or model_family not in FAMILY_PRESET_MODELS or preset_model == FAMILY_PRESET_MODELS[model_family]:
        return None
    name = f"{preset_model}/{method}"
    return name if is_preset_name(name) else None


def preset_scheduler(cls, name: str, model_family: str, overrides: Dict[str, Any]) -> VARAccelScheduler:
    """The packaged preset ``name`` as a ``cls``, with ``overrides``; it must be for ``model_family``."""
    cls._check_overrides(overrides)
    scheduler = cls.from_pretrained(name, **overrides)
    if scheduler.model_family not in (None, model_family):
        raise ValueError(f"the preset {name!r} is for model family {scheduler.model_family!r}, not {model_family!r}")
    return scheduler


def method_preset(cls, method: str, model_family: str, preset_model: Optional[str] = None,
                  overrides: Optional[Dict[str, Any]] = None) -> VARAccelScheduler:
    """The preset scheduler of ``method`` (class ``cls``) for this model: ``preset_model``'s own packaged preset when it
    has one, else the family's, with ``overrides``. A bad override is an error that names the preset and what it
    holds (an override that fits the paper's preset may not fit another model's: four keep ratios for a two-scale
    group)."""
    overrides = dict(overrides or {})
    own = own_preset_name(preset_model, model_family, method)
    try:
        if own is None:
            return cls.from_preset(model_family, **overrides)
        return preset_scheduler(cls, own, model_family, overrides)
    except ValueError as err:
        if not overrides:
            raise
        from .presets import FAMILY_PRESET_MODELS, load_preset_config

        name = own or f"{FAMILY_PRESET_MODELS.get(model_family, model_family)}/{method}"
        try:
            stored = {k: v for k, v in load_preset_config(name).items() if not k.startswith("_") and k != "model_family"}
        except ValueError:
            stored = {}
        given = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
        holds = ", ".join(f"{k}={v!r}" for k, v in stored.items())
        raise ValueError(f"{method} with {given} over the preset {name} ({holds}): {err}") from None


def build_acceleration(name: str, model_family: str, preset_model: Optional[str] = None, **overrides: Any) -> VARAccelScheduler:
    """The scheduler a method name stands for: ``"lazyvar"`` (its preset for ``model_family``) or ``"lazyvar+arvar"``
    (a :class:`ComposedScheduler` of the members' presets, in that order).

    Args:
        name (`str`): a registered method name, or several joined with ``"+"``.
        model_family (`str`): the family whose presets are used.
        preset_model (`str`, *optional*): a model with packaged presets of its own (``pipe.preset_model``, e.g.
            ``"embedded"``): a member with such a preset uses it instead of the family's.
        **overrides (`Any`): for one method, its settings replacing the preset's (``keep_ratios=(...)``). For a
            composition, one keyword per member holding that member's settings (``lazyvar={"keep_ratios": (...)}``):
            a plain setting would be ambiguous between the members, so it is refused.

    Raises:
        ValueError: an unknown method name (the message lists the registered ones), a method named twice, a
            composition override that names no member or is not a dict, or an unknown setting.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"an acceleration name must be a non-empty string, got {name!r}; known methods: {method_names()}")
    names = name.split(COMPOSE_SEPARATOR)
    def preset(method: str, cls, settings: Dict[str, Any]) -> VARAccelScheduler:
        return method_preset(cls, method, model_family, preset_model, settings)

    if len(names) == 1:
        return preset(name, get_method(name), overrides)
    classes = [get_method(n) for n in names]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{name!r} names {repeated} more than once; a composition holds each method once")
    for key, value in overrides.items():
        if key not in names:
            raise ValueError(f"{name!r} is a composition: its overrides are per member, as <method>={{setting: value}} "
                             f"(e.g. {names[0]}={{...}}); {key!r} names none of its members {names}")
        if not isinstance(value, dict):
            raise ValueError(f"the overrides of member {key!r} of {name!r} must be a dict of its settings, got "
                             f"{type(value).__name__}")
    members = [preset(n, cls, overrides.get(n, {})) for n, cls in zip(names, classes)]
    return ComposedScheduler(members, model_family=model_family)


def _preset_family(name: str) -> Optional[str]:
    from .presets import load_preset_config

    return load_preset_config(name).get("model_family")


def _split_top_level(text: str) -> List[str]:
    """Split ``a=1,b=[1,2]`` on the commas outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return parts + ([current] if current else [])


def split_acceleration_specs(text: str) -> List[str]:
    """Split a comma-separated list of :func:`load_acceleration` specs, keeping each spec's own overrides together.

    ``"baseline,fastvar:skip_last_scales=false,prune_ratios=[0.2,0.3],lazyvar"`` gives ``["baseline",
    "fastvar:skip_last_scales=false,prune_ratios=[0.2,0.3]", "lazyvar"]``: a part that is ``key=value`` (no ``:``
    before its ``=``) continues the previous spec.
    """
    specs: List[str] = []
    for part in (p.strip() for p in _split_top_level(text)):
        if not part:
            continue
        head = part.split("=", 1)[0]
        if "=" in part and ":" not in head and specs:
            specs[-1] += "," + part
        else:
            specs.append(part)
    return specs
