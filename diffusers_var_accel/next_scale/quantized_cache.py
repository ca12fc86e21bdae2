"""An opt-in KV cache stored in int8: keys with one scale per channel, values with one scale per token.

This is the layout of KIVI (Liu et al., 2024) and of VAR-Compressor's INT8 KV cache: keys have outlier *channels*
(a few channels are large for every token), so each channel gets its own scale; values have no such channels and
are quantised per token. Quantisation is symmetric: ``q = round(x / s)`` clamped to ``[-127, 127]``, ``s = amax / 127``,
and a read gives ``q * s`` in the keys' dtype (the attention's compute dtype).

When the key scales are computed: per write, i.e. per pass of the next-scale loop, over that pass's tokens. The keys
of a scale never change once written, so a scale fixed at write time is never revisited (no re-quantisation of earlier
scales when a later one brings a larger channel), and no pass waits for tokens it has not produced. Each write takes
one slot of a ``(R, H, max_writes, c)`` buffer; a per-position slot index (filled on the device) expands the slots to
positions on a read: one ``index_select`` and one multiply, no host read.

A pass attends to the earlier scales as the cache holds them (dequantised) and to its own keys and values exactly
(they are in hand), as KIVI keeps its most recent tokens in full precision.

Shape legend: ``R`` rows, ``H`` heads, ``L`` tokens of a write, ``S`` cached positions, ``c`` head dim.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch

from .cache import ScaleKVCache

#: The storage forms of the KV cache besides the attention's own dtype (``None``): what
#: ``pipe.enable_kv_cache_quantization`` and ``run_next_scale_loop(kv_cache_dtype=...)`` accept.
KV_CACHE_DTYPES = ("int8",)

_QMAX = 127.0
_MIN_SCALE = 1e-12  # an all-zero channel/token: any positive scale reads back zeros


def check_kv_cache_dtype(kv_cache_dtype) -> Optional[str]:
    """``None`` (the cache in the attention's dtype) or ``"int8"`` (``torch.int8`` is taken as ``"int8"``); anything
    else is refused, naming what is allowed."""
    if kv_cache_dtype is None:
        return None
    if kv_cache_dtype is torch.int8:
        return "int8"
    if isinstance(kv_cache_dtype, str) and kv_cache_dtype in KV_CACHE_DTYPES:
        return kv_cache_dtype
    raise ValueError(
        f"kv_cache_dtype {kv_cache_dtype!r} is not supported; allowed: None (the attention's dtype), "
        f"{', '.join(repr(d) for d in KV_CACHE_DTYPES)}"
    )


def quantize_per_channel(x_RHLc: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one scale per channel over the tokens: ``(int8 (R, H, L, c), scale (R, H, 1, c))``, the
    scale in ``x``'s dtype (what a read multiplies by, so quantising and reading use the same number)."""
    scale = (x_RHLc.abs().amax(dim=2, keepdim=True).float() / _QMAX).clamp_min_(_MIN_SCALE).to(x_RHLc.dtype)
    return _round(x_RHLc, scale), scale


def quantize_per_token(x_RHLc: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one scale per token over its channels: ``(int8 (R, H, L, c), scale (R, H, L, 1))``."""
    scale = (x_RHLc.abs().amax(dim=3, keepdim=True).float() / _QMAX).clamp_min_(_MIN_SCALE).to(x_RHLc.dtype)
    return _round(x_RHLc, scale), scale


def _round(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.round(x.float() / scale.float()).clamp_(-_QMAX, _QMAX).to(torch.int8)


def quantized_kv_cache_nbytes(
    num_layers: int, cache_rows: int, positions: int, heads: int, head_dim: int, max_writes: int, dtype: torch.dtype
) -> int:
    """Bytes of an :class:`Int8ScaleKVCache`: int8 keys and values, the values' scale per position and head, the keys'
    scale per channel and write, and the int32 slot index per position."""
    item = torch.empty((), dtype=dtype).element_size()
    per_layer = (
        2 * cache_rows * heads * positions * head_dim  # int8 keys and values
        + cache_rows * heads * positions * item  # value scales
        + cache_rows * heads * max_writes * head_dim * item  # key scales
        + positions * 4  # slot index
    )
    return num_layers * per_layer


class Int8ScaleKVCache(ScaleKVCache):
    """:class:`ScaleKVCache` storing keys and values in int8 (module docstring: the layout and why).

    Preallocated only: the buffers of each layer are allocated at its first write, sized ``max_length`` positions and
    ``max_writes`` key-scale slots (one per write; the loop gives one per pass), and keep their addresses for the
    call. :meth:`update` and :meth:`get` return keys and values in the dtype they were given.

    Args:
        num_layers (`int`): number of self-attention layers.
        max_length (`int`): the most positions a layer will hold.
        max_writes (`int`): the most writes a layer will take (the loop: its number of passes).
    """

    def __init__(self, num_layers: int, max_length: int, max_writes: int):
        if max_length is None:
            raise ValueError("an int8 KV cache is preallocated: give max_length (the positions per layer)")
        super().__init__(num_layers, max_length=max_length)
        if isinstance(max_writes, bool) or not isinstance(max_writes, int) or max_writes < 1:
            raise ValueError(f"max_writes must be a positive int (writes per layer), got {max_writes!r}")
        self.max_writes = max_writes
        self._key_scales: List[Optional[torch.Tensor]] = [None] * num_layers  # (R, H, max_writes, c)
        self._value_scales: List[Optional[torch.Tensor]] = [None] * num_layers  # (R, H, max_length, 1)
        self._slots: List[Optional[torch.Tensor]] = [None] * num_layers  # (max_length,) int32: write of each position
        self._writes: List[int] = [0] * num_layers

    def layer_buffers(self, layer_idx: int) -> List[torch.Tensor]:
        buffers = super().layer_buffers(layer_idx)
        extra = (self._key_scales[layer_idx], self._value_scales[layer_idx], self._slots[layer_idx])
        return buffers + [t for t in extra if t is not None]

    def _write(self, key_RHLc, value_RHLc, layer_idx: int, cache_rows: int, row_start: int = 0):
        R, H, L, c = key_RHLc.shape
        if self._key_buffers[layer_idx] is None:
            shape = (cache_rows, H, self.max_length, c)
            self._key_buffers[layer_idx] = key_RHLc.new_empty(shape, dtype=torch.int8)
            self._value_buffers[layer_idx] = value_RHLc.new_empty(
                shape[:-1] + (value_RHLc.shape[-1],), dtype=torch.int8
            )
            self._key_scales[layer_idx] = key_RHLc.new_empty((cache_rows, H, self.max_writes, c))
            self._value_scales[layer_idx] = value_RHLc.new_empty((cache_rows, H, self.max_length, 1))
            self._slots[layer_idx] = torch.zeros(self.max_length, dtype=torch.int32, device=key_RHLc.device)
        keys, values = self._key_buffers[layer_idx], self._value_buffers[layer_idx]
        key_scales, value_scales = self._key_scales[layer_idx], self._value_scales[layer_idx]
        if (
            keys.shape[0] != cache_rows
            or keys.shape[1] != H
            or keys.shape[3] != c
            or key_scales.dtype != key_RHLc.dtype
        ):
            raise ValueError(
                f"layer {layer_idx}: keys of {cache_rows} rows, {H} heads, dim {c}, {key_RHLc.dtype} do not fit the int8 "
                f"cache of {keys.shape[0]} rows, {keys.shape[1]} heads, dim {keys.shape[3]}, scales in {key_scales.dtype}"
            )
        start, write = self._lengths[layer_idx], self._writes[layer_idx]
        end = start + L
        if end > self.max_length:
            raise ValueError(
                f"layer {layer_idx}: writing {L} positions after {start} cached ones needs {end}, more than the "
                f"cache's max_length={self.max_length}"
            )
        if write >= self.max_writes:
            raise ValueError(
                f"layer {layer_idx}: write {write + 1} of an int8 KV cache made for max_writes={self.max_writes}"
            )
        cached_keys, cached_values = self._dequantized(layer_idx, start, row_start, R)
        key_q, key_scale = quantize_per_channel(key_RHLc)
        value_q, value_scale = quantize_per_token(value_RHLc)
        repeats = cache_rows // R  # CFG halving: the given rows fill every block of R rows (one broadcast copy each)
        for buffer, new in ((keys, key_q), (values, value_q), (value_scales, value_scale)):
            buffer.view(repeats, R, *buffer.shape[1:])[:, :, :, start:end].copy_(new)
        key_scales.view(repeats, R, *key_scales.shape[1:])[:, :, :, write : write + 1].copy_(key_scale)
        self._slots[layer_idx][start:end].fill_(write)
        self._lengths[layer_idx], self._writes[layer_idx] = end, write + 1
        if cached_keys is None:
            return key_RHLc, value_RHLc
        return torch.cat((cached_keys, key_RHLc), dim=2), torch.cat((cached_values, value_RHLc), dim=2)

    def _dequantized(self, layer_idx: int, end: int, row_start: int = 0, rows: Optional[int] = None):
        """The first ``end`` positions of rows ``row_start`` .. ``row_start + rows`` read back in the keys' dtype."""
        keys = self._key_buffers[layer_idx]
        if keys is None or end == 0:
            return None, None
        kept = slice(row_start, None if rows is None else row_start + rows)
        key_scales = self._key_scales[layer_idx][kept].index_select(2, self._slots[layer_idx][:end])
        return (
            keys[kept, :, :end] * key_scales,
            self._value_buffers[layer_idx][kept, :, :end] * self._value_scales[layer_idx][kept, :, :end],
        )

    def get(self, layer_idx: int) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """Everything cached for layer ``layer_idx``, read back in the keys' dtype (new tensors), or ``(None, None)``."""
        return self._dequantized(layer_idx, self._lengths[layer_idx])

    def batch_select_indices(self, indices: Union[Sequence[int], torch.Tensor]) -> None:
        super().batch_select_indices(indices)
        for scales in (self._key_scales, self._value_scales):
            for i, t in enumerate(scales):
                if t is not None:
                    scales[i] = t[indices].contiguous()

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds now: int8 keys and values, their scales and the slot index."""
        tensors = self._key_buffers + self._value_buffers + self._key_scales + self._value_scales + self._slots
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def buffers(self) -> List[torch.Tensor]:
        return [t for i in range(self.num_layers) for t in self.layer_buffers(i)]

    def reset(self) -> None:
        super().reset()
        self._writes = [0] * self.num_layers
