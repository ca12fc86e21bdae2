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

__all__ = ["LiveTensorBytes"]


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
        key = id(storage)
        if key in self._seen:
            return
        before = self._before.get(key)
        if before is not None and before() is storage:
            return
        nbytes = storage.nbytes()
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        self._seen[key] = weakref.finalize(storage, self._free, key, nbytes)

    def _free(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._seen.pop(key, None)

    def __enter__(self) -> "LiveTensorBytes":
        import gc

        # storages alive before the block are not its allocations (an in-place op returns one of them)
        self._before = {}
        for obj in gc.get_objects():
            if issubclass(type(obj), torch.Tensor) and obj.device.type != "meta":  # type(): no __class__ lookups
                storage = obj.untyped_storage()
                self._before[id(storage)] = weakref.ref(storage)
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        for finalizer in list(self._seen.values()):
            finalizer.detach()
        self._seen.clear()
        self._before = {}
