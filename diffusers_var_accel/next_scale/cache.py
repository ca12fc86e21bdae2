"""The per-call key/value cache of the next-scale loop (the caller owns it, as in transformers' ``DynamicCache``).

Shape legend: ``R`` rows (batch, doubled under CFG), ``H`` heads, ``L`` tokens, ``c`` head dim.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch


class ScaleKVCache:
    """Self-attention keys and values of every earlier scale, one entry per transformer layer.

    The next-scale loop creates one per call and drops it on return; attention modules only call :meth:`update`
    with their ``layer_idx``. Keys are stored after normalisation and RoPE, exactly as attention consumes them.

    With ``max_length`` (every input token of the schedule) each layer's keys and values are written into buffers
    ``(R, H, max_length, c)`` allocated at the layer's first update, and :meth:`update` returns views of the filled
    prefix: no copy of the earlier scales per pass, and the same addresses for the whole call (what a captured CUDA
    graph needs). Without it the entries grow by concatenation (for direct model users who do not know the length).

    While :attr:`stores` is False (the loop sets it for the last pass that runs the blocks, whose keys no later pass
    reads), :meth:`update` returns the cached positions followed by the given ones without keeping the given ones, so
    ``max_length`` need not count them: at Infinity-2B 1024² the last scale is 39 % of the positions.

    Args:
        num_layers (`int`): number of self-attention layers.
        max_length (`int`, *optional*): the most positions a layer will hold; ``None`` grows without a bound.
    """

    def __init__(self, num_layers: int, max_length: Optional[int] = None):
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
        if max_length is not None and (
            isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1
        ):
            raise ValueError(f"max_length must be a positive int (positions per layer) or None, got {max_length!r}")
        self.num_layers = num_layers
        self.max_length = max_length
        self.key_cache: List[Optional[torch.Tensor]] = [None] * num_layers
        self.value_cache: List[Optional[torch.Tensor]] = [None] * num_layers
        # preallocated mode: the buffers and how many positions of each are filled (host ints, known statically)
        self._key_buffers: List[Optional[torch.Tensor]] = [None] * num_layers
        self._value_buffers: List[Optional[torch.Tensor]] = [None] * num_layers
        self._lengths: List[int] = [0] * num_layers
        #: Whether :meth:`update` keeps the keys and values it is given (False: attended to, then dropped).
        self.stores = True
        self._attended: List[int] = [0] * num_layers

    @property
    def preallocated(self) -> bool:
        """Whether keys and values are written into fixed buffers (``max_length`` given)."""
        return self.max_length is not None

    def update(
        self,
        key_RHLc: torch.Tensor,
        value_RHLc: torch.Tensor,
        layer_idx: int,
        cache_rows: Optional[int] = None,
        row_start: int = 0,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Append this scale's keys/values of layer ``layer_idx`` and return everything cached for its rows (while
        :attr:`stores` is False: return the cached positions and the given ones, keeping nothing).

        Args:
            key_RHLc: ``(R, H, L, c)`` keys of this pass (any strides).
            value_RHLc: ``(R, H, L, c)`` values of this pass (any strides).
            layer_idx: the layer.
            cache_rows: rows the cache holds when fewer run (CFG halving): the ``R`` given rows stand in for every
                block of ``R`` cached rows; the ``R`` rows from ``row_start`` are returned.
            row_start: the first cached row of the given rows (``R`` = the unconditional rows of a pass that runs
                only them, under ``cache_rows``): their own history is returned with them.
        """
        rows = key_RHLc.shape[0]
        if cache_rows is not None and cache_rows != rows:
            if cache_rows % rows:
                raise ValueError(f"{rows} rows of keys cannot fill a cache of {cache_rows} rows (not a multiple)")
        if row_start and (cache_rows is None or row_start % rows or row_start + rows > cache_rows):
            raise ValueError(
                f"row_start {row_start} does not start a block of {rows} rows of a cache of {cache_rows} rows"
            )
        keys, values = self._update(key_RHLc, value_RHLc, layer_idx, cache_rows, row_start)
        self._attended[layer_idx] = keys.shape[2]
        return keys, values

    def _update(self, key_RHLc, value_RHLc, layer_idx: int, cache_rows: Optional[int], row_start: int = 0):
        rows = key_RHLc.shape[0]
        if not self.stores:
            return self._with_cached(key_RHLc, value_RHLc, layer_idx, row_start)
        if not self.preallocated:
            if cache_rows is not None and cache_rows != rows:
                repeats = cache_rows // rows
                key_RHLc, value_RHLc = key_RHLc.repeat(repeats, 1, 1, 1), value_RHLc.repeat(repeats, 1, 1, 1)
            if self.key_cache[layer_idx] is None:
                self.key_cache[layer_idx], self.value_cache[layer_idx] = key_RHLc, value_RHLc
            else:
                self.key_cache[layer_idx] = torch.cat((self.key_cache[layer_idx], key_RHLc), dim=2)
                self.value_cache[layer_idx] = torch.cat((self.value_cache[layer_idx], value_RHLc), dim=2)
            kept = slice(row_start, row_start + rows)
            return self.key_cache[layer_idx][kept], self.value_cache[layer_idx][kept]
        return self._write(key_RHLc, value_RHLc, layer_idx, cache_rows or rows, row_start)

    def _write(self, key_RHLc, value_RHLc, layer_idx: int, cache_rows: int, row_start: int = 0):
        R, H, L, c = key_RHLc.shape
        keys = self._key_buffers[layer_idx]
        if keys is None:
            shape = (cache_rows, H, self.max_length, c)
            keys = key_RHLc.new_empty(shape)
            self._key_buffers[layer_idx] = keys
            self._value_buffers[layer_idx] = value_RHLc.new_empty(shape[:-1] + (value_RHLc.shape[-1],))
        values = self._value_buffers[layer_idx]
        if keys.shape[0] != cache_rows or keys.shape[1] != H or keys.shape[3] != c or keys.dtype != key_RHLc.dtype:
            raise ValueError(
                f"layer {layer_idx}: keys of {cache_rows} rows, {H} heads, dim {c}, {key_RHLc.dtype} do not fit the cache "
                f"buffer of {keys.shape[0]} rows, {keys.shape[1]} heads, dim {keys.shape[3]}, {keys.dtype}"
            )
        start = self._lengths[layer_idx]
        end = start + L
        if end > self.max_length:
            raise ValueError(
                f"layer {layer_idx}: writing {L} positions after {start} cached ones needs {end}, more than the "
                f"cache's max_length={self.max_length}"
            )
        if cache_rows == R:
            keys[:, :, start:end].copy_(key_RHLc)
            values[:, :, start:end].copy_(value_RHLc)
        else:  # CFG halving: the given rows fill every block of R rows (one broadcast copy each)
            repeats = cache_rows // R
            keys.view(repeats, R, *keys.shape[1:])[:, :, :, start:end].copy_(key_RHLc)
            values.view(repeats, R, *values.shape[1:])[:, :, :, start:end].copy_(value_RHLc)
        self._lengths[layer_idx] = end
        return keys[row_start : row_start + R, :, :end], values[row_start : row_start + R, :, :end]

    def _with_cached(self, key_RHLc, value_RHLc, layer_idx: int, row_start: int = 0):
        """The cached positions of the given rows followed by the given keys/values, which are not kept."""
        keys, values = self.get(layer_idx)
        if keys is None:
            return key_RHLc, value_RHLc
        rows = key_RHLc.shape[0]
        if keys.shape[1] != key_RHLc.shape[1] or keys.shape[3] != key_RHLc.shape[3] or keys.dtype != key_RHLc.dtype:
            raise ValueError(
                f"layer {layer_idx}: keys of {key_RHLc.shape[1]} heads, dim {key_RHLc.shape[3]}, {key_RHLc.dtype} do not "
                f"fit the cached ones of {keys.shape[1]} heads, dim {keys.shape[3]}, {keys.dtype}"
            )
        kept = slice(row_start, row_start + rows)
        return torch.cat((keys[kept], key_RHLc), dim=2), torch.cat((values[kept], value_RHLc), dim=2)

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds now (the preallocated buffers, or the grown entries)."""
        tensors = (
            (self._key_buffers + self._value_buffers) if self.preallocated else (self.key_cache + self.value_cache)
        )
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def get(self, layer_idx: int) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """Everything cached for layer ``layer_idx`` (views of the buffers when preallocated), or ``(None, None)``."""
        if not self.preallocated:
            return self.key_cache[layer_idx], self.value_cache[layer_idx]
        if self._key_buffers[layer_idx] is None or self._lengths[layer_idx] == 0:
            return None, None
        end = self._lengths[layer_idx]
        return self._key_buffers[layer_idx][:, :, :end], self._value_buffers[layer_idx][:, :, :end]

    def attended_length(self, layer_idx: int = 0) -> int:
        """Positions the last :meth:`update` of the layer returned (cached ones and the pass's own): what that pass
        attended to, kept or not."""
        return self._attended[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        if self.preallocated:
            return self._lengths[layer_idx]
        k = self.key_cache[layer_idx]
        return 0 if k is None else k.shape[2]

    def crop(self, max_length: int) -> None:
        """Keep only the first ``max_length`` cached positions of every layer."""
        for i in range(self.num_layers):
            if self.preallocated:
                self._lengths[i] = min(self._lengths[i], max(int(max_length), 0))
            elif self.key_cache[i] is not None:
                self.key_cache[i] = self.key_cache[i][:, :, :max_length]
                self.value_cache[i] = self.value_cache[i][:, :, :max_length]

    def batch_select_indices(self, indices: Union[Sequence[int], torch.Tensor]) -> None:
        """Keep only the rows ``indices`` (e.g. drop the unconditional CFG half). Preallocated buffers are replaced
        by buffers of the kept rows (new addresses from then on)."""
        for i in range(self.num_layers):
            if self.preallocated:
                if self._key_buffers[i] is not None:
                    self._key_buffers[i] = self._key_buffers[i][indices].contiguous()
                    self._value_buffers[i] = self._value_buffers[i][indices].contiguous()
            elif self.key_cache[i] is not None:
                self.key_cache[i] = self.key_cache[i][indices]
                self.value_cache[i] = self.value_cache[i][indices]

    @property
    def allocated(self) -> bool:
        """Whether every layer's buffers exist (preallocated mode, after the first pass that stores)."""
        return self.preallocated and all(k is not None for k in self._key_buffers)

    @property
    def empty(self) -> bool:
        """Whether no layer holds a position yet (the call's first pass has not stored)."""
        return not any(self._lengths)

    def layer_buffers(self, layer_idx: int) -> List[torch.Tensor]:
        """The buffers layer ``layer_idx`` has allocated (preallocated mode): its keys and values."""
        return [t for t in (self._key_buffers[layer_idx], self._value_buffers[layer_idx]) if t is not None]

    def buffers(self) -> List[torch.Tensor]:
        """The key and value buffers allocated so far (preallocated mode), layer by layer."""
        return [t for pair in zip(self._key_buffers, self._value_buffers) for t in pair if t is not None]

    def filled(self) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
        """``(positions held, positions last attended)`` per layer: what a pass changes besides the buffers' contents
        (a captured pass restores it after its replay, :meth:`restore_filled`)."""
        return tuple(self._lengths), tuple(self._attended)

    def restore_filled(self, filled: Tuple[Sequence[int], Sequence[int]]) -> None:
        """Set what :meth:`filled` returned (the buffers themselves are left as they are)."""
        self._lengths, self._attended = list(filled[0]), list(filled[1])

    def reset(self) -> None:
        """Forget every cached position (preallocated buffers are kept and rewritten from position 0)."""
        self.key_cache = [None] * self.num_layers
        self.value_cache = [None] * self.num_layers
        self._lengths = [0] * self.num_layers
        self._attended = [0] * self.num_layers
        self.stores = True

    def __len__(self) -> int:
        return self.num_layers
