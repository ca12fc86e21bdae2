"""The acceleration-scheduler protocol of the next-scale loop: the base class every method subclasses.

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

The other jobs around the protocol have their own modules: :mod:`.identity` (no acceleration), :mod:`.composition`
(several methods in one schedule) and :mod:`.specs` (method names and spec strings to schedulers).
"""

from __future__ import annotations

import inspect
import json
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple, Type

from diffusers.configuration_utils import ConfigMixin
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
from .registry import register_method

if TYPE_CHECKING:  # pragma: no cover
    from ..next_scale.state import NextScaleState

SCHEDULER_CLASSES: Dict[str, Type["VARAccelScheduler"]] = {}


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
    #: The sampling arguments its calibration used (``calibration.json``'s ``sampling``) when it was loaded from a
    #: folder written by ``var-accel calibrate`` (or a packaged calibrated preset), else ``None``: a pipeline call that
    #: samples otherwise warns that the calibration's measurements do not apply to it.
    calibration_sampling: Optional[Dict[str, Any]] = None
    #: The path of that record (``None`` with it).
    calibration_record: Optional[str] = None

    def __init_subclass__(cls, method: Optional[str] = None, **kwargs):
        """Record the class by name (configurations name it) and, with ``method="name"`` on the class line, register
        it as an acceleration method (:mod:`.registry`): ``class LazyVARScheduler(VARAccelScheduler, method="lazyvar")``."""
        super().__init_subclass__(**kwargs)
        SCHEDULER_CLASSES[cls.__name__] = cls
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
            raise ValueError(
                f"{cls.__name__} has no preset for {model_family!r}; presets exist for {sorted(cls.presets)}"
            )
        cls._check_overrides(overrides)
        return cls(**{**cls.presets[model_family], **overrides})

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path=None, subfolder: Optional[str] = None, return_unused_kwargs=False, **kwargs
    ):
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
        from .presets import (
            PRESET_CONFIG_NAME,
            available_presets,
            close_preset_names,
            preset_folder,
            presets_for_class,
            resolve_preset_reference,
        )

        hub_keys = {"cache_dir", "force_download", "proxies", "local_files_only", "token", "revision"}
        overrides = {k: v for k, v in kwargs.items() if k not in hub_keys}
        hub_kwargs = {k: v for k, v in kwargs.items() if k in hub_keys}
        preset = resolve_preset_reference(pretrained_model_name_or_path, subfolder)
        source = pretrained_model_name_or_path
        if preset is None and isinstance(source, (str, os.PathLike)):
            from ..files import resolve_interrupted_replace

            # a folder replaced as a whole (a calibration, a saved pipeline) by a process killed while swapping it in
            resolve_interrupted_replace(os.path.join(os.fspath(source), subfolder) if subfolder else source)
        if preset is not None:
            source, subfolder = str(preset_folder(preset)), None
        try:
            config = cls.load_config(source, subfolder=subfolder, **hub_kwargs)
        except OSError as err:
            if preset is None and isinstance(source, str) and not os.path.exists(source) and source.count("/") <= 1:
                presets = available_presets()
                hint = close_preset_names(source)
                raise OSError(
                    f"{err}\n({source!r} is not a packaged acceleration preset either{hint}; available presets: "
                    f"{presets})"
                ) from err
            raise
        where = (
            os.path.join(os.fspath(source), subfolder or "", PRESET_CONFIG_NAME)
            if isinstance(source, (str, os.PathLike)) and os.path.isdir(source)
            else (preset or pretrained_model_name_or_path)
        )
        stored = config.get("_class_name")
        if stored is None and cls is VARAccelScheduler:
            raise ValueError(
                f"{where} has no _class_name: VARAccelScheduler.from_pretrained cannot tell which scheduler it "
                f"holds; allowed: {sorted(SCHEDULER_CLASSES)}"
            )
        if stored is not None and stored not in SCHEDULER_CLASSES:
            raise ValueError(
                f"{where} names the scheduler class {stored!r}, which does not exist"
                f"{_close_class_names(str(stored))}; allowed: {sorted(SCHEDULER_CLASSES)}"
            )
        target = cls
        if stored and stored != cls.__name__:
            if cls is not VARAccelScheduler and not issubclass(SCHEDULER_CLASSES.get(stored, object), cls):
                name = preset or pretrained_model_name_or_path
                own = presets_for_class(cls.__name__)
                raise ValueError(
                    f"{name} holds a {stored} configuration, not a {cls.__name__}: load it with {stored}.from_pretrained "
                    f"or VARAccelScheduler.from_pretrained" + (f"; {cls.__name__} presets: {own}" if own else "")
                )
            target = SCHEDULER_CLASSES.get(stored, cls)
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
        if (
            not overrides and isinstance(where, str) and os.path.isfile(where)
        ):  # overridden, it is no longer calibrated
            scheduler.calibration_sampling = read_calibration_sampling(os.path.dirname(where))
            if scheduler.calibration_sampling is not None:
                scheduler.calibration_record = os.path.join(os.path.dirname(where), CALIBRATION_RECORD_NAME)
        return (scheduler, {}) if return_unused_kwargs else scheduler

    @classmethod
    def from_config(cls, config=None, return_unused_kwargs=False, **kwargs):
        """``ConfigMixin.from_config``, strict: a ``_class_name`` that names no scheduler class and a setting the class
        does not have are errors (diffusers would only log them and build a scheduler without them)."""
        if config is not None:
            config = dict(config)
            stored = config.get("_class_name")
            if stored is not None and stored not in SCHEDULER_CLASSES:
                raise ValueError(
                    f"the configuration names the scheduler class {stored!r}, which does not exist"
                    f"{_close_class_names(str(stored))}; allowed: {sorted(SCHEDULER_CLASSES)}"
                )
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
        (:func:`~diffusers_var_accel.lab.calibration.calibrate` then refuses the method, naming the ones that have one).

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
        raise NotImplementedError(
            f"{cls.__name__} has no calibration settings as a composition member (override "
            f"{cls.__name__}.composition_calibration_grid)"
        )

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

    @property
    def workspace_key(self) -> Tuple[str, str]:
        """This scheduler's decisions identified by value: its class and its configuration (:meth:`to_dict`). Two
        schedulers with equal keys route every pass alike, so a pass runner that captures passes lets them share
        their graphs (``pipe(..., acceleration="lazyvar")`` builds a new scheduler per call)."""
        return (type(self).__qualname__, json.dumps(self.to_dict(), sort_keys=True))

    # -- extension points ---------------------------------------------------------------------------------------------
    def plan_scales(
        self, scale_schedule: Sequence[Tuple[int, ...]], model: Optional[ModelInfo] = None
    ) -> List[ScalePlan]:
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

    def route_pass_within(
        self, state: "NextScaleState", plan: ScalePlan, selection: TokenSelection
    ) -> Optional[PassRoutes]:
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

    #: What :meth:`capturable_variant` leaves out, in a few words (for the tables that show a variant's numbers).
    capturable_variant_note: str = "the method as configured (its passes draw nothing)"

    def capturable_variant(self) -> "VARAccelScheduler":
        """This scheduler without what keeps its passes from being captured or compiled (the random numbers drawn
        inside them): itself when its passes draw nothing. A method that draws inside passes overrides it (and
        :attr:`capturable_variant_note`) or raises."""
        if self.draws_inside_passes:
            raise ValueError(f"{type(self).__name__} draws inside its passes and has no capturable variant")
        return self

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


