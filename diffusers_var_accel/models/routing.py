"""The seam where acceleration methods reach into a transformer block: compute a subset of tokens, restore the rest.

Both Infinity's and HART's blocks derive from :class:`TokenRoutedBlock` and only describe their sublayers; the
routing below is shared, so a scheduler's token router works on either model without knowing which it drives.

Shape legend: ``R`` rows, ``L`` tokens of the pass, ``K`` kept tokens, ``C`` width.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn

from .forward_context import VARForwardContext, gather_tokens

#: ``compute(x_sub_RKC, index_RK or None) -> residual update`` of one sublayer.
SublayerFn = Callable[[torch.Tensor, Optional[torch.Tensor]], torch.Tensor]


class TokenRoutedBlock(nn.Module):
    """A transformer block whose whole body or each sublayer may run on router-selected tokens.

    Subclasses set ``layer_idx`` and implement :meth:`_sublayers`, calling :meth:`_routed` once per residual sublayer
    with its kind (``"self_attn"``, ``"cross_attn"``, ``"ffn"``). The router (``context.token_router``) is asked first
    about ``"block"`` (restore returns the block's full output), then about every sublayer (restore returns the full
    residual update). Without a router every token is computed and nothing else happens.
    """

    layer_idx: int

    def forward(self, x_RLC: torch.Tensor, condition, context: VARForwardContext) -> torch.Tensor:
        router = context.token_router
        if router is not None:
            index_RK = router.select(self.layer_idx, "block", x_RLC)
            if index_RK is not None:
                x_RKC = gather_tokens(x_RLC, index_RK)
                out_RKC = self._sublayers(x_RKC, condition, context, index_RK, route=False) if index_RK.shape[1] else x_RKC
                return router.restore(self.layer_idx, "block", out_RKC, index_RK, x_RLC)
        return self._sublayers(x_RLC, condition, context, None, route=router is not None)

    def _sublayers(self, x: torch.Tensor, condition, context: VARForwardContext, block_index: Optional[torch.Tensor],
                   route: bool) -> torch.Tensor:
        """The block's body on ``x``: all tokens of the pass, or the tokens ``block_index`` a block router kept."""
        raise NotImplementedError

    def _routed(self, kind: str, x_RLC: torch.Tensor, compute: SublayerFn, context: VARForwardContext, route: bool) -> torch.Tensor:
        """``x + compute(x)``, or, when the router selects tokens, ``x + restore(compute(x[kept]))``."""
        if route:
            index_RK = context.token_router.select(self.layer_idx, kind, x_RLC)
            if index_RK is not None:
                if index_RK.shape[1] == 0:  # nothing kept: the router restores every token
                    update_RKC = x_RLC.new_zeros(x_RLC.shape[0], 0, x_RLC.shape[2])
                else:
                    update_RKC = compute(gather_tokens(x_RLC, index_RK), index_RK)
                return x_RLC + context.token_router.restore(self.layer_idx, kind, update_RKC, index_RK, x_RLC)
        return x_RLC + compute(x_RLC, None)
