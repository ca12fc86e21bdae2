"""From names to schedulers: a method name, a composition ``"a+b"``, a packaged preset or a spec string with
overrides (the command line's, the benchmark's and ``pipe.enable_acceleration(name)``'s)."""

from __future__ import annotations

import difflib
import os
from typing import Any, Dict, List, Optional

from .composition import ComposedScheduler
from .registry import BASELINE, COMPOSE_SEPARATOR, METHODS, get_method, method_names
from .scheduling_var_base import VARAccelScheduler


def load_acceleration(
    spec: Optional[str], model_family: str, preset_model: Optional[str] = None
) -> Optional[VARAccelScheduler]:
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

    from .presets import is_preset_name

    if spec is None or spec.lower() in (BASELINE, "none"):
        return None
    if os.path.isdir(spec) or spec.endswith(".json"):
        path = (os.path.dirname(spec) or ".") if spec.endswith(".json") else spec
        return VARAccelScheduler.from_pretrained(path)
    name, _, overrides_text = spec.partition(":")
    if "/" not in name and COMPOSE_SEPARATOR in name:
        if overrides_text:
            raise ValueError(
                f"{spec!r}: a composition ({name!r}) takes no ':key=value' overrides (they would be "
                "ambiguous between its members); save the composed scheduler's configuration and pass its "
                "folder, or use pipe.enable_acceleration(name, <method>={...})"
            )
        return build_acceleration(name.lower(), model_family, preset_model=preset_model)
    by_method = {method: METHODS[method] for method in method_names()}
    if "/" in name:
        if not is_preset_name(name):
            raise ValueError(
                f"unknown acceleration preset {name!r}; presets for this {model_family} model: "
                f"{family_presets(model_family)} (a Hub repo "
                "loads with VARAccelScheduler.from_pretrained(repo_id, subfolder=...))"
            )
    elif name.lower() not in by_method:
        close = difflib.get_close_matches(name.lower(), list(by_method) + [BASELINE], n=1, cutoff=0.6)
        did_you_mean = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"unknown acceleration {name!r}{did_you_mean}; known: {list(by_method) + [BASELINE]}, methods joined "
            f"with {COMPOSE_SEPARATOR!r} ('lazyvar{COMPOSE_SEPARATOR}arvar'), a preset name for this "
            f"{model_family} model ({', '.join(family_presets(model_family))}) or a config folder/JSON file"
        )
    overrides = {}
    for item in split_top_level(overrides_text):
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
            raise ValueError(
                f"the preset {name!r} is for model family {scheduler.model_family!r}, not {model_family!r}; "
                f"presets for {model_family!r}: {family_presets(model_family)}"
            )
        return scheduler
    own = own_preset_name(preset_model, model_family, name.lower())
    if own is not None:
        return preset_scheduler(by_method[name.lower()], own, model_family, overrides)
    return by_method[name.lower()].from_preset(model_family, **overrides)


def own_preset_name(preset_model: Optional[str], model_family: str, method: str) -> Optional[str]:
    """``"<preset_model>/<method>"`` when ``preset_model`` is not the family's preset model and has a packaged preset
    of ``method``, else ``None`` (the family's preset applies)."""
    from .presets import FAMILY_PRESET_MODELS, is_preset_name

    if (
        preset_model is None
        or model_family not in FAMILY_PRESET_MODELS
        or preset_model == FAMILY_PRESET_MODELS[model_family]
    ):
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


def method_preset(
    cls, method: str, model_family: str, preset_model: Optional[str] = None, overrides: Optional[Dict[str, Any]] = None
) -> VARAccelScheduler:
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
            stored = {
                k: v for k, v in load_preset_config(name).items() if not k.startswith("_") and k != "model_family"
            }
        except ValueError:
            stored = {}
        given = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
        holds = ", ".join(f"{k}={v!r}" for k, v in stored.items())
        raise ValueError(f"{method} with {given} over the preset {name} ({holds}): {err}") from None


def build_acceleration(
    name: str, model_family: str, preset_model: Optional[str] = None, **overrides: Any
) -> VARAccelScheduler:
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
        raise ValueError(
            f"an acceleration name must be a non-empty string, got {name!r}; known methods: {method_names()}"
        )
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
            raise ValueError(
                f"{name!r} is a composition: its overrides are per member, as <method>={{setting: value}} "
                f"(e.g. {names[0]}={{...}}); {key!r} names none of its members {names}"
            )
        if not isinstance(value, dict):
            raise ValueError(
                f"the overrides of member {key!r} of {name!r} must be a dict of its settings, got "
                f"{type(value).__name__}"
            )
    members = [preset(n, cls, overrides.get(n, {})) for n, cls in zip(names, classes)]
    return ComposedScheduler(members, model_family=model_family)


def family_presets(model_family: str) -> List[str]:
    """The packaged presets that fit a model of ``model_family`` (those for another family are left out)."""
    from .presets import available_presets

    return [name for name in available_presets() if _preset_family(name) in (None, model_family)]


def _preset_family(name: str) -> Optional[str]:
    from .presets import load_preset_config

    return load_preset_config(name).get("model_family")


def split_top_level(text: str) -> List[str]:
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
    for part in (p.strip() for p in split_top_level(text)):
        if not part:
            continue
        head = part.split("=", 1)[0]
        if "=" in part and ":" not in head and specs:
            specs[-1] += "," + part
        else:
            specs.append(part)
    return specs
