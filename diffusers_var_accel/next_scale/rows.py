"""The CFG row layout of the next-scale loop, in one place.

Rows are ``[cond_0 .. cond_{B-1}, uncond_0 .. uncond_{B-1}]`` under classifier-free guidance, ``[cond_0 ..]``
without. A CFG-halved pass runs only the conditional rows; they stand in for the unconditional ones (in the KV cache,
in the head). An unconditional-only pass runs only the unconditional rows (their text is the null text) and samples
from their logits; they stand in for the conditional ones in the cache. Per-image choices (``(B, ...)``) are shared
by both rows of an image.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    #: which half a halved pass runs: ``"cond"`` (CFG halving) or ``"uncond"`` (unconditional-only)
    kept: str = "cond"

    def __post_init__(self):
        if self.kept not in ("cond", "uncond"):
            raise ValueError(f"kept must be 'cond' or 'uncond', got {self.kept!r}")

    @property
    def run_slice(self) -> slice:
        """The call's rows this pass runs: all of them, or the kept half."""
        B = self.batch_size
        if not self.halved:
            return slice(0, self.cache_rows)
        return slice(0, B) if self.kept == "cond" else slice(B, 2 * B)

    @property
    def cache_rows(self) -> int:
        """Rows the KV cache holds: ``2B`` under CFG, else ``B``."""
        return 2 * self.batch_size if self.guided else self.batch_size

    @property
    def run_rows(self) -> int:
        """Rows the blocks run in this pass."""
        return self.batch_size if self.halved or not self.guided else 2 * self.batch_size

    def for_pass(self, halve: bool, kept: str = "cond") -> "RowLayout":
        """The layout of a pass that halves (only under CFG) or not, keeping the ``kept`` half."""
        return RowLayout(self.batch_size, self.guided, halve and self.guided, kept)

    def for_plan(self, plan) -> "RowLayout":
        """The layout of a :class:`~.plan.ScalePlan`'s pass (``cfg_halve``: the conditional half;
        ``cfg_uncond_only``: the unconditional half)."""
        if plan.cfg_uncond_only:
            return self.for_pass(True, "uncond")
        return self.for_pass(plan.cfg_halve)
