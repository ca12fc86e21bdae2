"""Attaching acceleration schedulers to a pipeline: per instance, reversible, or for one call.

Every registered method (:mod:`diffusers_var_accel.schedulers.registry`), the library's own and a plug-in's alike,
gets an ``enable_<method>()`` shortcut on :class:`VARAccelerationMixin` when it registers (``enable_lazyvar`` ...),
removed when it is unregistered; ``enable_acceleration(name)`` takes any registered method.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, Dict, Optional, Tuple, Type, Union

import torch

from ..schedulers.registry import COMPOSE_SEPARATOR, add_registry_listener, method_names
from ..schedulers.scheduling_var_base import VARAccelScheduler
from ..schedulers.specs import build_acceleration, method_preset


class VARAccelerationMixin:
    """``enable_acceleration`` / ``disable_acceleration`` and the per-method shortcuts of the VAR pipelines.

    The scheduler is the optional pipeline component ``acceleration``: ``save_pretrained`` stores it in
    ``acceleration/acceleration_config.json`` and ``from_pretrained`` brings it back. Nothing on the model changes when
    a scheduler is attached: the loop consults it at every call, so disabling is exact.
    """

    #: The model family of the pipeline (``"infinity"``, ``"hart"``): selects presets and is checked on attach.
    model_family: str = ""

    @property
    def preset_model(self) -> str:
        """The model whose packaged presets ``enable_<method>()`` and method names use: the pipeline's ``preset_model``
        configuration entry, which ``save_pretrained`` keeps (the embedded model: ``"embedded"``), else its family's
        (``"infinity-2b"``, ``"hart-0.7b"``). See :func:`~diffusers_var_accel.pipelines.preset_models.preset_model_of`."""
        from .preset_models import preset_model_of

        return preset_model_of(self)

    def acceleration_summary(self) -> Dict[str, Any]:
        """What the last call's passes computed, as the executor carried them out (recorded during the call, not
        derived from the scheduler's settings).

        Returns:
            `dict`: ``passes``, one dict per pass in order (``scales`` and their ``scale_tokens``, ``input_tokens``
            the pass fed the blocks (scale 0: the start tokens), ``grouped``,
            ``skipped``, ``rows_run`` of ``rows`` and ``unconditional_ran``, ``tokens_computed_per_layer`` per
            sublayer, ``fewest_tokens_computed``, ``layers_per_token``, ``recorded``: ``False`` for a pass replayed
            from a captured graph or compiled, whose per-layer counts are not taken); ``token_layers`` (tokens per row
            times the layers they ran, self-attention, summed over passes) and ``baseline_token_layers`` (every token
            of every scale through every layer); ``kv_positions`` (positions each layer's KV cache kept) and
            ``kv_bytes`` (the cache's allocated bytes). FLOPs are counted by the lab's meter:
            ``var-accel generate --summary`` prints them beside this.

        Raises:
            RuntimeError: the pipeline has not been called yet.
        """
        work = getattr(self, "_last_call_work", None)
        if work is None:
            raise RuntimeError("acceleration_summary() describes the last call of the pipeline; call it first")
        passes = [p.as_dict() for p in work.passes]
        num_layers = work.passes[0].num_layers if work.passes else 0
        return {
            "passes": passes,
            "token_layers": sum(sum(p["tokens_computed_per_layer"]["self_attn"]) for p in passes),
            "baseline_token_layers": sum(p["input_tokens"] for p in passes) * num_layers,
            "kv_positions": list(work.kv_positions),
            "kv_bytes": work.kv_bytes,
        }

    def enable_acceleration(self, scheduler: Union[VARAccelScheduler, str], **overrides: Any) -> VARAccelScheduler:
        """Accelerate every following call with ``scheduler`` (replacing any attached one).

        Args:
            scheduler (`VARAccelScheduler` or `str`): a scheduler, a registered method's name (``"lazyvar"``: its preset
                for this pipeline's model, ``pipe.preset_model``), several names joined with ``"+"``
                (``"lazyvar+arvar"``: a [`ComposedScheduler`] of the presets, in that order), or one of this model's
                packaged presets named in full (``"embedded/lazyvar"``; another model's is refused: attach it as a
                scheduler, ``VARAccelScheduler.from_pretrained("infinity-2b/lazyvar")``, to compare on purpose).
            **overrides (`Any`): only with a name. For one method, its settings replacing the preset's
                (``enable_acceleration("lazyvar", keep_ratios=(0.4, 0.2, 0.1, 0.02))``); for a composition, one keyword
                per member holding that member's settings (``enable_acceleration("lazyvar+arvar",
                arvar={"prune_ratios": (0.5,)})``): a plain setting would be ambiguous between members and is refused.

        Returns:
            [`VARAccelScheduler`]: the attached scheduler (``disable_acceleration()`` detaches it).

        Raises:
            ValueError: an unknown method name (the message lists the registered ones), another model's preset (the
                message names this model and the presets that fit it), overrides given with a
                scheduler instance, a bad override, or a scheduler built for another model family.
        """
        if isinstance(scheduler, str):
            scheduler = self._named_acceleration(scheduler, overrides)
        elif overrides:
            raise ValueError(
                f"overrides {sorted(overrides)} apply to a method name (enable_acceleration('lazyvar', ...)); "
                f"a {type(scheduler).__name__} instance is attached as it is: configure it when building it"
            )
        if not isinstance(scheduler, VARAccelScheduler):
            raise ValueError(
                f"acceleration must be a VARAccelScheduler or a method name ({method_names()}, joined with "
                f"{COMPOSE_SEPARATOR!r} to compose), got {type(scheduler).__name__}"
            )
        scheduler.check_model_family(self.model_family)
        self.register_modules(acceleration=scheduler)
        return scheduler

    #: The call arguments that choose how tokens are sampled (each pipeline names its own). A calibration records
    #: them (``calibration.json``'s ``sampling``), resolved to the call's defaults where it did not pass them.
    sampling_arguments: Tuple[str, ...] = ()

    def _warn_if_sampling_differs_from_calibration(
        self, scheduler: Optional[VARAccelScheduler], call_sampling: Dict[str, Any]
    ) -> None:
        """Warn when a scheduler loaded from a calibration (or a member of a composition that was) is used with other
        sampling arguments than the calibration measured it with: its recorded fidelity and the choice itself were
        made under that sampling, not this call's."""
        if scheduler is None:
            return
        for member in (scheduler, *getattr(scheduler, "members", ())):
            recorded = member.calibration_sampling
            if not recorded:
                continue
            differ = {
                name: (value, call_sampling[name])
                for name, value in recorded.items()
                if name in call_sampling and not _same_argument(call_sampling[name], value)
            }
            if differ:
                calibrated = ", ".join(f"{name}={value!r}" for name, (value, _) in differ.items())
                used = ", ".join(f"{name}={value!r}" for name, (_, value) in differ.items())
                warnings.warn(
                    f"{type(member).__name__} was calibrated with {calibrated} ({member.calibration_record}), but this "
                    f"call samples with {used}: the calibration's fidelity numbers and its choice of setting were "
                    f"measured under its own sampling, not this one (pass the recorded arguments to match it)",
                    UserWarning,
                    stacklevel=3,
                )

    def _named_acceleration(self, name: str, overrides: Dict[str, Any]) -> VARAccelScheduler:
        """The scheduler a name stands for on this pipeline: a method or a composition (the presets of
        ``self.preset_model``), or a packaged preset named in full, which must be one of this model's own: another
        model's preset is refused, naming this model and the presets that fit it."""
        if "/" not in name:
            return build_acceleration(name, self.model_family, preset_model=self.preset_model, **overrides)
        from ..schedulers.presets import available_presets

        fitting = available_presets(model=self.preset_model)
        if name not in fitting:
            raise ValueError(
                f"the preset {name!r} does not fit this pipeline's model {self.preset_model!r} ({self.model_family}); "
                f"the presets that fit it: {fitting} (or a method name: {method_names()}). To run another model's "
                f"preset on purpose, e.g. for a comparison, attach it as a scheduler: "
                f"pipe.enable_acceleration(VARAccelScheduler.from_pretrained({name!r}))"
            )
        return VARAccelScheduler.from_pretrained(name, **overrides)

    def disable_acceleration(self) -> None:
        """Detach the acceleration scheduler: calls run the baseline again, bit for bit."""
        self.register_modules(acceleration=None)

    def _acceleration_for_call(
        self, acceleration: Optional[Union[VARAccelScheduler, str]]
    ) -> Optional[VARAccelScheduler]:
        if acceleration is None:
            return getattr(self, "acceleration", None)
        if isinstance(acceleration, str):  # a method name or a composition of names, as in enable_acceleration
            acceleration = self._named_acceleration(acceleration, {})
        if not isinstance(acceleration, VARAccelScheduler):
            raise ValueError(
                f"acceleration must be a VARAccelScheduler or a method name ({method_names()}), got "
                f"{type(acceleration).__name__}"
            )
        acceleration.check_model_family(self.model_family)
        return acceleration

    def kv_cache_bytes(
        self,
        acceleration: Optional[Union[VARAccelScheduler, str]] = None,
        height: Optional[int] = None,
        width: Optional[int] = None,
        batch_size: int = 1,
        cfg: bool = True,
        kv_channels: Optional[int] = None,
        dtype: Optional[torch.dtype] = None,
        kv_cache_dtype: Optional[str] = "pipeline",
    ) -> int:
        """Bytes the self-attention KV cache of one call allocates (counted from the plan, nothing is run).

        The cache holds the positions of every pass that a later pass reads (not the last pass that runs, nor skipped
        scales), for ``2 * batch_size`` rows under CFG, in every layer.

        Args:
            acceleration (`VARAccelScheduler` or `str`, *optional*): the method (a name as in ``enable_acceleration``);
                `None`: the attached one, if any (the baseline without).
            height (`int`, *optional*), width (`int`, *optional*): the image size (default: the pipeline's).
            batch_size (`int`, defaults to 1): images per call.
            cfg (`bool`, defaults to `True`): whether the call runs the unconditional rows too.
            kv_channels (`int`, *optional*): key channels per position (heads x head dim); default the transformer's
                width. Give the real model's width to size a real model from a narrow stand-in.
            dtype (`torch.dtype`, *optional*): the attention dtype; default the transformer's weights' (half precision
                runs under autocast in that dtype).
            kv_cache_dtype (`str`, *optional*): the cache's storage form, ``"int8"`` (int8 keys and values with their
                scales) or ``None`` (the attention's dtype); default the pipeline's (``enable_kv_cache_quantization``).
        """
        from ..next_scale.loop import cached_positions, identity_plans, kv_cache_nbytes
        from ..next_scale.quantized_cache import check_kv_cache_dtype, quantized_kv_cache_nbytes
        from ..next_scale.plan import ModelInfo

        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        scheduler = self._acceleration_for_call(acceleration)
        schedule, num_start_tokens = self._kv_cache_layout(height, width)
        model = ModelInfo(len(self.transformer.blocks), self.model_family)
        plans = identity_plans(schedule) if scheduler is None else scheduler.plan_scales(schedule, model)
        positions = cached_positions(num_start_tokens, schedule, plans)
        config = self.transformer.config
        channels = kv_channels if kv_channels is not None else int(config.embed_dim)
        if dtype is None:
            dtype = next(self.transformer.parameters()).dtype
        rows = batch_size * (2 if cfg else 1)
        if kv_cache_dtype == "pipeline":
            kv_cache_dtype = getattr(self, "kv_cache_dtype", None)
        if check_kv_cache_dtype(kv_cache_dtype) is not None:
            heads = int(config.num_heads)
            if channels % heads:
                raise ValueError(f"kv_channels={channels} is not a multiple of the transformer's {heads} heads")
            return quantized_kv_cache_nbytes(
                len(self.transformer.blocks), rows, positions, heads, channels // heads, len(plans), dtype
            )
        return kv_cache_nbytes(len(self.transformer.blocks), rows, positions, channels, dtype)

    def _enable_preset(self, scheduler_cls, overrides, method: Optional[str] = None) -> VARAccelScheduler:
        if method is None:
            scheduler = scheduler_cls.from_preset(self.model_family, **overrides)
        else:
            scheduler = method_preset(scheduler_cls, method, self.model_family, self.preset_model, overrides)
        self.enable_acceleration(scheduler)
        return scheduler


