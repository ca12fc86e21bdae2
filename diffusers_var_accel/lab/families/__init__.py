"""What the lab needs of each model family: its tiny ``--model`` name, the sampling options the command line takes,
the ``var-accel convert`` sub-command, the FLOP meter's and the launch counter's parts, and the words of a model card.

The library's registry (:mod:`diffusers_var_accel.families`) holds what the library reads (name, presets, pipeline
class, the "no guidance" value); each registered family also has one :class:`LabFamily` here, keyed by the same
name. Every reference is a ``"module:attribute"`` string imported on first use, so this registry imports nothing of
the lab either. A family's counters live in the benchmark folder (``lab/bench/infinity_flops.py``,
``lab/bench/infinity_launches.py``, ...).

Examples:
    ```py
    >>> from diffusers_var_accel.lab.families import lab_family, family_of_tiny_model
    >>> lab_family("hart").tiny_model
    'tiny-hart'
    >>> family_of_tiny_model("tiny").name
    'infinity'
    ```
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Tuple

from ...families import MODEL_FAMILIES, get_model_family

if TYPE_CHECKING:  # annotations only: the registry imports nothing at run time
    import argparse


@dataclass(frozen=True)
class LabFamily:
    """The lab's record of one registered model family.

    Args:
        name (`str`): the library family's name (:data:`~diffusers_var_accel.families.MODEL_FAMILIES`).
        flop_counter (`str`): the FLOP counter of a named model of the family, ``"module:function"``, called as
            ``counter(model_name, **options)`` with its own keyword options, ``accel=spec`` among them (see
            :mod:`diffusers_var_accel.lab.bench.flops`).
        flop_breakdown (`str`): the family's part of the FLOP meter, ``"module:attribute"`` naming a
            :class:`~diffusers_var_accel.lab.bench.flop_meter.FamilyFlops`; ``""``: the meter does not know it.
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
            (``var-accel launches``), ``"module:attribute"`` (see :mod:`diffusers_var_accel.lab.bench.launches`).
        title (`str`): the family's name in text (model cards, messages).
        description (`str`): one Markdown phrase saying what the model is, with a link to its official code (cards).
        counter_options (`CounterOptions`, *optional*): what the counters' command lines offer for the family
            (``var-accel flops / launches / memory --help``), readable without importing torch.
    """

    name: str
    flop_counter: str = ""
    flop_breakdown: str = ""
    sampling_options: Tuple[str, ...] = ()
    tiny_model: str = ""
    tiny_builder: str = ""
    tiny_size: Optional[int] = None
    converter: str = ""
    launch_structures: str = ""
    title: str = ""
    description: str = ""
    counter_options: Optional["CounterOptions"] = None

    @property
    def preset_model(self) -> str:
        """The library family's preset model."""
        return get_model_family(self.name).preset_model

    @property
    def no_guidance(self) -> float:
        """The library family's "no guidance" value."""
        return get_model_family(self.name).no_guidance

    def pipeline_class(self) -> type:
        """The library family's pipeline class."""
        return get_model_family(self.name).pipeline_class()

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
    """A family's ``var-accel convert <family>`` sub-command: the family's converter options and call.

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


@dataclass(frozen=True)
class CounterOptions:
    """A family's part of the counters' command lines (``var-accel flops``, ``launches``, ``memory``), as data.

    The counters' parsers (:mod:`diffusers_var_accel.lab.counter_parsers`) are built from this, so that ``--help``
    and a mistyped flag answer without importing torch; the counters themselves live beside their torch code
    (``lab/bench/<family>_flops.py``, ``_launches.py``, ``_memory.py``) and ``tests/lab/test_cli_startup.py`` checks
    that the two agree.

    Args:
        flop_models (`Tuple[str, ...]`): the FLOP meter's ``--model`` names of the family.
        size_help (`str`): the family's phrase in the FLOP meter's ``--height`` / ``--width`` help.
        text_tokens_help (`str`): its phrase in the FLOP meter's ``--text-tokens`` help.
        text_encoder (`Tuple[str, str]`, *optional*): ``(name, help)`` of the FLOP meter's ``--<name>-tokens``.
        conventions (`bool`): whether the FLOP meter's ``--conventions`` applies to the family.
        launch_models (`Tuple[str, ...]`): the launch counter's ``--models`` names of the family.
        launch_default_models (`Tuple[str, ...]`): those it counts by default.
        launch_arguments (`Tuple[Tuple[str, str], ...]`): the launch counter's own options of the family,
            ``(flag, help)``, each a positive integer defaulting to ``None``.
        memory_models (`Tuple[str, ...]`): the memory meter's ``--model`` names of the family.
    """

    flop_models: Tuple[str, ...] = ()
    size_help: str = ""
    text_tokens_help: str = ""
    text_encoder: Optional[Tuple[str, str]] = None
    conventions: bool = False
    launch_models: Tuple[str, ...] = ()
    launch_default_models: Tuple[str, ...] = ()
    launch_arguments: Tuple[Tuple[str, str], ...] = ()
    memory_models: Tuple[str, ...] = ()


def _resolve(reference: str) -> Any:
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


#: ``{name: LabFamily}``, one per registered library family that the lab knows.
LAB_FAMILIES: Dict[str, LabFamily] = {}


def register_lab_family(family: LabFamily) -> LabFamily:
    """Add ``family`` to :data:`LAB_FAMILIES`; its name must be a registered library family."""
    get_model_family(family.name)
    if family.name in LAB_FAMILIES:
        raise ValueError(f"lab family {family.name!r} is already registered ({LAB_FAMILIES[family.name]})")
    LAB_FAMILIES[family.name] = family
    return family


def unregister_lab_family(name: str) -> None:
    """Remove a family's lab record (for tests and plugins)."""
    lab_family(name)
    del LAB_FAMILIES[name]


