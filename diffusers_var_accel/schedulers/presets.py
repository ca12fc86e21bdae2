"""The packaged acceleration presets: JSON files shipped inside the package, loaded by name.

A preset is the published setting of one method for one model, named ``"<model>/<method>"`` (``"infinity-2b/lazyvar"``,
``"hart-0.7b/fastvar"``). Each is the file ``diffusers_var_accel/presets/<model>/<method>/acceleration_config.json``,
exactly what ``scheduler.save_pretrained(<folder>/<method>)`` writes, so the package's ``presets/<model>/`` folder has
the layout of a Hub repo of presets (``from_pretrained(repo_id, subfolder="lazyvar")``).

**The JSON files are the one source of truth.** The ``presets`` attribute of each method's scheduler class
(``{model_family: constructor kwargs}``, used by ``from_preset(family)`` and ``pipe.enable_<method>()``) is a
:class:`PackagedPresets` mapping that reads them: a family's presets are those of the model named in
:data:`FAMILY_PRESET_MODELS`. Changing a preset means editing its JSON file.

Models: ``infinity-2b`` presets are tuned for Infinity-2B; their scale indices count from the end of the schedule, so
they also run on other Infinity models (other sizes, the packaged embedded model). ``hart-0.7b`` presets are tuned for
HART-0.7B.

Examples:
    ```py
    >>> from diffusers_var_accel.schedulers.presets import available_presets
    >>> from diffusers_var_accel import LazyVARScheduler

    >>> available_presets(method="lazyvar")
    ['hart-0.7b/lazyvar', 'infinity-2b/lazyvar']
    >>> lazyvar = LazyVARScheduler.from_pretrained("infinity-2b/lazyvar", keep_ratios=[0.4, 0.2, 0.1, 0.02])
    ```
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

from ..families import MODEL_FAMILIES

#: The folder of the packaged preset files (``<model>/<method>/acceleration_config.json``).
PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets"

#: The file name of a scheduler configuration (``VARAccelScheduler.config_name``).
PRESET_CONFIG_NAME = "acceleration_config.json"


class _FamilyPresetModels(Mapping):
    """``{model_family: preset model}``, read live from the registry of model families
    (:data:`diffusers_var_accel.families.MODEL_FAMILIES`)."""

    def __getitem__(self, family: str) -> str:
        return MODEL_FAMILIES[family].preset_model

    def __iter__(self) -> Iterator[str]:
        return iter(list(MODEL_FAMILIES))

    def __len__(self) -> int:
        return len(MODEL_FAMILIES)

    def __repr__(self) -> str:
        return repr(dict(self))


#: Per model family, the model whose presets ``Scheduler.from_preset(family)`` and ``pipe.enable_<method>()`` use
#: (``{"infinity": "infinity-2b", "hart": "hart-0.7b"}``): each registered family's ``preset_model``.
FAMILY_PRESET_MODELS: Mapping = _FamilyPresetModels()


def close_names(name: str, candidates: Sequence[str]) -> str:
    """``" (did you mean 'x'?)"`` for the candidate closest to ``name`` (difflib), else ``""``."""
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.7)
    return f" (did you mean {' or '.join(repr(m) for m in matches)}?)" if matches else ""


def close_preset_names(name: str) -> str:
    """``" (did you mean 'infinity-2b/lazyvar'?)"`` for a name close to a packaged preset, or to a method's name (then
    every preset of that method is suggested), else ``""``."""
    presets = available_presets()
    hint = close_names(name, presets)
    if hint:
        return hint
    methods = difflib.get_close_matches(name, sorted({p.split("/")[1] for p in presets}), n=1, cutoff=0.7)
    if methods:
        return f" (did you mean {' or '.join(repr(p) for p in presets if p.split('/')[1] == methods[0])}?)"
    return ""


def available_presets(method: Optional[str] = None, model: Optional[str] = None) -> List[str]:
    """The names (``"<model>/<method>"``) of the packaged presets, sorted; optionally of one method or one model."""
    if not PRESETS_DIR.is_dir():
        return []
    names = [f"{path.parent.parent.name}/{path.parent.name}" for path in PRESETS_DIR.glob(f"*/*/{PRESET_CONFIG_NAME}")]
    return sorted(
        n
        for n in names
        if (method is None or n.split("/")[1] == method) and (model is None or n.split("/")[0] == model)
    )


def preset_models() -> List[str]:
    """The model keys that have packaged presets (``["hart-0.7b", "infinity-2b"]``)."""
    return sorted({name.split("/")[0] for name in available_presets()})


def is_preset_name(name: Any) -> bool:
    """Whether ``name`` is the name of a packaged preset."""
    return isinstance(name, str) and name in available_presets()


def preset_folder(name: str) -> Path:
    """The folder holding the packaged preset ``name`` (its ``acceleration_config.json``).

    Raises:
        ValueError: no packaged preset has that name; the message lists the available ones.
    """
    if not is_preset_name(name):
        hint = close_preset_names(name) if isinstance(name, str) else ""
        raise ValueError(
            f"unknown acceleration preset {name!r}{hint}; available presets: {available_presets() or _missing_files_note()}"
        )
    model, method = name.split("/")
    return PRESETS_DIR / model / method


def load_preset_config(name: str) -> Dict[str, Any]:
    """The stored configuration of the packaged preset ``name`` (``_class_name`` and the settings)."""
    path = preset_folder(name) / PRESET_CONFIG_NAME
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"the packaged preset file {path} is not valid JSON: {err}") from None


def presets_for_class(class_name: str) -> List[str]:
    """The packaged presets stored for the scheduler class ``class_name`` (e.g. ``"LazyVARScheduler"``)."""
    return [name for name in available_presets() if load_preset_config(name).get("_class_name") == class_name]


def resolve_preset_reference(name_or_path: Any, subfolder: Optional[str] = None) -> Optional[str]:
    """The packaged preset that ``from_pretrained(name_or_path, subfolder=...)`` refers to, or ``None`` (a path or Hub id).

    ``"infinity-2b/lazyvar"`` and ``("infinity-2b", subfolder="lazyvar")`` name the same preset. An existing local path
    is never a preset name.

    Raises:
        ValueError: the reference starts with a packaged model key (``"infinity-2b/..."``) but names no packaged preset;
            the message lists the available ones.
    """
    if not isinstance(name_or_path, str) or os.path.exists(name_or_path):
        return None
    if subfolder is None:
        candidate, model = name_or_path, name_or_path.split("/")[0]
        is_preset_like = name_or_path.count("/") == 1
    else:
        candidate, model = f"{name_or_path}/{subfolder}", name_or_path
        is_preset_like = "/" not in name_or_path and "/" not in subfolder.strip("/")
        candidate = candidate.rstrip("/")
    if is_preset_name(candidate):
        return candidate
    if is_preset_like and model in set(preset_models()) | set(FAMILY_PRESET_MODELS.values()):
        raise ValueError(
            f"unknown acceleration preset {candidate!r}{close_preset_names(candidate)}; "
            f"available presets: {available_presets() or _missing_files_note()}"
        )
    return None


def preset_constructor_kwargs(config: Dict[str, Any]) -> Dict[str, Any]:
    """The constructor arguments of a stored configuration: private ``_`` keys dropped, lists as tuples."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if not k.startswith("_")}


