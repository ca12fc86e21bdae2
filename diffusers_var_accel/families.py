"""The registry of model families: ``name -> (preset model, pipeline class, FLOP counter)``.

Every list of families in the package derives from :data:`MODEL_FAMILIES`: the scheduler's ``model_family`` check,
the packaged presets each family uses, the Hub cards, the benchmark and the FLOP counter. The registry sits below
every other module (it imports nothing of the package): the pipeline class and the FLOP counter are named as
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
from typing import Any, Callable, Dict, List


@dataclass(frozen=True)
class ModelFamily:
    """One model family the library runs.

    Args:
        name (`str`): the family's name (``pipeline.model_family``, a scheduler's ``model_family``).
        preset_model (`str`): the model whose packaged presets the family uses (``presets/<preset_model>/<method>``).
        pipeline (`str`): the pipeline class, ``"module:Class"``.
        flop_counter (`str`): the FLOP counter of a named model of the family, ``"module:function"``, called as
            ``counter(model_name, **options)`` with its own keyword options, ``accel=spec`` among them (see
            :mod:`diffusers_var_accel.bench.flops`).
        flop_breakdown (`str`): the family's part of the FLOP meter, ``"module:attribute"`` naming a
            :class:`~diffusers_var_accel.pipelines.flop_meter.FamilyFlops` (its models, which step counts towards
            which reported part, its report); ``""``: the meter does not know the family.
        no_guidance (`float`): the family's guidance value that means "no guidance" (the loop's guidance scales are in
            the family's own convention: Infinity's ``guidance_scale`` 1, HART's guidance weight 0). A call whose
            scales all equal it runs no unconditional rows.
        title (`str`): the family's name in text (model cards).
        description (`str`): one Markdown phrase saying what the model is, with a link to its official code (cards).
    """

    name: str
    preset_model: str
    pipeline: str
    flop_counter: str
    no_guidance: float
    title: str = ""
    description: str = ""
    flop_breakdown: str = ""

    def pipeline_class(self) -> type:
        """The family's pipeline class (imported on first use)."""
        return _resolve(self.pipeline)

    def count_flops(self) -> Callable[..., Dict[str, Any]]:
        """The family's FLOP counter (imported on first use)."""
        return _resolve(self.flop_counter)

    def flop_breakdown_spec(self) -> Any:
        """The family's ``FamilyFlops`` (imported on first use)."""
        return _resolve(self.flop_breakdown)


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


register_model_family(ModelFamily("infinity", preset_model="infinity-2b",
                                  pipeline="diffusers_var_accel.pipelines.infinity.pipeline_infinity:InfinityPipeline",
                                  flop_counter="diffusers_var_accel.pipelines.infinity.flops:count_infinity_flops",
                                  flop_breakdown="diffusers_var_accel.pipelines.infinity.flops:INFINITY_FLOPS",
                                  no_guidance=1.0,
                                  title="Infinity",
                                  description="a bitwise visual autoregressive (next-scale prediction) text-to-image model "
                                              "([FoundationVision/Infinity](https://github.com/FoundationVision/Infinity))"))
register_model_family(ModelFamily("hart", preset_model="hart-0.7b",
                                  pipeline="diffusers_var_accel.pipelines.hart.pipeline_hart:HARTPipeline",
                                  flop_counter="diffusers_var_accel.pipelines.hart.flops:count_hart_flops",
                                  flop_breakdown="diffusers_var_accel.pipelines.hart.flops:HART_FLOPS", no_guidance=0.0,
                                  title="HART",
                                  description="a hybrid autoregressive (next-scale prediction + residual diffusion) "
                                              "text-to-image model ([mit-han-lab/hart](https://github.com/mit-han-lab/hart))"))
