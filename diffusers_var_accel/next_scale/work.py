"""What one call's passes computed, as the executor carried them out: the record behind
``pipe.acceleration_summary()``.

The executor writes, during each pass, how many tokens per row every routed layer or sublayer computed
(:func:`tally`, from index shapes: nothing is read from the device); a layer without a route computed every token of
the pass. The loop adds, per pass, its scales, whether it was skipped and which CFG rows ran, and at the end of the
call the KV positions each layer kept and the cache's bytes. Nothing here is derived from a scheduler's settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

#: The sublayers a layer's tokens are counted for (a block route counts for all three).
COUNTED_SUBLAYERS = ("self_attn", "cross_attn", "ffn")


def tally(work: Optional[Dict[Tuple[int, str], int]], layer: int, level: str, tokens: int) -> None:
    """Note that ``(layer, level)`` computed ``tokens`` tokens per row (a later, inner route's count replaces an outer
    one's: it is what the layer ran on)."""
    if work is not None:
        work[(layer, level)] = int(tokens)


@dataclass
class PassWork:
    """One pass of a call, as it ran.

    Args:
        scale_indices: the scales of the pass (more than one: grouped).
        scale_tokens: tokens of each of those scales (``h * w``).
        input_tokens: tokens per row the pass fed the blocks (scale 0: the family's start tokens).
        skipped: the pass ran no block (the plan skipped its scales).
        rows_run / rows: CFG rows the blocks ran of the call's rows (fewer: the conditional or unconditional half).
        unconditional_ran: whether the unconditional rows ran the blocks (``None``: the call has no CFG rows).
        routed: ``{(layer, "block" | sublayer): tokens per row}`` where a route acted (the rest: every token).
        recorded: the executor ran in Python (``False`` for a replayed CUDA graph, whose routes ran on the device
            without this record: its counts are unknown, not dense).
    """

    scale_indices: Tuple[int, ...]
    scale_tokens: Tuple[int, ...]
    input_tokens: int
    skipped: bool
    rows_run: int
    rows: int
    unconditional_ran: Optional[bool]
    num_layers: int
    routed: Dict[Tuple[int, str], int] = field(default_factory=dict)
    recorded: bool = True

    @property
    def tokens(self) -> int:
        """Tokens per row the pass ran through the blocks when no route acts (all its scales' inputs)."""
        return self.input_tokens

    def layer_tokens(self, sublayer: str = "self_attn") -> List[int]:
        """Tokens per row each layer's ``sublayer`` computed (0 for every layer of a skipped pass)."""
        if self.skipped:
            return [0] * self.num_layers
        return [
            self.routed.get((layer, sublayer), self.routed.get((layer, "block"), self.tokens))
            for layer in range(self.num_layers)
        ]

    def as_dict(self) -> dict:
        counted = {kind: self.layer_tokens(kind) for kind in COUNTED_SUBLAYERS}
        token_layers = sum(counted["self_attn"])
        return {
            "scales": list(self.scale_indices),
            "scale_tokens": list(self.scale_tokens),
            "input_tokens": self.tokens,
            "grouped": len(self.scale_indices) > 1,
            "skipped": self.skipped,
            "rows_run": self.rows_run,
            "rows": self.rows,
            "unconditional_ran": self.unconditional_ran,
            "tokens_computed_per_layer": counted,
            "fewest_tokens_computed": min(counted["self_attn"]) if self.num_layers else 0,
            "layers_per_token": token_layers / self.tokens if self.tokens and not self.skipped else 0.0,
            "recorded": self.recorded,
        }


@dataclass
class CallWork:
    """Every pass of one call, and the KV cache it ended with."""

    passes: List[PassWork] = field(default_factory=list)
    kv_positions: Tuple[int, ...] = ()
    kv_bytes: int = 0