def _close_class_names(name: str) -> str:
    from .presets import close_names

    return close_names(name, sorted(SCHEDULER_CLASSES))


def scheduler_from_dict(config: Dict[str, Any]) -> VARAccelScheduler:
    """Rebuild a scheduler from ``to_dict()`` output (``_class_name`` + settings)."""
    name = config.get("_class_name")
    if name not in SCHEDULER_CLASSES:
        raise ValueError(
            f"unknown acceleration scheduler {name!r}{_close_class_names(str(name))}; known: {sorted(SCHEDULER_CLASSES)}"
        )
    cls = SCHEDULER_CLASSES[name]
    settings = {k: v for k, v in config.items() if not k.startswith("_")}
    cls._check_overrides(settings)
    return cls(**settings)


#: The record ``var-accel calibrate`` writes beside ``acceleration_config.json``.
CALIBRATION_RECORD_NAME = "calibration.json"


def read_calibration_sampling(folder: "os.PathLike | str") -> Optional[Dict[str, Any]]:
    """The ``sampling`` of the calibration record in ``folder``, or ``None`` when it holds none.

    A record that is not JSON, or whose ``sampling`` is not an object of call arguments, is an error naming the file
    (a corrupted folder fails at load time, not at the first call).
    """
    import json

    path = os.path.join(os.fspath(folder), CALIBRATION_RECORD_NAME)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable calibration record ({err})") from None
    sampling = record.get("sampling") if isinstance(record, dict) else None
    if not isinstance(sampling, dict) or not all(isinstance(k, str) for k in sampling):
        raise ValueError(
            f"{path}: 'sampling' must be an object of the call's sampling arguments (what var-accel calibrate "
            f"writes), got {sampling!r}"
        )
    return dict(sampling)
