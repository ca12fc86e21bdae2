"""The registry of model families: what the library needs to know about a family, by name.

Every list of families in the library derives from :data:`MODEL_FAMILIES`: the scheduler's ``model_family`` check,
the packaged presets each family uses, the pipeline classes ``model_index.json`` may name, the loop's "no guidance"
value. No module outside ``models/`` and ``pipelines/<family>/`` names a family: a new family registers one
:class:`ModelFamily` here and keeps its own code in its package. What the lab (command line, benchmarks, FLOP and
launch counters, model cards) needs of a family is its own record, ``diffusers_var_accel.lab.families``.

The registry sits below every other module (it imports nothing of the package): the pipeline class is named as
``"module:attribute"`` and imported on first use, so the schedulers can read the family names without importing the
pipelines.

Examples:
    ```py
    >>> from diffusers_var_accel.families import MODEL_FAMILIES, get_model_family
    >>> sorted(MODEL_FAMILIES)
    ['hart', 'infinity']
    >>> get_model_family("hart").pipeline_class().__name__
    'HARTPipeline'
    ```
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Dict, List


@dataclass(frozen=True)
class ModelFamily:
    """One model family the library runs.

    Args:
        name (`str`): the family's name (``pipeline.model_family``, a scheduler's ``model_family``).
        preset_model (`str`): the model whose packaged presets the family uses (``presets/<preset_model>/<method>``).
        pipeline (`str`): the pipeline class, ``"module:Class"``.
        no_guidance (`float`): the family's guidance value that means "no guidance" (the loop's guidance scales are in
            the family's own convention: Infinity's ``guidance_scale`` 1, HART's guidance weight 0). A call whose
            scales all equal it runs no unconditional rows.
    """

    name: str
    preset_model: str
    pipeline: str
    no_guidance: float

    @property
    def pipeline_class_name(self) -> str:
        """The pipeline class's name (``model_index.json``'s ``_class_name``), without importing it."""
        return self.pipeline.partition(":")[2]

    def pipeline_class(self) -> type:
        """The family's pipeline class (imported on first use)."""
        return _resolve(self.pipeline)


def _resolve(reference: str) -> Any:
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


#: ``{name: ModelFamily}`` of the registered families, in registration order.
MODEL_FAMILIES: Dict[str, ModelFamily] = {}


def register_model_family(family: ModelFamily) -> ModelFamily:
    """Add ``family`` to :data:`MODEL_FAMILIES` (a name may be registered once)."""
    if family.name in MODEL_FAMILIES:
        raise ValueError(f"model family {family.name!r} is already registered ({MODEL_FAMILIES[family.name]})")
    MODEL_FAMILIES[family.name] = family
    return family


def unregister_model_family(name: str) -> None:
    """Remove a family from :data:`MODEL_FAMILIES` (for tests and plugins)."""
    get_model_family(name)
    del MODEL_FAMILIES[name]


def model_family_names() -> List[str]:
    """The registered family names, sorted."""
    return sorted(MODEL_FAMILIES)


def get_model_family(name: str) -> ModelFamily:
    """The registered family ``name``, or a ``ValueError`` listing the known ones."""
    if name not in MODEL_FAMILIES:
        raise ValueError(f"unknown model family {name!r}; known: {model_family_names()}")
    return MODEL_FAMILIES[name]


register_model_family(
    ModelFamily(
        "infinity",
        preset_model="infinity-2b",
        pipeline="diffusers_var_accel.pipelines.infinity.pipeline_infinity:InfinityPipeline",
        no_guidance=1.0,
    )
)
register_model_family(
    ModelFamily(
        "hart",
        preset_model="hart-0.7b",
        pipeline="diffusers_var_accel.pipelines.hart.pipeline_hart:HARTPipeline",
        no_guidance=0.0,
    )
)
