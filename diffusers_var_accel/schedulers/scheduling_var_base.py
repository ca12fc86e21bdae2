"""The acceleration-scheduler protocol of the next-scale loop, the identity scheduler and composition.

A scheduler decides; the loop, the transformer's token-routing seam and the attention processors carry the
decision out. The loop consults a scheduler at these named extension points:

* :meth:`VARAccelScheduler.plan_scales` - one :class:`ScalePlan` per transformer pass: which scales it decodes
  (several = one pass with a block-causal mask), whether it is skipped, whether only the conditional CFG half runs,
  and whose self-attention maps are recorded.
* :meth:`VARAccelScheduler.before_scale` - called before each pass (read ``state``: f_hat, previous hidden states).
* :meth:`VARAccelScheduler.token_router` - a :class:`~diffusers_var_accel.models.forward_context.TokenRouter` for the
  pass: which tokens each block / sublayer computes (``select``) and how the others are restored (``restore``);
  per-token layer masks are a router that selects, per layer, the tokens that run it.
* :meth:`VARAccelScheduler.restore_codes` - the codes of each scale before they enter ``f_hat`` (e.g. a zero
  residual at pruned positions).
* :meth:`VARAccelScheduler.after_scale` - called after the pass, with its last hidden states and the recorded
  attention maps, before the next plan.

Plans are keyed by scale index, never by width; configurations may count scales from the end (``-1`` is the last
scale) so that one preset fits every pixel budget of a model. All per-call data lives in the loop's
``NextScaleState``. Schedulers are ``ConfigMixin`` objects saved as ``acceleration_config.json``.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, List, Optional, Sequence, Tuple, Type, Union

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

if TYPE_CHECKING:  # pragma: no cover
    from ..models.forward_context import TokenRouter
    from ..pipelines.next_scale import NextScaleState

#: Model families the library knows; a scheduler's ``model_family`` must be one of them (or ``None`` = any).
MODEL_FAMILIES = ("infinity", "hart")

_SCHEDULER_CLASSES: Dict[str, Type["VARAccelScheduler"]] = {}

#: What a recorded self-attention map keeps (see ``ScalePlan.attention_map``).
ATTENTION_MAP_KINDS = ("key_mean", "full")


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
        record_attention_layers (`frozenset[int]`): self-attention layers whose probabilities are computed
            explicitly and handed to ``after_scale`` (in ``state.attention_maps[layer]``).
        attention_map (`str`, defaults to `"key_mean"`): what is kept of a recorded map: ``"key_mean"`` the attention
            each key receives, averaged over heads and queries, ``(R, S)`` fp32 (small: one row per key); ``"full"``
            the probabilities ``(R, H, L, S)`` (memory grows with layers x heads x queries x keys).
    """

    scale_indices: Tuple[int, ...]
    skip: bool = False
    cfg_halve: bool = False
    record_attention_layers: FrozenSet[int] = field(default_factory=frozenset)
    attention_map: str = "key_mean"

    def __post_init__(self):
        if self.attention_map not in ATTENTION_MAP_KINDS:
            raise ValueError(f"attention_map must be one of {ATTENTION_MAP_KINDS}, got {self.attention_map!r}")


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
            raise ValueError(f"plan {idx} is out of order: the next plan must start at scale {expected} and be consecutive")
        if 0 in idx and len(idx) > 1:
            raise ValueError(f"plan {idx} groups scale 0 with later scales; scale 0 (the start token) runs alone")
        expected += len(idx)
    if expected != num_scales:
        raise ValueError(f"plans cover scales 0..{expected - 1} but the schedule has {num_scales} scales")