def _method_summary(scheduler_class: type) -> str:
    """The first paragraph of the scheduler class's docstring, on one line."""
    doc = inspect.getdoc(scheduler_class) or scheduler_class.__name__
    return " ".join(doc.split("\n\n")[0].split())


def make_enable_shortcut(name: str, scheduler_class: Type[VARAccelScheduler]) -> Callable[..., VARAccelScheduler]:
    """``enable_<name>(self, **overrides)``: attach the method's preset for the pipeline's family (with overrides)."""

    def enable_method(self, **overrides: Any) -> VARAccelScheduler:
        return self._enable_preset(scheduler_class, overrides, name)

    cls_name = scheduler_class.__name__
    enable_method.__name__ = f"enable_{name}"
    enable_method.__qualname__ = f"VARAccelerationMixin.enable_{name}"
    enable_method.__module__ = __name__
    enable_method.__annotations__ = {"overrides": "Any", "return": "VARAccelScheduler"}
    enable_method.__doc__ = f"""Accelerate every following call with {cls_name}, in its preset for this model.

        {_method_summary(scheduler_class)}

        The same as ``enable_acceleration("{name}", **overrides)``; the preset is the pipeline's own packaged preset
        ``<pipe.preset_model>/{name}`` when it has one (the embedded model's calibrated ``embedded/{name}``), else
        ``{cls_name}.from_preset(family)`` (see [`{cls_name}`] for the settings and the presets).

        Args:
            **overrides (`Any`): settings of [`{cls_name}`] replacing the preset's; an unknown name raises a
                ``ValueError``.

        Returns:
            [`{cls_name}`]: the attached scheduler (``disable_acceleration()`` detaches it).

        Examples:
            ```py
            >>> import torch
            >>> from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

            >>> pipe = build_tiny_infinity_pipeline(seed=0)
            >>> scheduler = pipe.enable_{name}()
            >>> image = pipe("a red fox in the snow", height=512, width=512, generator=torch.Generator().manual_seed(0)).images[0]
            >>> pipe.disable_acceleration()
            ```
        """
    enable_method.registered_method = name
    return enable_method


def _follow_registry(name: str, scheduler_class: Optional[type]) -> None:
    """Keep ``VARAccelerationMixin.enable_<name>`` in step with the registry of methods: one generated shortcut per
    registered method, removed with it."""
    attribute = f"enable_{name}"
    existing = VARAccelerationMixin.__dict__.get(attribute)
    if scheduler_class is None:
        if getattr(existing, "registered_method", None) == name:
            delattr(VARAccelerationMixin, attribute)
        return
    if existing is not None and getattr(existing, "registered_method", None) != name:
        raise ValueError(f"method name {name!r} would replace the pipeline method {attribute}(); choose another name")
    setattr(VARAccelerationMixin, attribute, make_enable_shortcut(name, scheduler_class))


add_registry_listener(_follow_registry)


def _same_argument(given: Any, recorded: Any) -> bool:
    """A call argument equals its recorded value (JSON keeps lists where the call may pass tuples; 2 == 2.0)."""
    if isinstance(given, (list, tuple)) and isinstance(recorded, (list, tuple)):
        return len(given) == len(recorded) and all(_same_argument(g, r) for g, r in zip(given, recorded))
    if given is None or recorded is None:
        return given is recorded
    return given == recorded
