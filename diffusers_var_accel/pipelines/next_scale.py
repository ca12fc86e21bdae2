"""The one next-scale loop shared by Infinity and HART (VAR's ``autoregressive_infer_cfg``, with extension points).

Per transformer pass (a :class:`~diffusers_var_accel.schedulers.ScalePlan`): build the inputs of its scales from the
summed latent ``f_hat``, run the blocks with the per-call KV cache, compute logits, apply guidance, sample, turn the
tokens into codes and add them to ``f_hat``. What differs between model families (how inputs are embedded, how
tokens are sampled and become codes) lives in a :class:`ScaleModelFamily` adapter next to each model's pipeline;
what an acceleration method changes is decided by the scheduler (``plan_scales``, ``before_scale``,
``token_router``, ``after_scale``) and carried out here and in the blocks.

Shape legend: ``B`` images, ``R`` rows (``2B`` under CFG, conditional rows first), ``L`` tokens, ``C`` width.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch

from ..models.cache import ScaleKVCache
from ..models.forward_context import VARForwardContext
from ..schedulers.scheduling_var_base import IdentityScheduler, ScalePlan, VARAccelScheduler, validate_plans


class ScaleModelFamily:
    """What the loop needs from one model family (Infinity, HART). Each method is one step of the official sampler."""

    #: Name used to check that a scheduler was made for this family.
    family: str = ""
    num_layers: int = 0

    def start_tokens(self, condition) -> torch.Tensor:
        """Embedded tokens of scale 0, (R, L0, C)."""
        raise NotImplementedError

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


@dataclass
class ScaleOutputs:
    """What one scale's pass produced besides its tokens.

    Args:
        hidden_RLC: the last block's output for this scale's tokens, every row of the pass.
        logits_BLV: the (guided) logits the tokens were sampled from.
        guidance_scale: the guidance applied at this scale (1 when none).
        generator: the token generator(s) of the call.
        condition: the condition rows the pass ran on.
    """

    hidden_RLC: torch.Tensor
    logits_BLV: torch.Tensor
    guidance_scale: float
    generator: Any
    condition: Any


@dataclass
class NextScaleState:
    """Everything that lives for one call of the loop; dropped when the call returns.

    Schedulers read it in their hooks and may keep their own per-call data in ``scheduler_data``.
    """

    scale_schedule: Tuple[Tuple[int, ...], ...]
    batch_size: int
    rows: int
    kv_cache: ScaleKVCache
    f_hat: Optional[torch.Tensor] = None
    tokens: Dict[int, torch.Tensor] = field(default_factory=dict)
    logits: Dict[int, torch.Tensor] = field(default_factory=dict)
    attention_maps: Dict[int, torch.Tensor] = field(default_factory=dict)
    scheduler_data: Dict[str, Any] = field(default_factory=dict)
    scale_index: int = 0

    @property
    def num_scales(self) -> int:
        return len(self.scale_schedule)


def run_next_scale_loop(
    family: ScaleModelFamily,
    condition,
    scale_schedule: Sequence[Tuple[int, ...]],
    batch_size: int,
    guidance_scales: Sequence[float],
    temperatures: Sequence[float],
    generator=None,
    scheduler: Optional[VARAccelScheduler] = None,
    teacher_tokens: Optional[Sequence[torch.Tensor]] = None,
    on_scale_end: Optional[Callable[[int, NextScaleState], None]] = None,
    should_stop: Optional[Callable[[], bool]] = None,
) -> NextScaleState:
    """Generate the summed latent of ``batch_size`` images, scale by scale.

    Args:
        family: the model-family adapter (transformer + tokenizer steps).
        condition (`InfinityCondition` or `HARTCondition`): the family's text conditioning for all rows (conditional
            rows first, unconditional after when any guidance scale is not 1).
        scale_schedule: ``(1, h, w)`` (or ``(h, w)``) per scale.
        batch_size: number of images B.
        guidance_scales: one CFG scale per scale.
        temperatures: one sampling temperature per scale.
        generator (`torch.Generator` or `List[torch.Generator]`, *optional*): one generator, or one per image.
        scheduler: the acceleration scheduler; ``None`` is :class:`IdentityScheduler`.
        teacher_tokens: tokens to use instead of sampling at the first ``len(teacher_tokens)`` scales.
        on_scale_end: called after every scale with its index and the state (progress bar, user callbacks).
        should_stop: polled between passes; when it returns True the loop ends early (interrupt).

    Returns:
        The final :class:`NextScaleState` (``f_hat``, tokens and head logits per scale).
    """
    scheduler = scheduler if scheduler is not None else IdentityScheduler()
    scheduler.check_model_family(family.family)
    num_scales = len(scale_schedule)
    if len(guidance_scales) != num_scales or len(temperatures) != num_scales:
        raise ValueError(f"need one guidance scale and temperature per scale ({num_scales}); got {len(guidance_scales)} and {len(temperatures)}")
    use_cfg = any(g != 1 for g in guidance_scales)
    rows = 2 * batch_size if use_cfg else batch_size
    state = NextScaleState(tuple(tuple(s) for s in scale_schedule), batch_size, rows, ScaleKVCache(family.num_layers))
    plans = scheduler.plan_scales(state.scale_schedule)
    validate_plans(plans, num_scales)

    for plan in plans:
        if should_stop is not None and should_stop():
            break
        state.scale_index = plan.scale_indices[0]
        scheduler.before_scale(state, plan)
        if plan.skip:
            for si in plan.scale_indices:
                if on_scale_end is not None:
                    on_scale_end(si, state)
            continue
        hidden_RLC, lengths, pass_condition = _run_pass(family, condition, state, plan, scheduler, use_cfg)
        halved = plan.cfg_halve and use_cfg
        offset = 0
        for si, length in zip(plan.scale_indices, lengths):
            h_scale = hidden_RLC[:, offset:offset + length]
            offset += length
            # Under CFG halving the unconditional rows are copies of the conditional ones: guidance has no effect.
            cfg = 1.0 if halved else guidance_scales[si]
            logits, state.logits[si] = family.guided_logits(h_scale, pass_condition, si, cfg, temperatures[si], batch_size)
            if teacher_tokens is not None and si < len(teacher_tokens):
                tokens = teacher_tokens[si]
            else:
                tokens = family.sample(logits, si, generator)
            state.tokens[si] = tokens
            outputs = ScaleOutputs(h_scale, logits, cfg, generator, pass_condition)
            codes = scheduler.restore_codes(state, si, family.tokens_to_codes(tokens, si, outputs))
            state.f_hat = family.add_codes(state.f_hat, codes, si)
        scheduler.after_scale(state, plan, hidden_RLC)
        state.attention_maps = {}
        for si in plan.scale_indices:
            if on_scale_end is not None:
                on_scale_end(si, state)
    return state


def _run_pass(family, condition, state: NextScaleState, plan: ScalePlan, scheduler: VARAccelScheduler, use_cfg: bool):
    """Embed the inputs of the plan's scales and run the blocks once.

    Returns the hidden states, the token count of each scale and the condition rows the pass ran on.
    """
    schedule = state.scale_schedule
    lengths = [int(schedule[si][-2] * schedule[si][-1]) for si in plan.scale_indices]
    input_lengths = list(lengths)
    halve = plan.cfg_halve and use_cfg
    cond_rows = family.select_condition_rows(condition, slice(0, state.batch_size)) if halve else condition
    run_rows = state.batch_size if halve else state.rows
    parts = []
    if plan.scale_indices[0] == 0:
        start_RLC = family.start_tokens(cond_rows)
        input_lengths[0] = start_RLC.shape[1]  # the start tokens need not be one per output token (HART's context)
        parts.append(start_RLC)
    later = [si for si in plan.scale_indices if si != 0]
    if later:
        inputs_BLd = torch.cat([family.next_inputs(state.f_hat, si) for si in later], dim=1)
        later_lengths = input_lengths[len(plan.scale_indices) - len(later):]
        level_L = torch.repeat_interleave(
            torch.tensor(later, device=inputs_BLd.device), torch.tensor(later_lengths, device=inputs_BLd.device),
            output_size=sum(later_lengths),
        )
        x_later = family.embed_inputs(inputs_BLd, level_L)
        parts.append(x_later.repeat(run_rows // state.batch_size, 1, 1))
    x_RLC = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    scale_ids = None
    if len(plan.scale_indices) > 1:
        scale_ids = torch.repeat_interleave(
            torch.tensor(plan.scale_indices, device=x_RLC.device), torch.tensor(input_lengths, device=x_RLC.device),
            output_size=sum(input_lengths),
        )
    context = VARForwardContext(
        kv_cache=state.kv_cache,
        rope_cos_sin=family.rope_cos_sin(plan.scale_indices, cond_rows),
        token_scale_ids=scale_ids,
        token_router=scheduler.token_router(state, plan),
        record_attention_layers=set(plan.record_attention_layers),
        attention_map=plan.attention_map,
        cache_rows=state.rows if halve else None,
    )
    hidden_RLC = family.run_blocks(x_RLC, cond_rows, context)
    if plan.scale_indices[0] == 0 and input_lengths[0] != lengths[0]:
        start = family.start_outputs(hidden_RLC[:, :input_lengths[0]])
        hidden_RLC = torch.cat((start, hidden_RLC[:, input_lengths[0]:]), dim=1)
    state.attention_maps = context.attention_maps
    return hidden_RLC, lengths, cond_rows
