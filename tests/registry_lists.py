"""The tests' lists of methods and model families, derived from the registries.

A method registered with ``class X(VARAccelScheduler, method="x")`` in the library, or a family added to
:data:`~diffusers_var_accel.families.MODEL_FAMILIES`, is then tested by every parametrised test without editing a
list. A test that needs a subset derives it here by a rule (a method with a preset for the family, a method whose
passes draw nothing inside them), never by hand.

The lists are taken when this module is first imported (at collection): the plug-in methods some tests register and
unregister on the way are not in them, because they are not the library's (:func:`is_library_method`).
"""

from typing import Dict, List, Optional, Tuple, Type

from diffusers_var_accel import ComposedScheduler, supported_sizes
from diffusers_var_accel.families import MODEL_FAMILIES
from diffusers_var_accel.schedulers.registry import BASELINE
from diffusers_var_accel.schedulers.registry import METHODS as REGISTERED_METHODS

#: The package whose registered methods are the library's (a plug-in's class lives elsewhere).
LIBRARY_PACKAGE = "diffusers_var_accel."


def is_library_method(scheduler_class: type) -> bool:
    """Whether a registered scheduler class is one of the library's methods (not a plug-in or a test's)."""
    return scheduler_class.__module__.startswith(LIBRARY_PACKAGE)


#: ``{name: scheduler class}`` of the library's registered methods, in registration order.
METHODS: Dict[str, Type] = {name: cls for name, cls in REGISTERED_METHODS.items() if is_library_method(cls)}

#: The library's method names, in registration order.
METHOD_NAMES: List[str] = list(METHODS)

#: ``("baseline", <every library method>)``: what the benchmark, the demo and the notebook run by default.
SPECS: Tuple[str, ...] = (BASELINE, *METHODS)

#: The registered model families, in registration order.
FAMILIES: Tuple[str, ...] = tuple(MODEL_FAMILIES)

#: Per family, another registered family (the next one in registration order, cyclically; ``None`` when only one is
#: registered): the family a foreign preset comes from.
OTHER_FAMILY: Dict[str, Optional[str]] = {
    family: (FAMILIES[(i + 1) % len(FAMILIES)] if len(FAMILIES) > 1 else None) for i, family in enumerate(FAMILIES)
}


def methods_with_preset(family: str) -> List[str]:
    """The library's methods that have a preset for ``family`` (``family in cls.presets``)."""
    return [name for name, cls in METHODS.items() if family in cls.presets]


#: ``(method, family)`` of every library method and every family it has a preset for.
METHOD_FAMILY_CASES: List[Tuple[str, str]] = [
    (method, family) for method, cls in METHODS.items() for family in FAMILIES if family in cls.presets
]


def draws_inside_passes(method: str, family: str) -> bool:
    """Whether ``method``'s preset for ``family`` draws random numbers inside a pass (such passes cannot be captured
    or compiled: the executor refuses them, see ``VARAccelScheduler.draws_inside_passes``)."""
    return bool(METHODS[method].from_preset(family).draws_inside_passes)


def capturable_methods(family: str) -> List[str]:
    """The library's methods whose preset for ``family`` runs passes that can be captured or compiled."""
    return [method for method in methods_with_preset(family) if not draws_inside_passes(method, family)]


def capturable_in_every_family() -> List[str]:
    """The library's methods whose presets can be captured or compiled in every registered family."""
    per_family = [set(capturable_methods(family)) for family in FAMILIES]
    return [method for method in METHODS if all(method in methods for methods in per_family)]


#: ``{preset model: family}``: the model whose packaged presets each family uses (``"infinity-2b": "infinity"``).
PRESET_MODELS: Dict[str, str] = {family.preset_model: name for name, family in MODEL_FAMILIES.items()}


#: Preset overrides the tests' tiny models need (the ``pipes`` fixture of conftest.py: a 6-block Infinity, a 4-block
#: HART on the first 10 HART-0.7B scales): DepthVAR's presets reference scale 9 of Infinity's 13 and scale 10 of
#: HART's 14, beyond the short schedules, so they reference the third scale from the end instead. StageVAR's presets
#: split Infinity-2B's 32 blocks into 8 chunks and HART-0.7B's 24 into 24 (one ratio each); the tiny models take 2 and
#: 4 chunks with ratios of the preset's own table. A method whose presets fit the tiny models needs no entry.
TINY_MODEL_OVERRIDES: Dict[Tuple[str, str], Dict] = {
    ("depthvar", "infinity"): {"reference_scale": -3},
    ("depthvar", "hart"): {"reference_scale": -3},
    ("stagevar", "infinity"): {"num_chunks": 2, "rank_ratios": ((0.13648282097649195, 0.2502819846292948),)},
    ("stagevar", "hart"): {
        "num_chunks": 4,
        "rank_ratios": ((0.2074957426329037, 0.2366069362690658, 0.29325045350214707, 0.3102232341181697),),
    },
}


def tiny_preset(method: str, family: str, **overrides):
    """``method``'s preset for ``family`` with the overrides the tiny test models need, then ``overrides``."""
    return METHODS[method].from_preset(family, **{**TINY_MODEL_OVERRIDES.get((method, family), {}), **overrides})


#: The smallest official Infinity size (7 scales) and HART's one size, as call keywords: the quickest tiny runs.
SMALLEST_SIZE: Dict[str, Dict[str, int]] = {
    "infinity": dict(
        zip(("height", "width"), sorted(hw for hw, (_, budget) in supported_sizes().items() if budget == "0.06M")[0])
    ),
    "hart": {},
}

#: The baseline of each family, every (method, family) and one composition: what the per-call record tests cover.
CASES_WITH_BASELINE_AND_COMPOSITION = [
    (None, "infinity"),
    (None, "hart"),
    *METHOD_FAMILY_CASES,
    ("lazyvar+depthvar", "infinity"),
]


def tiny_scheduler(spec: Optional[str], family: str):
    """The tiny-model scheduler for ``spec``: ``None`` (the baseline), a method name, or ``a+b`` (composed)."""
    if spec is None:
        return None
    if "+" in spec:
        return ComposedScheduler([tiny_preset(m, family) for m in spec.split("+")])
    return tiny_preset(spec, family)
