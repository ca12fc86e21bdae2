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

    Args:
        num_layers (`int`): number of self-attention layers.
    """

    def __init__(self, num_layers: int):
        self.num_layers = num_layers
        self.key_cache: List[Optional[torch.Tensor]] = [None] * num_layers
        self.value_cache: List[Optional[torch.Tensor]] = [None] * num_layers

    def update(self, key_RHLc: torch.Tensor, value_RHLc: torch.Tensor, layer_idx: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Append this scale's keys/values of layer ``layer_idx`` and return everything cached for it."""
        if self.key_cache[layer_idx] is None:
            self.key_cache[layer_idx], self.value_cache[layer_idx] = key_RHLc, value_RHLc
        else:
            self.key_cache[layer_idx] = torch.cat((self.key_cache[layer_idx], key_RHLc), dim=2)
            self.value_cache[layer_idx] = torch.cat((self.value_cache[layer_idx], value_RHLc), dim=2)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def get(self, layer_idx: int) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        k = self.key_cache[layer_idx]
        return 0 if k is None else k.shape[2]

    def crop(self, max_length: int) -> None:
        """Keep only the first ``max_length`` cached positions of every layer."""
        for i in range(self.num_layers):
            if self.key_cache[i] is not None:
                self.key_cache[i] = self.key_cache[i][:, :, :max_length]
                self.value_cache[i] = self.value_cache[i][:, :, :max_length]

    def batch_select_indices(self, indices: Union[Sequence[int], torch.Tensor]) -> None:
        """Keep only the rows ``indices`` (e.g. drop the unconditional CFG half)."""
        for i in range(self.num_layers):
            if self.key_cache[i] is not None:
                self.key_cache[i] = self.key_cache[i][indices]
                self.value_cache[i] = self.value_cache[i][indices]

    def reset(self) -> None:
        self.key_cache = [None] * self.num_layers
        self.value_cache = [None] * self.num_layers

    def __len__(self) -> int:
        return self.num_layers
