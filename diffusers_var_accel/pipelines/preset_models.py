"""Which packaged presets a pipeline uses: its own model's, when its configuration names a model with presets of its
own, else its family's.

The papers' presets (``infinity-2b/<method>``, ``hart-0.7b/<method>``) are the family defaults. A model with presets of
its own (the embedded model: ``presets/embedded/<method>``) says so in its pipeline configuration: the
``preset_model`` entry of ``model_index.json``, an argument of the pipeline's ``__init__``. ``save_pretrained`` writes
it and ``from_pretrained`` reads it back, so a saved copy of the embedded model still uses ``embedded/<method>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from ..schedulers.presets import FAMILY_PRESET_MODELS


def packaged_model_presets() -> Dict[Path, str]:
    """``{packaged model folder: preset model key}``: the embedded model uses ``presets/embedded/<method>``."""
    from ..embedded import EMBEDDED_MODEL_PATH, EMBEDDED_PRESET_MODEL

    return {EMBEDDED_MODEL_PATH.resolve(): EMBEDDED_PRESET_MODEL}


def fitting_preset_models(model_family: str) -> List[str]:
    """The preset models whose packaged presets are for ``model_family`` (``["embedded", "infinity-2b"]``)."""
    from ..schedulers.specs import family_presets

    return sorted({name.split("/")[0] for name in family_presets(model_family)})


def check_preset_model(value: Any, model_family: str) -> None:
    """``preset_model`` (a pipeline's configuration entry) must be ``None`` (the family's presets) or a preset model
    with packaged presets for ``model_family``."""
    if value is None:
        return
    fitting = fitting_preset_models(model_family)
    if not isinstance(value, str) or value not in fitting:
        raise ValueError(
            f"preset_model={value!r} does not fit this {model_family} model: the preset models with presets for "
            f"{model_family!r} are {fitting} (None: the family's, {FAMILY_PRESET_MODELS.get(model_family)!r})"
        )


def preset_model_of(pipe) -> str:
    """The preset model of ``pipe``: its configuration's ``preset_model`` when set, else its family's
    (:data:`~diffusers_var_accel.schedulers.presets.FAMILY_PRESET_MODELS`)."""
    own: Optional[str] = getattr(getattr(pipe, "config", None), "preset_model", None)
    if own is not None:
        return own
    return FAMILY_PRESET_MODELS[pipe.model_family]
