"""Per-position maps for the decisions of acceleration methods: resizing a score map to a scale, marking and
reading positions. Schedulers compute their scores, selections, budgets and depths with these; they move no token
(that is the executor's work, :mod:`.executor`).

Shape legend: ``B`` images (or rows), ``H W`` a source map, ``h w`` a scale, ``l = h w``, ``n`` selected positions.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F

from .executor import interpolate_tokens

__all__ = ["resize_map", "resize_token_map", "position_mask", "cells_marked", "values_at", "unpermute", "place_values"]


def resize_map(map_BHW: torch.Tensor, hw: Tuple[int, int], mode: str) -> torch.Tensor:
    """A per-position map resized to ``hw`` in fp32 (``"area"`` averages; ``"bilinear"`` without corner alignment):
    ``(B, h * w)``."""
    align = False if mode in ("bilinear", "bicubic") else None
    return F.interpolate(map_BHW.unsqueeze(1).float(), size=tuple(hw), mode=mode, align_corners=align).flatten(1)


def resize_token_map(
    values_Bl: torch.Tensor, source_hw: Tuple[int, int], hw: Tuple[int, int], mode: str
) -> torch.Tensor:
    """One value per token of an ``h x w`` map, interpolated (in fp32) to ``hw``: ``(B, h_out * w_out)``."""
    return interpolate_tokens(values_Bl.unsqueeze(-1), source_hw, hw, mode, in_float32=True)[..., 0]


def position_mask(index_Bn: torch.Tensor, num_positions: int) -> torch.Tensor:
    """``(B, l)`` booleans, True at the positions ``index``."""
    B = index_Bn.shape[0]
    return torch.zeros(B, num_positions, dtype=torch.bool, device=index_Bn.device).scatter_(1, index_Bn, True)


def cells_marked(mask_BP: torch.Tensor, cell_P: torch.Tensor, num_cells: int) -> torch.Tensor:
    """``(B, num_cells)``: True where any position ``p`` with ``cell[p] == c`` is marked."""
    B = mask_BP.shape[0]
    cells = cell_P.expand(B, -1)
    return torch.zeros(B, num_cells, device=mask_BP.device).scatter_reduce(1, cells, mask_BP.float(), "amax") > 0


def values_at(values_Bl: torch.Tensor, index_Bn: torch.Tensor) -> torch.Tensor:
    """``values[b, index[b, k]]``: ``(B, n)`` (an index broadcast over rows is expanded)."""
    return torch.gather(values_Bl, 1, index_Bn.expand(values_Bl.shape[0], -1))


def unpermute(values_by_rank_BN: torch.Tensor, order_BN: torch.Tensor) -> torch.Tensor:
    """Per position, the value of its rank: ``out[b, order[b, r]] = values[b, r]`` (``order`` maps rank -> position)."""
    return torch.empty_like(values_by_rank_BN).scatter_(1, order_BN, values_by_rank_BN)


def place_values(base_BN: torch.Tensor, index_Bn: torch.Tensor, values_Bn: torch.Tensor) -> torch.Tensor:
    """A copy of ``base`` with ``values`` at the positions ``index``."""
    return base_BN.scatter(1, index_Bn, values_Bn.to(base_BN.dtype))
