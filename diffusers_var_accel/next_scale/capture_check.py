"""What a captured pass may not do, checked while it is captured instead of assumed.

A CUDA graph records kernels, nothing else: a host sync inside a pass (``.item()``, ``bool(t)``, ``nonzero``,
``.tolist()``) aborts the capture; an upload of host data (``torch.tensor(list)``) or a tensor factory without a
device (a CPU tensor on the GPU path) is baked into the graph as the value of the first call; a random draw replays
the first call's draw. The CPU stand-in (``capture="trace"``) would trace all of these into its FX graph without a
word, so :class:`CaptureCheck` runs around every capture and warm-up of :class:`~.graphs.PassGraphs` and raises
:class:`CaptureIllegalError` at the first such op, naming it and the source line that called it. Every trace test of
every method is then a capture-legality test as well.

The op sets are the launch counter's (it imports them from here): what counts as a sync there is refused here.
"""

from __future__ import annotations

import os
import sys
from typing import Dict, FrozenSet, Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "CaptureCheck",
    "CaptureIllegalError",
    "DEVICELESS_FACTORIES",
    "HOST_COPY_METHODS",
    "SYNC_OPS",
    "UPLOAD_OPS",
    "is_random_op",
    "source_line",
]

#: ATen ops that make the host wait for the device, with how many syncs one call costs (``multinomial``: its CUDA
#: kernel checks its input twice on the host).
SYNC_OPS: Dict[str, int] = {
    "_local_scalar_dense": 1,
    "nonzero": 1,
    "nonzero_static": 0,
    "masked_select": 1,
    "unique": 1,
    "_unique": 1,
    "_unique2": 1,
    "unique_consecutive": 1,
    "unique_dim": 1,
    "unique_dim_consecutive": 1,
    "multinomial": 2,
}
#: ATen ops that copy host data to the device (``torch.tensor(data)``, ``torch.as_tensor(list)``).
UPLOAD_OPS: FrozenSet[str] = frozenset({"lift_fresh", "lift_fresh_copy"})
#: Tensor methods that copy to the host without dispatching an ATen op on the CPU.
HOST_COPY_METHODS: FrozenSet[str] = frozenset({"tolist", "cpu", "numpy"})
#: ``torch`` factories that make a tensor on the default device unless given one: inside a pass they must name it.
DEVICELESS_FACTORIES: FrozenSet[str] = frozenset(
    {
        "arange",
        "as_tensor",
        "empty",
        "eye",
        "full",
        "linspace",
        "logspace",
        "ones",
        "rand",
        "randint",
        "randn",
        "randperm",
        "scalar_tensor",
        "tensor",
        "zeros",
    }
)

#: Random ops none of whose overloads names its generator (the rest are found from their schemas).
RANDOM_OPS_WITHOUT_GENERATOR: FrozenSet[str] = frozenset(
    {"native_dropout", "rand_like", "randn_like", "randint_like", "rrelu_with_noise"}
)

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE_ROOT = os.path.dirname(_PACKAGE_DIR)
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_THIS_FILE = os.path.abspath(__file__)
_RANDOM_CACHE: Dict[object, bool] = {}


def _frames_outside_torch(skip_files: FrozenSet[str]):
    frame = sys._getframe(2)
    skipped = skip_files | {_THIS_FILE}
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path not in skipped and not path.startswith(_TORCH_DIR):
            shown = os.path.relpath(path, _PACKAGE_ROOT) if path.startswith(_PACKAGE_ROOT) else path
            yield path.startswith(_PACKAGE_DIR + os.sep), f"{shown}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back


def source_line(skip_files: FrozenSet[str] = frozenset()) -> str:
    """``path:line (function)`` of the innermost frame inside this package (else the innermost outside torch), the
    files ``skip_files`` and this one passed over."""
    fallback = None
    for inside, where in _frames_outside_torch(skip_files):
        if inside:
            return where
        fallback = fallback or where
    return fallback or "?"


def _where() -> str:
    """The innermost frame outside torch, and the innermost one of this package when that is another."""
    innermost = package = None
    for inside, where in _frames_outside_torch(frozenset()):
        innermost = innermost or where
        if inside:
            package = where
            break
    if innermost is None:
        return "?"
    return innermost if package in (None, innermost) else f"{innermost}, called from {package}"


