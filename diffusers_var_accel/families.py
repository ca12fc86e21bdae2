"""The registry of model families: everything the outer modules need to know about a family, by name.

Every list of families in the package derives from :data:`MODEL_FAMILIES`: the scheduler's ``model_family`` check,
the packaged presets each family uses, the Hub cards, the benchmark, the FLOP counter, the launch counter, the
``--model`` names of the tiny random-weight pipelines, the ``var-accel convert <family>`` sub-commands and the
sampling options the command line accepts. No module outside ``models/`` and ``pipelines/<family>/`` names a family:
a new family registers one :class:`ModelFamily` here and keeps its own code in its package.

The registry sits below every other module (it imports nothing of the package): the pipeline class, the FLOP
counter, the tiny builder, the converter and the launch structures are named as ``"module:attribute"`` and imported
on first use, so the schedulers can read the family names without importing the pipelines.

Examples:
    ```py
    >>> from diffusers_var_accel.families import MODEL_FAMILIES, get_model_family
    >>> sorted(MODEL_FAMILIES)
    ['hart', 'infinity']
    >>> get_model_family("hart").pipeline_class().__name__
    'HARTPipeline'
    >>> from diffusers_var_accel.families import family_of_tiny_model
    >>> family_of_tiny_model("tiny-hart").name
    'hart'
    ```
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Tuple

if TYPE_CHECKING:  # annotations only: the registry imports nothing at run time
    import argparse


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
        sampling_options (`Tuple[str, ...]`): the sampling arguments of the pipeline's ``__call__`` that the command
            line and the benchmark pass through (``guidance_scale``, ``top_k``, ...); an option of another family
            (Infinity's ``tau`` for a HART pipeline) is refused naming these (tests check each is a parameter).
        tiny_model (`str`): the ``--model`` name of the family's tiny random-weight pipeline (``"tiny"``).
        tiny_builder (`str`): its builder, ``"module:function"``, called as ``builder(seed=0)`` (CPU, float32).
        tiny_size (`int`, *optional*): the image side ``var-accel generate --model <tiny_model>`` makes by default;
            ``None``: the pipeline's own ``default_size``.
        converter (`str`): the ``var-accel convert <name>`` sub-command, ``"module:attribute"`` of a
            :class:`ConvertCommand`.
        launch_structures (`str`): the real structures the launch counter builds at a tiny width
            (``var-accel launches``), ``"module:attribute"`` of an object with ``models``, ``default_models``,
            ``add_arguments(parser)``, ``config_options(args)``, ``check_config(config)``, ``build(model, config)``,
            ``real_config(model)``, ``size_options(config)`` and ``call_options(pipe, config, generator)`` (see
            :mod:`diffusers_var_accel.bench.launches`).
        title (`str`): the family's name in text (model cards).
        description (`str`): one Markdown phrase saying what the model is, with a link to its official code (cards).
    """

    name: str
    preset_model: str
    pipeline: str
    flop_counter: str
    no_guidance: float
    sampling_options: Tuple[str, ...] = ()
    tiny_model: str = ""
    tiny_builder: str = ""
    tiny_size: Optional[int] = None
    converter: str = ""
    launch_structures: str = ""
    title: str = ""
    description: str = ""
    flop_breakdown: str = ""

    @property
    def pipeline_class_name(self) -> str:
        """The pipeline class's name (``model_index.json``'s ``_class_name``), without importing it."""
        return self.pipeline.partition(":")[2]

    def pipeline_class(self) -> type:
        """The family's pipeline class (imported on first use)."""
        return _resolve(self.pipeline)

    def count_flops(self) -> Callable[..., Dict[str, Any]]:
        """The family's FLOP counter (imported on first use)."""
        return _resolve(self.flop_counter)

    def flop_breakdown_spec(self) -> Any:
        """The family's ``FamilyFlops`` (imported on first use)."""
        return _resolve(self.flop_breakdown)

    def build_tiny_pipeline(self, seed: int = 0):
        """The family's tiny random-weight pipeline (``--model <tiny_model>``; noise-like images)."""
        return _resolve(self.tiny_builder)(seed=seed)

    def convert_command(self) -> "ConvertCommand":
        """The family's ``var-accel convert <name>`` sub-command (imported on first use)."""
        return _resolve(self.converter)

    def launch_structure_builder(self) -> Any:
        """The family's real structures for the launch counter (imported on first use)."""
        return _resolve(self.launch_structures)


