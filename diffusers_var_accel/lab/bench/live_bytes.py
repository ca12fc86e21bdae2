"""The peak of live tensor bytes inside a ``with`` block, on any device (the CPU's stand-in for
``torch.cuda.max_memory_allocated``).

A ``TorchDispatchMode`` sees the output of every ATen op; each new storage it has not seen is counted when it first
appears and uncounted when it is freed (a finalizer on the storage, whose Python object lives exactly as long as the
storage). Storages that existed before the block (weights, inputs) are not counted: the figure is what the block
allocated on top of them, at its peak. Left out: allocator rounding and caching, and memory a kernel takes for its
own workspace.
"""

from __future__ import annotations

import weakref
from typing import Dict

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["LiveTensorBytes", "storages_alive", "is_new_storage"]


def storages_alive(include_meta: bool) -> Dict[int, weakref.ref]:
    """The storages alive now (by ``id``, with a weak reference to tell a reused id apart): a block's allocations are
    what is not among them (an in-place op returns one of them)."""
    import gc

    alive = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and (include_meta or obj.device.type != "meta"):  # type(): no lookups
            storage = obj.untyped_storage()
            alive[id(storage)] = weakref.ref(storage)
    return alive


def is_new_storage(storage: torch.UntypedStorage, seen: Dict[int, object], before: Dict[int, weakref.ref]) -> bool:
    """Whether ``storage`` is neither counted yet (``seen``) nor alive before the block (``before``)."""
    key = id(storage)
    if key in seen:
        return False
    existed = before.get(key)
    return existed is None or existed() is not storage


class LiveTensorBytes(TorchDispatchMode):
    """Count the bytes of the storages the ops inside the block create, live and at their peak.

    Attributes:
        live (`int`): bytes of the counted storages still alive.
        peak (`int`): the most bytes alive at once.

    Examples:
        ```py
        >>> import torch
        >>> from diffusers_var_accel.lab.bench.live_bytes import LiveTensorBytes
        >>> x = torch.ones(1024)
        >>> with LiveTensorBytes() as meter:
        ...     y = x * 2  # 4 KiB
        ...     z = y + 1  # 4 KiB more
        ...     del y
        >>> meter.peak, meter.live
        (8192, 4096)
        ```
    """

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: Dict[int, weakref.finalize] = {}
        self._before: Dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._count(t)
        return out

    def _count(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        if not is_new_storage(storage, self._seen, self._before):
            return
        key = id(storage)
        nbytes = storage.nbytes()
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        self._seen[key] = weakref.finalize(storage, self._free, key, nbytes)

    def _free(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._seen.pop(key, None)

    def __enter__(self) -> "LiveTensorBytes":
        self._before = storages_alive(include_meta=False)
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        for finalizer in list(self._seen.values()):
            finalizer.detach()
        self._seen.clear()
        self._before = {}
