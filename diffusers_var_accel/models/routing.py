"""The seam where acceleration reaches into a transformer block: each residual sublayer goes through the executor.

Both Infinity's and HART's blocks derive from :class:`TokenRoutedBlock` and only describe their sublayers; what is
computed where is the executor's business (:mod:`diffusers_var_accel.next_scale.executor`), so a plan works on either
model without knowing which it drives.

Shape legend: ``R`` rows, ``L`` tokens given to the block, ``C`` width.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..next_scale.context import VARForwardContext
from ..next_scale.executor import SublayerFn, run_sublayer


class TokenRoutedBlock(nn.Module):
    """A transformer block whose sublayers may run on routed tokens.

    Subclasses set ``layer_idx`` and implement :meth:`_sublayers`, calling :meth:`_routed` once per residual sublayer
    with its kind (``"self_attn"``, ``"cross_attn"``, ``"ffn"``) and a function ``compute(x, context)`` of the tokens
    it is given and the context that describes them (their RoPE table, scale ids). Whole-block routes and spans are
    carried out around the block by :func:`~diffusers_var_accel.next_scale.executor.execute_blocks`.
    """

    layer_idx: int

    def forward(self, x_RLC: torch.Tensor, condition, context: VARForwardContext) -> torch.Tensor:
        return self._sublayers(x_RLC, condition, context)

    def _sublayers(self, x: torch.Tensor, condition, context: VARForwardContext) -> torch.Tensor:
        """The block's body on the tokens ``x`` that ``context`` describes."""
        raise NotImplementedError

    def _routed(self, kind: str, x_RLC: torch.Tensor, compute: SublayerFn, context: VARForwardContext) -> torch.Tensor:
        """``x + compute(x)``, or the routed form of it (:func:`~diffusers_var_accel.next_scale.executor.run_sublayer`)."""
        return run_sublayer(self.layer_idx, kind, x_RLC, compute, context)
