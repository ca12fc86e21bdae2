"""Marks a decision in progress, so that the string-disjoint test set (:mod:`.unseen`) can refuse to be read by it.

Calibration searches (``lab/calibration.py``: :func:`~diffusers_var_accel.lab.calibration.calibrate`,
:func:`~diffusers_var_accel.lab.calibration.choose`), the sampling check (``scripts/embedded_sampling_check.py``) and
training's validation (``scripts/train_embedded.py``) run under :func:`decides`; inside one,
:func:`~diffusers_var_accel.lab.data.unseen.unseen_prompts` raises. This module knows nothing of the test set, so a
selection path imports it without importing the set.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, List, Optional, TypeVar

__all__ = ["current_decision", "decides", "selecting"]

_DECIDING: List[str] = []
F = TypeVar("F", bound=Callable[..., Any])


@contextlib.contextmanager
def selecting(what: str) -> Iterator[None]:
    """Mark ``what`` (a calibration search, a sampling choice) as deciding while the block runs."""
    _DECIDING.append(what)
    try:
        yield
    finally:
        _DECIDING.pop()


def decides(what: str) -> Callable[[F], F]:
    """Decorator: the function runs inside :func:`selecting` ``(what)``."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with selecting(what):
                return fn(*args, **kwargs)

        return run  # type: ignore[return-value]

    return wrap


def current_decision() -> Optional[str]:
    """The innermost decision in progress, or ``None``."""
    return _DECIDING[-1] if _DECIDING else None
