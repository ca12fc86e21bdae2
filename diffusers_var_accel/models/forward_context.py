"""What one transformer pass over the tokens of one scale (or one group of scales) needs besides the weights.

The next-scale loop builds a :class:`VARForwardContext` per pass and hands it down to the blocks, which hand it to
their attention processors. Nothing here outlives the call: the KV cache, recorded attention maps and the token
router belong to the loop's per-call state.

Shape legend: ``R`` rows (batch, doubled under CFG), ``L`` tokens of this pass, ``K`` kept tokens, ``C`` width,
``H`` heads, ``c`` head dim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Protocol, Set

import torch

from .cache import ScaleKVCache

#: The sublayer kinds a :class:`TokenRouter` is asked about. ``"block"`` routes a whole block.
SUBLAYER_KINDS = ("block", "self_attn", "cross_attn", "ffn")


class TokenRouter(Protocol):
    """Decides, per layer and sublayer, which tokens are computed and how the others are restored.

    The acceleration schedulers implement this (see ``schedulers/``); ``None`` in the context means "dense".
    """

    def select(self, layer_idx: int, sublayer: str, hidden_states_RLC: torch.Tensor) -> Optional[torch.Tensor]:
        """Indices ``(R, K)`` of the tokens that ``sublayer`` of ``layer_idx`` computes, or ``None`` for all tokens.

        ``hidden_states_RLC`` is the residual stream before the sublayer's norm.
        """

    def restore(
        self, layer_idx: int, sublayer: str, computed_RKC: torch.Tensor, index_RK: torch.Tensor, hidden_states_RLC: torch.Tensor
    ) -> torch.Tensor:
        """Fill in the tokens that were not computed.

        For a sublayer, ``computed_RKC`` is its residual update of the kept tokens and the return value is the full
        ``(R, L, C)`` update (added to ``hidden_states_RLC``). For ``"block"``, ``computed_RKC`` is the block's output
        of the kept tokens and the return value is the block's full output (so "keep the input" and "overwrite with
        a cached canvas" are both exact).
        """


@dataclass
class VARForwardContext:
    """Per-pass inputs of the transformer blocks.

    Args:
        kv_cache (`ScaleKVCache`, *optional*): keys/values of the earlier scales; this pass appends its own.
        rope_cos_sin (`torch.Tensor`): ``(2, 1 or R, 1, L, d)`` cosines and sines of the RoPE angles of this pass's
            tokens (Infinity: ``d = c/2``, shared by all rows; HART: ``d = c``, one table per row).
        token_scale_ids (`torch.Tensor`, *optional*): ``(L,)`` scale index of every token when several scales are
            decoded in one pass; self-attention then applies the block-causal mask (a token sees the cache, and the
            tokens of its own and earlier scales). ``None`` for a single scale (all keys visible).
        token_router (`TokenRouter`, *optional*): sparse computation; ``None`` computes every token.
        record_attention_layers (`set[int]`): layers whose self-attention probabilities are stored in
            ``attention_maps`` (explicit softmax instead of the fused kernel).
        attention_map (`str`): ``"key_mean"`` stores ``(R, S)``, the attention each key receives averaged over heads
            and queries; ``"full"`` stores the ``(R, H, L, S)`` probabilities.
        cache_rows (`int`, *optional*): rows held by the KV cache when the blocks run fewer rows (CFG halving: only
            the conditional half runs, and its keys/values are copied to the unconditional rows of the cache).
    """

    kv_cache: Optional[ScaleKVCache]
    rope_cos_sin: torch.Tensor
    token_scale_ids: Optional[torch.Tensor] = None
    token_router: Optional[TokenRouter] = None
    record_attention_layers: Set[int] = field(default_factory=set)
    attention_maps: Dict[int, torch.Tensor] = field(default_factory=dict)
    attention_map: str = "key_mean"
    cache_rows: Optional[int] = None


def gather_tokens(x_RLC: torch.Tensor, index_RK: torch.Tensor) -> torch.Tensor:
    """``x[r, index[r, k]]`` for every row: the kept tokens, in index order."""
    return torch.gather(x_RLC, 1, index_RK.unsqueeze(-1).expand(-1, -1, x_RLC.shape[-1]))


def scatter_tokens(canvas_RLC: torch.Tensor, index_RK: torch.Tensor, values_RKC: torch.Tensor) -> torch.Tensor:
    """A copy of ``canvas`` with the kept tokens overwritten by ``values``."""
    return canvas_RLC.scatter(1, index_RK.unsqueeze(-1).expand(-1, -1, canvas_RLC.shape[-1]), values_RKC.to(canvas_RLC.dtype))


def gather_rope(rope_cos_sin: torch.Tensor, index_RK: torch.Tensor) -> torch.Tensor:
    """The RoPE table of the kept tokens: ``(2, 1 or R, 1, L, d)`` -> ``(2, R, 1, K, d)``.

    A table shared by all rows (Infinity) is indexed directly; per-row tables (HART, whose positions depend on each
    row's text length) are gathered row by row.
    """
    table_RLD = rope_cos_sin[:, :, 0]  # (2, 1 or R, L, d)
    R, K = index_RK.shape
    d = table_RLD.shape[-1]
    if table_RLD.shape[1] == 1:
        gathered = table_RLD[:, 0, index_RK.reshape(-1)]  # (2, R*K, d)
        return gathered.view(2, R, 1, K, d)
    index = index_RK.view(1, R, K, 1).expand(2, R, K, d)
    return torch.gather(table_RLD, 2, index).unsqueeze(2)


def gather_scale_ids(token_scale_ids: Optional[torch.Tensor], index_RK: torch.Tensor) -> Optional[torch.Tensor]:
    """Scale ids of the kept tokens, ``(R, K)``, or ``None`` for a single-scale pass."""
    return None if token_scale_ids is None else token_scale_ids[index_RK]


def block_causal_mask(cache_length: int, scale_ids: torch.Tensor) -> torch.Tensor:
    """Boolean mask (True = visible) of a grouped pass: every cached key, plus keys of the same or earlier scales.

    ``scale_ids`` is ``(L,)`` for all tokens of the pass (mask ``(L, cache + L)``) or ``(R, K)`` for routed tokens
    (mask ``(R, 1, K, cache + K)``, one per row since rows may keep different tokens).
    """
    within = scale_ids.unsqueeze(-1) >= scale_ids.unsqueeze(-2)  # query scale >= key scale
    cache = torch.ones(*within.shape[:-1], cache_length, dtype=torch.bool, device=scale_ids.device)
    mask = torch.cat((cache, within), dim=-1)
    return mask if scale_ids.dim() == 1 else mask.unsqueeze(1)