def is_random_op(func) -> bool:
    """Whether the ATen op draws random numbers: one of its overloads takes a ``generator`` (``randn(size)`` draws
    from the default generator, its sibling ``randn(size, generator)`` names it)."""
    packet = func.overloadpacket
    cached = _RANDOM_CACHE.get(packet)
    if cached is None:
        cached = _RANDOM_CACHE[packet] = packet.__name__ in RANDOM_OPS_WITHOUT_GENERATOR or any(
            a.name == "generator"
            for overload in packet.overloads()
            for a in getattr(packet, overload)._schema.arguments
        )
    return cached


class CaptureIllegalError(RuntimeError):
    """An op that a captured pass cannot hold (a host sync, an upload, a draw, a tensor on no named device)."""


class _DispatchCheck(TorchDispatchMode):
    def __init__(self, what: str, allow_draws: bool):
        super().__init__()
        self.what, self.allow_draws = what, allow_draws

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        why = None
        if SYNC_OPS.get(name, 0):
            why = "a host sync (the host reads the device)"
        elif (
            name == "repeat_interleave"
            and kwargs.get("output_size") is None
            and func._overloadname.startswith("Tensor")
        ):
            why = "a host sync (repeats read on the host without output_size)"
        elif name in UPLOAD_OPS:
            why = "an upload of host data (baked into the graph as the first call's values)"
        elif not self.allow_draws and is_random_op(func):
            why = "a random draw (a graph replays the first call's draw)"
        if why is not None:
            raise CaptureIllegalError(f"{self.what}: aten.{name} is {why}, at {_where()}")
        return func(*args, **kwargs)


class _FunctionCheck(TorchFunctionMode):
    def __init__(self, what: str):
        super().__init__()
        self.what = what

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", None)
        if name in HOST_COPY_METHODS and args and isinstance(args[0], torch.Tensor):
            raise CaptureIllegalError(
                f"{self.what}: Tensor.{name}() is a host sync (a copy to the host), at {_where()}"
            )
        if (
            name in DEVICELESS_FACTORIES
            and getattr(func, "__module__", None) == "torch"
            and kwargs.get("device") is None
        ):
            raise CaptureIllegalError(
                f"{self.what}: torch.{name}(...) without device= makes a tensor on the default device (a host "
                f"tensor on the GPU path, baked into the graph), at {_where()}; pass device= explicitly"
            )
        return func(*args, **kwargs)


class CaptureCheck:
    """Raise :class:`CaptureIllegalError` at the first op inside the ``with`` block that a CUDA graph cannot capture
    as it ran: host syncs (:data:`SYNC_OPS`, ``repeat_interleave`` without ``output_size``, ``.tolist()`` /
    ``.cpu()`` / ``.numpy()``), uploads of host data (:data:`UPLOAD_OPS`), random draws (ops that take a
    generator) and ``torch`` factories called without ``device=`` (:data:`DEVICELESS_FACTORIES`).

    Args:
        what (`str`): what is being captured, for the message (``"capturing pass 3 (scales 4x4)"``).
        allow_draws (`bool`, defaults to `False`): let random draws through (a check of syncs and uploads only, for
            code that draws on the device outside any graph).

    Examples:
        ```py
        >>> import torch
        >>> from diffusers_var_accel.next_scale.capture_check import CaptureCheck, CaptureIllegalError
        >>> x = torch.ones(3)
        >>> with CaptureCheck("an example"):
        ...     y = x * 2  # fine
        >>> try:
        ...     with CaptureCheck("an example"):
        ...         x.sum().item()
        ... except CaptureIllegalError as err:
        ...     print(str(err).split(",")[0])
        an example: aten._local_scalar_dense is a host sync (the host reads the device)
        ```
    """

    def __init__(self, what: str = "a captured pass", allow_draws: bool = False):
        self.what, self.allow_draws = what, allow_draws
        self._modes: Optional[tuple] = None

    def __enter__(self) -> "CaptureCheck":
        self._modes = (_FunctionCheck(self.what), _DispatchCheck(self.what, self.allow_draws))
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes or ()):
            mode.__exit__(*exc)
        self._modes = None
