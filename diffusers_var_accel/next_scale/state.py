"""The per-call state of the next-scale loop and what the loop needs from a model family.

Everything here lives for one call and is dropped when it returns: the KV cache, the summed latent, tokens and
logits per scale, what passes recorded and each acceleration method's own typed per-call state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, TypeVar

import torch

from .cache import ScaleKVCache
from .context import PassRecords, VARForwardContext
from .plan import ModelInfo, PassRoutes, ScalePlan
from .rows import RowLayout

CallStateT = TypeVar("CallStateT")


class ScaleModelFamily:
    """What the loop needs from one model family (Infinity, HART). Each method is one step of the official sampler."""

    #: Name used to check that a scheduler was made for this family.
    family: str = ""
    num_layers: int = 0

    def start_tokens(self, condition) -> torch.Tensor:
        """Embedded tokens of scale 0, (R, L0, C)."""
        raise NotImplementedError

    def num_start_tokens(self, scale_schedule: Sequence[Tuple[int, ...]]) -> int:
        """How many tokens :meth:`start_tokens` gives per row (the KV cache is sized from it): by default one per
        token of scale 0."""
        return int(scale_schedule[0][-2]) * int(scale_schedule[0][-1])

    def embed_inputs(self, inputs_RLd: torch.Tensor, scale_index_L: torch.Tensor) -> torch.Tensor:
        """Embedded tokens of later scales from their interpolated latent inputs."""
        raise NotImplementedError

    def rope_cos_sin(self, scale_indices: Sequence[int], condition) -> torch.Tensor:
        """Positional tables of the tokens of these scales, concatenated, for the rows of ``condition``."""
        raise NotImplementedError

    def start_outputs(self, hidden_RL0C: torch.Tensor) -> torch.Tensor:
        """The hidden states that predict scale 0 from the outputs of the start tokens.

        Infinity starts from one token per row; HART starts from its T context tokens and predicts the 1x1 scale
        from the last one. The default keeps every start token.
        """
        return hidden_RL0C

    def run_blocks(self, hidden_RLC: torch.Tensor, condition, context: VARForwardContext) -> torch.Tensor:
        """The transformer blocks of one pass. Reads the call's tensors from its arguments only (never from the
        family's own attributes): a captured pass (:class:`~.graphs.PassGraphs`) treats the arguments as its inputs."""
        raise NotImplementedError

    def select_condition_rows(self, condition, rows: slice):
        raise NotImplementedError

    def guided_logits(self, hidden_RLC: torch.Tensor, condition, scale_index: int, guidance_scale: float, temperature: float, batch_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(logits to sample from, raw head output)`` at one scale: temperature and guidance applied to the first."""
        raise NotImplementedError

    def sample(self, logits_BLV: torch.Tensor, scale_index: int, generator) -> torch.Tensor:
        raise NotImplementedError

    def tokens_to_codes(self, tokens: torch.Tensor, scale_index: int, outputs: Optional["ScaleOutputs"] = None) -> torch.Tensor:
        """The latent codes ``(B, d, h, w)`` of a scale's tokens. ``outputs`` holds what else the pass produced, for
        families whose codes depend on it (HART: soft codebook mixtures and the diffusion head's residual)."""
        raise NotImplementedError

    def add_codes(self, f_hat: Optional[torch.Tensor], codes: torch.Tensor, scale_index: int) -> torch.Tensor:
        """The tokenizer's f_hat update (each tokenizer owns it, as VAR's quantiser does)."""
        raise NotImplementedError

    def next_inputs(self, f_hat: torch.Tensor, scale_index: int) -> torch.Tensor:
        """The latent input ``(B, L, d)`` of ``scale_index`` interpolated from ``f_hat``."""
        raise NotImplementedError


def schedule_slice(table: torch.Tensor, offsets: Sequence[int], scale_indices: Sequence[int], dim: int) -> torch.Tensor:
    """The entries of ``scale_indices`` in a per-call table over every token of the schedule (scale ``k`` holds
    positions ``offsets[k]:offsets[k + 1]`` along ``dim``): a view for consecutive scales, a concatenation otherwise."""
    scale_indices = list(scale_indices)
    index = [slice(None)] * dim
    if scale_indices == list(range(scale_indices[0], scale_indices[-1] + 1)):
        return table[(*index, slice(offsets[scale_indices[0]], offsets[scale_indices[-1] + 1]))]
    return torch.cat([table[(*index, slice(offsets[k], offsets[k + 1]))] for k in scale_indices], dim=dim)


@dataclass
class ScaleOutputs:
    """What one scale's pass produced besides its tokens.

    Args:
        hidden_RLC: the last block's output for this scale's tokens, every row of the pass.
        logits_BLV: the (guided) logits the tokens were sampled from.
        guidance_scale: the guidance applied at this scale (1 when none).
        generator: the token generator(s) of the call.
        condition: the condition rows the pass ran on.
        residual_tokens: ``(B, n)`` the only positions of this scale that get a residual (the others' codes are
            zero), or ``None`` for all; a family that refines codes with another head runs it only there.
    """

    hidden_RLC: torch.Tensor
    logits_BLV: torch.Tensor
    guidance_scale: float
    generator: Any
    condition: Any
    residual_tokens: Optional[torch.Tensor] = None


@dataclass
class NextScaleState:
    """Everything that lives for one call of the loop; dropped when the call returns.

    Schedulers read it in their hooks; each keeps its own per-call data in a typed object (``call_state``).
    """

    scale_schedule: Tuple[Tuple[int, ...], ...]
    batch_size: int
    rows: int
    kv_cache: ScaleKVCache
    f_hat: Optional[torch.Tensor] = None
    tokens: Dict[int, torch.Tensor] = field(default_factory=dict)
    logits: Dict[int, torch.Tensor] = field(default_factory=dict)
    records: PassRecords = field(default_factory=PassRecords)
    scale_index: int = 0
    model: Optional[ModelInfo] = None
    layout: Optional[RowLayout] = None
    plans: Tuple[ScalePlan, ...] = ()
    pass_index: int = 0
    pass_routes: Optional[PassRoutes] = None
    method_states: Dict[int, Any] = field(default_factory=dict)
    #: the call's token generator(s) (one, or one per image), as the loop was given them; methods that draw their own
    #: randomness derive their seeds from it, never consume it
    generator: Any = None
    #: per-call constants shared by every pass (``VARForwardContext.call_cache``): models and the loop fill it lazily,
    #: keyed by ``(name, layer_idx)``; gone when the call returns
    call_cache: Dict[Any, Any] = field(default_factory=dict)

    @property
    def num_scales(self) -> int:
        return len(self.scale_schedule)

    @property
    def attention_maps(self) -> Dict[int, torch.Tensor]:
        """The self-attention maps the last pass recorded (``records.attention``)."""
        return self.records.attention

    def call_state(self, owner: Any, factory: Callable[[], CallStateT]) -> CallStateT:
        """``owner``'s per-call object (made by ``factory`` on first use); gone when the call returns."""
        key = id(owner)
        if key not in self.method_states:
            self.method_states[key] = factory()
        return self.method_states[key]

    def next_plan(self) -> Optional[ScalePlan]:
        """The plan after the current pass, or ``None`` after the last."""
        return self.plans[self.pass_index + 1] if self.pass_index + 1 < len(self.plans) else None

    def previous_plan(self) -> Optional[ScalePlan]:
        """The plan of the pass before the current one, or ``None`` for the first."""
        return self.plans[self.pass_index - 1] if self.pass_index > 0 else None