def lab_family(name: str) -> LabFamily:
    """The lab record of the registered family ``name`` (a library family the lab has no record of: a bare one,
    with no tiny model, counters or converter)."""
    get_model_family(name)
    return LAB_FAMILIES.get(name) or LabFamily(name, title=name)


def lab_families() -> List[LabFamily]:
    """The lab records of the registered library families, in registration order."""
    return [lab_family(name) for name in MODEL_FAMILIES]


def tiny_model_names() -> List[str]:
    """The ``--model`` names of the families' tiny random-weight pipelines, in registration order."""
    return [family.tiny_model for family in lab_families() if family.tiny_model]


def family_of_tiny_model(model: Optional[str]) -> Optional[LabFamily]:
    """The family whose tiny pipeline ``--model model`` names, or ``None`` (another name, a folder, ``None``)."""
    return next((family for family in lab_families() if family.tiny_model and family.tiny_model == model), None)


def sampling_option_names() -> List[str]:
    """Every family's sampling options (the command line's sampling flags), each once, in registration order."""
    return list(dict.fromkeys(option for family in lab_families() for option in family.sampling_options))


def families_with_option(option: str) -> List[LabFamily]:
    """The families whose pipelines take the sampling option ``option``."""
    return [family for family in lab_families() if option in family.sampling_options]


def check_sampling_options(family_name: str, options: Iterable[str], spell: Callable[[str], str] = str) -> None:
    """Refuse a sampling option of another family (Infinity's ``tau`` for a HART pipeline) with a ``ValueError``
    naming the families that take it and the family's own options; names that are no family's sampling option
    (``height``, ``acceleration``, ...) pass. ``spell`` writes an option as the caller's user knows it
    (``--top-k`` on the command line)."""
    family = lab_family(family_name)
    every = sampling_option_names()
    for option in options:
        if option in every and option not in family.sampling_options:
            takers = " / ".join(f.title for f in families_with_option(option))
            raise ValueError(
                f"{spell(option)} is an option of {takers} only; {family.title} samples with "
                + ", ".join(spell(o) for o in family.sampling_options)
            )


register_lab_family(
    LabFamily(
        "infinity",
        flop_counter="diffusers_var_accel.lab.bench.infinity_flops:count_infinity_flops",
        flop_breakdown="diffusers_var_accel.lab.bench.infinity_flops:INFINITY_FLOPS",
        sampling_options=("guidance_scale", "tau", "top_k", "top_p"),
        tiny_model="tiny",
        tiny_builder="diffusers_var_accel.pipelines.infinity.tiny:build_tiny_infinity_pipeline",
        tiny_size=256,  # the tiny model makes any official size: the smallest keeps a CPU call to seconds
        converter="diffusers_var_accel.lab.families.convert_commands:INFINITY_CONVERT",
        launch_structures="diffusers_var_accel.lab.bench.infinity_launches:LAUNCH_STRUCTURES",
        title="Infinity",
        counter_options=CounterOptions(
            flop_models=("infinity-2b", "infinity-8b"),
            size_help="Infinity default 1024",
            text_tokens_help="Infinity: T5 tokens per prompt (default 32, a typical prompt)",
            text_encoder=(
                "t5",
                "Infinity: also count the flan-t5-xl encoder on this many tokens per prompt (not in the total; the "
                "official runner pads to 512)",
            ),
            conventions=True,
            launch_models=("infinity-2b", "infinity-8b"),
            launch_default_models=("infinity-2b",),
            memory_models=("infinity-2b", "infinity-8b"),
        ),
        description="a bitwise visual autoregressive (next-scale prediction) text-to-image model "
        "([FoundationVision/Infinity](https://github.com/FoundationVision/Infinity))",
    )
)
register_lab_family(
    LabFamily(
        "hart",
        flop_counter="diffusers_var_accel.lab.bench.hart_flops:count_hart_flops",
        flop_breakdown="diffusers_var_accel.lab.bench.hart_flops:HART_FLOPS",
        sampling_options=("guidance_scale", "top_k", "top_p"),
        tiny_model="tiny-hart",
        tiny_builder="diffusers_var_accel.pipelines.hart.tiny:build_tiny_hart_pipeline",
        converter="diffusers_var_accel.lab.families.convert_commands:HART_CONVERT",
        launch_structures="diffusers_var_accel.lab.bench.hart_launches:LAUNCH_STRUCTURES",
        title="HART",
        counter_options=CounterOptions(
            flop_models=("hart-0.7b",),
            size_help="HART: its one size",
            text_tokens_help="HART always uses its 300 context tokens",
            text_encoder=(
                "qwen2",
                "HART: also count the Qwen2-1.5B text encoder on this many tokens per prompt (not in the total; the "
                "official encoding is the system instruction + the prompt padded to 300)",
            ),
            conventions=True,
            launch_models=("hart-0.7b",),
            launch_default_models=("hart-0.7b",),
            launch_arguments=(("--hart-scales", "HART: its first N scales (default: all 14, 1024x1024)"),),
            memory_models=("hart-0.7b",),
        ),
        description="a hybrid autoregressive (next-scale prediction + residual diffusion) text-to-image model "
        "([mit-han-lab/hart](https://github.com/mit-han-lab/hart))",
    )
)