class PackagedPresets(Mapping):
    """``{model_family: constructor kwargs}`` of one method, read from the packaged JSON files on first use.

    The ``presets`` class attribute of the method schedulers: ``presets = PackagedPresets("lazyvar")``. The family's
    entry is the preset of the model :data:`FAMILY_PRESET_MODELS` names (``"infinity"`` -> ``infinity-2b/lazyvar``).
    Lists in the files become tuples (the constructors' defaults are tuples). Every file must store the class that owns
    the attribute (checked when read).

    Args:
        method (`str`): the method's folder name in the presets (``"fastvar"``, ``"lazyvar"``, ...).
    """

    def __init__(self, method: str):
        self.method = method
        self.owner_name: Optional[str] = None
        self._by_family: Optional[Dict[str, Dict[str, Any]]] = None

    def __set_name__(self, owner, name):
        self.owner_name = owner.__name__

    def _load(self) -> Dict[str, Dict[str, Any]]:
        if self._by_family is None:
            if not PRESETS_DIR.is_dir():
                raise FileNotFoundError(_missing_files_note())
            by_family = {}
            for family, model in FAMILY_PRESET_MODELS.items():
                name = f"{model}/{self.method}"
                if not is_preset_name(name):
                    continue
                config = load_preset_config(name)
                stored = config.get("_class_name")
                if self.owner_name is not None and stored != self.owner_name:
                    raise ValueError(
                        f"the packaged preset {name!r} stores a {stored} configuration, not a {self.owner_name}"
                    )
                if config.get("model_family") != family:
                    raise ValueError(
                        f"the packaged preset {name!r} has model_family {config.get('model_family')!r}, not {family!r}"
                    )
                by_family[family] = preset_constructor_kwargs(config)
            self._by_family = by_family
        return self._by_family

    def names(self) -> Dict[str, str]:
        """``{model_family: preset name}`` of the entries."""
        return {family: f"{FAMILY_PRESET_MODELS[family]}/{self.method}" for family in self._load()}

    def __getitem__(self, family: str) -> Dict[str, Any]:
        return dict(self._load()[family])

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())

    def __repr__(self) -> str:
        return f"PackagedPresets({self.method!r}: {self.names() if PRESETS_DIR.is_dir() else 'files missing'})"


def _missing_files_note() -> str:
    return (
        f"the packaged preset files are missing ({PRESETS_DIR} has no */*/{PRESET_CONFIG_NAME}); the installation "
        "lacks the package data 'presets/*/*/*.json': reinstall diffusers-var-accel"
    )