def resolve_scale_index(index: int, num_scales: int, what: str = "scale index") -> int:
    """A scale index of a schedule with ``num_scales`` scales; negative values count from the end (-1 = last).

    Raises:
        ValueError: the index is outside ``[-num_scales, num_scales)``.
    """
    if not -num_scales <= int(index) < num_scales:
        raise ValueError(f"{what} {index} is outside the schedule's {num_scales} scales (allowed: {-num_scales}..{num_scales - 1})")
    return int(index) % num_scales


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

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _SCHEDULER_CLASSES[cls.__name__] = cls

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
            raise ValueError(f"model_family must be one of {list(MODEL_FAMILIES)} or None, got {model_family!r}")

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
        scheduler = target.from_config({**config, **overrides})
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

    def to_dict(self) -> Dict[str, Any]:
        """The configuration with the class name (what ``acceleration_config.json`` holds)."""
        return {"_class_name": type(self).__name__, **{k: v for k, v in dict(self.config).items() if not k.startswith("_")}}

    # -- extension points ---------------------------------------------------------------------------------------------
    def plan_scales(self, scale_schedule: Sequence[Tuple[int, ...]]) -> List[ScalePlan]:
        """One plan per transformer pass; the default decodes every scale alone and in full."""
        return [ScalePlan((i,)) for i in range(len(scale_schedule))]

    def before_scale(self, state: "NextScaleState", plan: ScalePlan) -> None:
        """Hook before a pass (default: nothing)."""

    def token_router(self, state: "NextScaleState", plan: ScalePlan) -> Optional["TokenRouter"]:
        """The token router of a pass, or ``None`` to compute every token (default)."""
        return None

    def restore_codes(self, state: "NextScaleState", scale_index: int, codes_Bdhw: torch.Tensor) -> torch.Tensor:
        """The codes of a scale before they are added to ``f_hat`` (default: unchanged).

        A method that prunes positions can give them a zero residual here (LazyVAR), so they leave ``f_hat`` as is.
        """
        return codes_Bdhw

    def after_scale(self, state: "NextScaleState", plan: ScalePlan, hidden_states_RLC: torch.Tensor) -> None:
        """Hook after a pass and its sampling, before the next plan (default: nothing)."""

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

    Merge rules, per pass: at most one member may group scales (its plans define the passes); a pass is skipped if a
    member skips its scales (members must agree on the passes that contain skipped scales), CFG-halved if any member
    halves any of its scales, and records the union of the requested attention layers. ``before_scale`` and
    ``after_scale`` call every member in order. At most one member may route the tokens of a pass.

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
    def model_family(self) -> Optional[str]:
        families = {m.model_family for m in self.members} - {None}
        return self.config.get("model_family") or (families.pop() if len(families) == 1 else None)

    def check_model_family(self, family: str) -> None:
        super().check_model_family(family)
        for m in self.members:
            m.check_model_family(family)

    def plan_scales(self, scale_schedule):
        num_scales = len(scale_schedule)
        member_plans = [m.plan_scales(scale_schedule) for m in self.members]
        for plans in member_plans:
            validate_plans(plans, num_scales)
        groupers = [p for p in member_plans if any(len(x.scale_indices) > 1 for x in p)]
        if len(groupers) > 1:
            raise ValueError("more than one member scheduler groups scales; a composition allows one grouping")
        base = groupers[0] if groupers else member_plans[0]
        merged = []
        for plan in base:
            scales = set(plan.scale_indices)
            overlapping = [x for plans in member_plans for x in plans if scales & set(x.scale_indices)]
            skips = {x.skip for x in overlapping}
            if len(skips) > 1:
                raise ValueError(f"member schedulers disagree on skipping scales {sorted(scales)}")
            merged.append(replace(
                plan,
                skip=skips.pop(),
                cfg_halve=any(x.cfg_halve for x in overlapping),
                record_attention_layers=frozenset().union(*(x.record_attention_layers for x in overlapping)),
                attention_map="full" if any(x.attention_map == "full" for x in overlapping) else "key_mean",
            ))
        return merged

    def before_scale(self, state, plan):
        for m in self.members:
            m.before_scale(state, plan)

    def token_router(self, state, plan):
        routers = [(m, r) for m in self.members if (r := m.token_router(state, plan)) is not None]
        if len(routers) > 1:
            names = [type(m).__name__ for m, _ in routers]
            raise ValueError(f"members {names} both route the tokens of scales {plan.scale_indices}; compose them on different scales")
        return routers[0][1] if routers else None

    def restore_codes(self, state, scale_index, codes_Bdhw):
        for m in self.members:
            codes_Bdhw = m.restore_codes(state, scale_index, codes_Bdhw)
        return codes_Bdhw

    def after_scale(self, state, plan, hidden_states_RLC):
        for m in self.members:
            m.after_scale(state, plan, hidden_states_RLC)


def load_acceleration(spec: Optional[str], model_family: str) -> Optional[VARAccelScheduler]:
    """A scheduler from a short spec, for command lines and benchmarks.

    * ``"baseline"`` / ``"none"`` / ``None``: no acceleration (``None``);
    * ``"<method>"`` (``fastvar``, ``lazyvar``, ...): the method's preset for ``model_family``;
    * ``"<model>/<method>"`` (``infinity-2b/lazyvar``, ``hart-0.7b/fastvar``): that packaged preset (it must be for
      ``model_family``);
    * either with ``":key=value,key=value"``: the preset with overrides (values parsed as JSON, e.g.
      ``fastvar:skip_last_scales=false``, ``infinity-2b/lazyvar:keep_ratios=[0.4,0.2,0.1,0.05]``);
    * a folder or an ``acceleration_config.json`` file: :meth:`VARAccelScheduler.from_pretrained`.
    """
    import json

    from .presets import available_presets, is_preset_name

    if spec is None or spec.lower() in ("baseline", "none"):
        return None
    if os.path.isdir(spec) or spec.endswith(".json"):
        path = (os.path.dirname(spec) or ".") if spec.endswith(".json") else spec
        return VARAccelScheduler.from_pretrained(path)
    name, _, overrides_text = spec.partition(":")
    by_method = {cls.__name__.lower()[: -len("scheduler")]: cls for cls in _SCHEDULER_CLASSES.values() if cls.presets}
    if "/" in name:
        if not is_preset_name(name):
            raise ValueError(f"unknown acceleration preset {name!r}; available presets: {available_presets()} (a Hub repo "
                             "loads with VARAccelScheduler.from_pretrained(repo_id, subfolder=...))")
    elif name.lower() not in by_method:
        raise ValueError(f"unknown acceleration {name!r}; known: {sorted(by_method) + ['baseline']}, a preset name "
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
    return by_method[name.lower()].from_preset(model_family, **overrides)


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
