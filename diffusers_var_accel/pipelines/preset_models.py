"""Which packaged presets a pipeline uses: its own model's, when it was loaded from a packaged model folder that has
them, else its family's.

The papers' presets (``infinity-2b/<method>``, ``hart-0.7b/<method>``) are the family defaults. A packaged model with
presets of its own is listed in :func:`packaged_model_presets` by its folder; a pipeline loaded from that folder
(``pipe.name_or_path``, which ``from_pretrained`` records) uses them. Recognition is by the folder, not by guessing from
the model's config: a copy saved elsewhere uses the family's presets (name the preset explicitly there, e.g.
``--accel embedded/lazyvar``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict

from ..schedulers.presets import FAMILY_PRESET_MODELS


def packaged_model_presets() -> Dict[Path, str]:
    """``{packaged model folder: preset model key}``: the embedded model uses ``presets/embedded/<method>``."""
    from ..embedded import EMBEDDED_MODEL_PATH, EMBEDDED_PRESET_MODEL

    return {EMBEDDED_MODEL_PATH.resolve(): EMBEDDED_PRESET_MODEL}


def preset_model_of(pipe) -> str:
    """The preset model of ``pipe``: its folder's own (:func:`packaged_model_presets`), else its family's
    (:data:`~diffusers_var_accel.schedulers.presets.FAMILY_PRESET_MODELS`)."""
    name = getattr(getattr(pipe, "config", None), "_name_or_path", None)
    if isinstance(name, (str, os.PathLike)) and str(name):
        try:
            own = packaged_model_presets().get(Path(name).resolve())
        except OSError:
            own = None
        if own is not None:
            return own
    return FAMILY_PRESET_MODELS[pipe.model_family]
