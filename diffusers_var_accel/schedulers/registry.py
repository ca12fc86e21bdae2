"""The registry of acceleration methods: ``name -> scheduler class`` (and through it, the method's presets).

A method registers itself on its class line, ``class LazyVARScheduler(VARAccelScheduler, method="lazyvar")``
(:meth:`VARAccelScheduler.__init_subclass__`); every list of methods in the package derives from :data:`METHODS`:
``pipe.enable_acceleration("lazyvar")`` and the ``pipe.enable_<method>()`` shortcuts, ``load_acceleration``, the
command line, the benchmark, the demo, the Hub cards and the FLOP counter. The five methods of the library are
registered when :mod:`diffusers_var_accel.schedulers` is imported, which importing this module does first.

Examples:
    ```py
    >>> from diffusers_var_accel.schedulers.registry import method_names, get_method
    >>> method_names()
    ['fastvar', 'lazyvar', 'depthvar', 'arvar', 'stagevar']
    >>> get_method("lazyvar").__name__
    'LazyVARScheduler'
    ```
"""

from __future__ import annotations

import difflib
from typing import Callable, Dict, List, Optional, Tuple, Type

#: The registry sits below the scheduler base class (which registers its subclasses here), so it names the classes
#: it holds only as ``type``: a ``VARAccelScheduler`` subclass each.
SchedulerClass = Type[object]

#: ``{name: scheduler class}`` of the registered methods, in registration order.
METHODS: Dict[str, SchedulerClass] = {}

#: Joins method names into a composition: ``"lazyvar+arvar"`` (a ``ComposedScheduler`` of the presets).
COMPOSE_SEPARATOR = "+"

#: The spec that means "no acceleration" in the command line, the benchmark and the demo.
BASELINE = "baseline"

#: Called as ``listener(name, scheduler_class)`` after a registration and ``listener(name, None)`` after a removal
#: (the pipelines' ``enable_<method>`` shortcuts follow the registry this way; see :func:`add_registry_listener`).
_LISTENERS: List[Callable[[str, Optional[type]], None]] = []


def add_registry_listener(listener: Callable[[str, Optional[type]], None]) -> None:
    """Call ``listener(name, cls)`` for every registered method now and on every later registration, and
    ``listener(name, None)`` when a method is removed."""
    _LISTENERS.append(listener)
    for name, cls in METHODS.items():
        listener(name, cls)


def register_method(name: str, scheduler_class: SchedulerClass) -> None:
    """Register ``scheduler_class`` as the method ``name`` (called by ``class X(VARAccelScheduler, method=name)``).

    Raises:
        ValueError: ``name`` is not a lowercase identifier, or another class already holds it.
    """
    if not (isinstance(name, str) and name.isidentifier() and name == name.lower() and name != BASELINE):
        raise ValueError(f"a method name must be a lowercase identifier other than {BASELINE!r}, got {name!r}")
    held = METHODS.get(name)
    if held is not None and held.__qualname__ != scheduler_class.__qualname__:
        raise ValueError(
            f"method {name!r} is already registered by {held.__name__}; unregister_method({name!r}) first"
        )
    METHODS[name] = scheduler_class  # the same class defined again (a reloaded module) replaces itself
    for listener in _LISTENERS:
        listener(name, scheduler_class)


def unregister_method(name: str) -> SchedulerClass:
    """Remove the method ``name`` from the registry (a plugin's or a test's); returns its class."""
    get_method(name)
    scheduler_class = METHODS.pop(name)
    for listener in _LISTENERS:
        listener(name, None)
    return scheduler_class


def method_names() -> List[str]:
    """The registered method names, in registration order."""
    return list(METHODS)


def method_titles() -> List[str]:
    """The registered methods as their papers name them (the class names without ``Scheduler``: ``"FastVAR"``)."""
    return [
        cls.__name__[: -len("Scheduler")] if cls.__name__.endswith("Scheduler") else cls.__name__
        for cls in METHODS.values()
    ]


def default_method_specs() -> Tuple[str, ...]:
    """``("baseline", <every registered method>)``: what the benchmark and the demo run when given no methods."""
    return (BASELINE, *METHODS)


def get_method(name: str) -> SchedulerClass:
    """The scheduler class of the method ``name``.

    Raises:
        ValueError: no method has that name; the message lists the registered ones.
    """
    if not isinstance(name, str) or name not in METHODS:
        hint = difflib.get_close_matches(name, list(METHODS), n=1, cutoff=0.7) if isinstance(name, str) else []
        did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ValueError(
            f"unknown acceleration method {name!r}{did_you_mean}; known methods: {method_names()} "
            f"(join several with {COMPOSE_SEPARATOR!r}, e.g. 'lazyvar{COMPOSE_SEPARATOR}arvar')"
        )
    return METHODS[name]