@dataclass(frozen=True)
class ConvertCommand:
    """A family's ``var-accel convert <family>`` sub-command, kept next to its converter (``pipelines/<family>/``).

    The command line adds the options every conversion shares (``--text-encoder``, ``--tokenizer``, ``--dtype``,
    ``--output``, ``--overwrite``, ``--hub-shim``), checks them, and saves what ``convert`` returns.

    Args:
        help (`str`): the sub-command's one-line help.
        description (`str`): its ``--help`` description.
        add_arguments (`Callable`): ``add_arguments(parser)`` adds the family's own options (its checkpoint files).
        convert (`Callable`): ``convert(args, torch_dtype)`` returns the converted pipeline; a checkpoint file or
            folder that is not there raises ``FileNotFoundError`` naming the option and what it should hold.
    """

    help: str
    description: str
    add_arguments: Callable[["argparse.ArgumentParser"], None]
    convert: Callable[["argparse.Namespace", Any], Any]


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


def tiny_model_names() -> List[str]:
    """The ``--model`` names of the families' tiny random-weight pipelines, in registration order."""
    return [family.tiny_model for family in MODEL_FAMILIES.values() if family.tiny_model]


def family_of_tiny_model(model: Optional[str]) -> Optional[ModelFamily]:
    """The family whose tiny pipeline ``--model model`` names, or ``None`` (another name, a folder, ``None``)."""
    return next(
        (family for family in MODEL_FAMILIES.values() if family.tiny_model and family.tiny_model == model), None
    )


def sampling_option_names() -> List[str]:
    """Every family's sampling options (the command line's sampling flags), each once, in registration order."""
    return list(dict.fromkeys(option for family in MODEL_FAMILIES.values() for option in family.sampling_options))


def families_with_option(option: str) -> List[ModelFamily]:
    """The families whose pipelines take the sampling option ``option``."""
    return [family for family in MODEL_FAMILIES.values() if option in family.sampling_options]


def check_sampling_options(family_name: str, options: Iterable[str], spell: Callable[[str], str] = str) -> None:
    """Refuse a sampling option of another family (Infinity's ``tau`` for a HART pipeline) with a ``ValueError``
    naming the families that take it and the family's own options; names that are no family's sampling option
    (``height``, ``acceleration``, ...) pass. ``spell`` writes an option as the caller's user knows it
    (``--top-k`` on the command line)."""
    family = get_model_family(family_name)
    every = sampling_option_names()
    for option in options:
        if option in every and option not in family.sampling_options:
            takers = " / ".join(f.title for f in families_with_option(option))
            raise ValueError(
                f"{spell(option)} is an option of {takers} only; {family.title} samples with "
                + ", ".join(spell(o) for o in family.sampling_options)
            )


register_model_family(
    ModelFamily(
        "infinity",
        preset_model="infinity-2b",
        pipeline="diffusers_var_accel.pipelines.infinity.pipeline_infinity:InfinityPipeline",
        flop_counter="diffusers_var_accel.pipelines.infinity.flops:count_infinity_flops",
        flop_breakdown="diffusers_var_accel.pipelines.infinity.flops:INFINITY_FLOPS",
        no_guidance=1.0,
        sampling_options=("guidance_scale", "tau", "top_k", "top_p"),
        tiny_model="tiny",
        tiny_builder="diffusers_var_accel.pipelines.infinity.tiny:build_tiny_infinity_pipeline",
        tiny_size=256,  # the tiny model makes any official size: the smallest keeps a CPU call to seconds
        converter="diffusers_var_accel.pipelines.infinity.convert:CONVERT_COMMAND",
        launch_structures="diffusers_var_accel.pipelines.infinity.launch_structures:LAUNCH_STRUCTURES",
        title="Infinity",
        description="a bitwise visual autoregressive (next-scale prediction) text-to-image model "
        "([FoundationVision/Infinity](https://github.com/FoundationVision/Infinity))",
    )
)
register_model_family(
    ModelFamily(
        "hart",
        preset_model="hart-0.7b",
        pipeline="diffusers_var_accel.pipelines.hart.pipeline_hart:HARTPipeline",
        flop_counter="diffusers_var_accel.pipelines.hart.flops:count_hart_flops",
        flop_breakdown="diffusers_var_accel.pipelines.hart.flops:HART_FLOPS",
        no_guidance=0.0,
        sampling_options=("guidance_scale", "top_k", "top_p"),
        tiny_model="tiny-hart",
        tiny_builder="diffusers_var_accel.pipelines.hart.tiny:build_tiny_hart_pipeline",
        converter="diffusers_var_accel.pipelines.hart.convert:CONVERT_COMMAND",
        launch_structures="diffusers_var_accel.pipelines.hart.launch_structures:LAUNCH_STRUCTURES",
        title="HART",
        description="a hybrid autoregressive (next-scale prediction + residual diffusion) text-to-image model "
        "([mit-han-lab/hart](https://github.com/mit-han-lab/hart))",
    )
)
