"""The CFG row layout of the next-scale loop, in one place.

Rows are ``[cond_0 .. cond_{B-1}, uncond_0 .. uncond_{B-1}]`` under classifier-free guidance, ``[cond_0 ..]``
without. A CFG-halved pass runs only the conditional rows; they stand in for the unconditional ones (in the KV cache,
in the head). Per-image choices (``(B, ...)``) are shared by both rows of an image.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowLayout:
    """Rows of one call and of one pass.

    Args:
        batch_size: images ``B``.
        guided: the call has unconditional rows (any guidance scale is not 1).
        halved: this pass runs the conditional rows only.
    """

    batch_size: int
    guided: bool
    halved: bool = False

    @property
    def cache_rows(self) -> int:
        """Rows the KV cache holds: ``2B`` under CFG, else ``B``."""
        return 2 * self.batch_size if self.guided else self.batch_size

    @property
    def run_rows(self) -> int:
        """Rows the blocks run in this pass."""
        return self.batch_size if self.halved or not self.guided else 2 * self.batch_size

    def for_pass(self, halve: bool) -> "RowLayout":
        """The layout of a pass that halves (only under CFG) or not."""
        return RowLayout(self.batch_size, self.guided, halve and self.guided)


def match_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` with ``rows`` rows: the conditional rows when it has more (a halved pass), copies of its rows for both
    CFG halves when it has fewer (a per-image choice, or a halved source)."""
    if t.shape[0] == rows:
        return t
    if t.shape[0] > rows:
        return t[:rows]
    if rows % t.shape[0]:
        raise ValueError(f"cannot lay out {t.shape[0]} rows as {rows} (conditional rows first)")
    return t.repeat(rows // t.shape[0], *([1] * (t.dim() - 1)))
