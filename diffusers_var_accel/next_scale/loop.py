"""The one next-scale loop shared by Infinity and HART (VAR's ``autoregressive_infer_cfg``, with extension points).

Per transformer pass (a :class:`~.plan.ScalePlan`): build the inputs of its scales from the summed latent ``f_hat``,
run the blocks with the per-call KV cache, compute logits, apply guidance, sample, turn the tokens into codes and
add them to ``f_hat``. What differs between model families (how inputs are embedded, how tokens are sampled and
become codes) lives in a :class:`~.state.ScaleModelFamily` adapter next to each model's pipeline (six steps:
``start``, ``embed``, ``run_blocks``, ``predict``, ``add_codes``, ``select_rows``); what an
acceleration method changes is *decided* by its scheduler (``plan_scales``, ``before_scale``, ``route_pass``,
``after_scale``) and carried out here and by the executor (:mod:`.executor`). Without a scheduler the loop runs
identity plans: the baseline is this same loop.

The scheduler is any object with those four methods (see
:class:`~diffusers_var_accel.schedulers.VARAccelScheduler`); this package imports nothing above it.

Shape legend: ``B`` images, ``R`` rows (``2B`` under CFG, conditional rows first), ``L`` tokens, ``C`` width.
"""

from __future__ import annotations

from typing import Callable, Hashable, List, Optional, Sequence, Tuple

import torch

from ..families import get_model_family
from .cache import ScaleKVCache
from .quantized_cache import Int8ScaleKVCache, check_kv_cache_dtype
from .context import PassRecords, VARForwardContext
from .executor import keep_residual, weight_codes
from .plan import DRAWING_PASSES_WAY_OUT, ModelInfo, PassRoutes, ScalePlan, validate_plans
from .rows import RowLayout
from .work import CallWork, PassWork
from .state import NextScaleState, ScaleModelFamily, ScheduleTables, schedule_slice


def identity_plans(scale_schedule: Sequence[Tuple[int, ...]]) -> List[ScalePlan]:
    """One dense pass per scale: the baseline."""
    return [ScalePlan((i,)) for i in range(len(scale_schedule))]


def run_next_scale_loop(
    family: ScaleModelFamily,
    condition,
    scale_schedule: Sequence[Tuple[int, ...]],
    batch_size: int,
    guidance_scales: Sequence[float],
    temperatures: Sequence[float],
    generator=None,
    scheduler=None,
    teacher_tokens: Optional[Sequence[torch.Tensor]] = None,
    on_scale_end: Optional[Callable[[int, NextScaleState], None]] = None,
    should_stop: Optional[Callable[[], bool]] = None,
    pass_runner: Optional[Callable] = None,
    tables: Optional[ScheduleTables] = None,
    kv_cache_dtype: Optional[str] = None,
) -> NextScaleState:
    """Generate the summed latent of ``batch_size`` images, scale by scale.

    Args:
        family: the model-family adapter (transformer + tokenizer steps).
        condition (`InfinityCondition` or `HARTCondition`): the family's text conditioning for all rows (conditional
            rows first, unconditional after when any guidance scale is not the family's ``no_guidance`` value).
        scale_schedule: ``(1, h, w)`` (or ``(h, w)``) per scale.
        batch_size: number of images B.
        guidance_scales: one guidance value per scale in the family's own convention (the registry's ``no_guidance``
            value, Infinity 1 and HART 0, means none); read at each scale, so a callback may change later entries.
        temperatures: one sampling temperature per scale.
        generator (`torch.Generator` or `List[torch.Generator]`, *optional*): one generator, or one per image.
        scheduler (`VARAccelScheduler`, *optional*): the acceleration scheduler; ``None`` runs identity plans.
        teacher_tokens: tokens to use instead of sampling at the first ``len(teacher_tokens)`` scales.
        on_scale_end: called after every scale with its index and the state (progress bar, user callbacks).
        should_stop: polled between passes; when it returns True the loop ends early (interrupt).
        pass_runner: runs the blocks of one pass, ``pass_runner(family, hidden_RLC, condition, context)``, instead of
            ``family.run_blocks(hidden_RLC, condition, context)`` (a compiled version of :func:`~.graphs.run_family_blocks`,
            or :class:`~.graphs.PassGraphs`). A runner with a ``kv_cache(key, num_layers, max_length, rows)`` method
            provides the call's KV cache (one per schedule, batch, rows, family, plan and scheduler configuration,
            reused across calls).
        tables (`ScheduleTables`, *optional*): constant tables that outlive the call, owned by the caller (a pipeline
            keeps one, so calls with the same schedule share their scale-id and position tables); ``None``: a fresh
            one, dropped with the call.
        kv_cache_dtype (`str`, *optional*): ``"int8"`` stores the KV cache in int8 with per-channel key and per-token
            value scales (:class:`~.quantized_cache.Int8ScaleKVCache`); ``None`` (default): in the attention's dtype.

    Returns:
        The final :class:`NextScaleState` (``f_hat``, tokens and head logits per scale).
    """
    if scheduler is not None:
        scheduler.check_model_family(family.family)
        if pass_runner is not None and getattr(scheduler, "draws_inside_passes", False):
            # refused before any pass runs (the runners refuse such a pass too, for schedulers that do not say so)
            raise ValueError(
                f"{type(scheduler).__name__} draws random numbers inside its passes, {DRAWING_PASSES_WAY_OUT}"
            )
    num_scales = len(scale_schedule)
    if len(guidance_scales) != num_scales or len(temperatures) != num_scales:
        raise ValueError(
            f"need one guidance scale and temperature per scale ({num_scales}); got {len(guidance_scales)} and {len(temperatures)}"
        )
    no_guidance = get_model_family(family.family).no_guidance
    layout = RowLayout(batch_size, guided=any(g != no_guidance for g in guidance_scales))
    scale_schedule = tuple(tuple(s) for s in scale_schedule)
    model = ModelInfo(family.num_layers, family.family)
    plans = scheduler.plan_scales(scale_schedule, model) if scheduler is not None else identity_plans(scale_schedule)
    validate_plans(plans, num_scales)
    max_length = cached_positions(family.num_start_tokens, scale_schedule, plans)
    kv_cache_dtype = check_kv_cache_dtype(kv_cache_dtype)
    workspace_cache = getattr(pass_runner, "kv_cache", None)
    if kv_cache_dtype is not None:
        if workspace_cache is not None:
            raise ValueError(
                f"kv_cache_dtype={kv_cache_dtype!r} runs its passes eagerly: captured or compiled passes keep a cache "
                "of the attention's dtype per workspace (pipe.disable_cuda_graphs(), or a pipeline without "
                "compile_passes(), or pipe.disable_kv_cache_quantization())"
            )
        kv_cache = Int8ScaleKVCache(family.num_layers, max_length=max_length, max_writes=len(plans))
    elif (
        workspace_cache is not None
    ):  # a runner replaying captured passes keeps one cache per workspace (fixed addresses)
        # plans alone do not tell methods apart (the baseline's and DepthVAR's are equal, their routes are not): the
        # scheduler's configuration, by value, is part of the workspace
        key = (family.family, scale_schedule, batch_size, layout.cache_rows, tuple(plans), scheduler_key(scheduler))
        kv_cache = workspace_cache(key, family.num_layers, max_length, layout.cache_rows)
    else:
        kv_cache = ScaleKVCache(family.num_layers, max_length=max_length)
    state = NextScaleState(scale_schedule, batch_size, layout.cache_rows, kv_cache)
    state.model, state.layout = model, layout
    state.generator = generator
    state.plans = tuple(plans)
    state.tables = tables if tables is not None else ScheduleTables()
    state.work = CallWork()
    last_run = last_block_pass(plans)

    for pass_index, plan in enumerate(plans):
        if should_stop is not None and should_stop():
            break
        state.scale_index, state.pass_index = plan.scale_indices[0], pass_index
        # no later pass reads the last pass's keys: it attends to them without keeping them
        state.kv_cache.stores = pass_index != last_run
        if scheduler is not None:
            scheduler.before_scale(state, plan)
        if plan.skip:
            state.work.passes.append(_pass_work(state, plan, None, None, family.num_start_tokens))
            for si in plan.scale_indices:
                if on_scale_end is not None:
                    on_scale_end(si, state)
            continue
        routes = scheduler.route_pass(state, plan) if scheduler is not None else None
        pass_layout = layout.for_plan(plan)
        # counted in eager passes only: a captured or compiled pass keeps its traced code free of host bookkeeping
        work = {} if pass_runner is None else None
        hidden_RLC, lengths, pass_condition = _run_pass(
            family, condition, state, plan, routes, pass_layout, pass_runner, work
        )
        state.work.passes.append(_pass_work(state, plan, pass_layout, work, family.num_start_tokens))
        offset = 0
        for si, length in zip(plan.scale_indices, lengths):
            h_scale = hidden_RLC[:, offset : offset + length]
            offset += length
            # A halved pass runs one half: its logits are that half's (CFG halving: the conditional rows stand in for
            # both, guidance has no effect; unconditional-only: the unconditional model's logits).
            guidance = no_guidance if pass_layout.halved else guidance_scales[si]
            teacher = teacher_tokens[si] if teacher_tokens is not None and si < len(teacher_tokens) else None
            residual = routes.residual_tokens.get(si) if routes is not None else None
            prediction = family.predict(
                h_scale,
                pass_condition,
                si,
                batch_size=batch_size,
                guidance=guidance,
                temperature=temperatures[si],
                generator=generator,
                residual_tokens=residual,
                tokens=teacher,
            )
            state.tokens[si], state.logits[si] = prediction.tokens, prediction.logits
            codes = prediction.codes
            if residual is not None:
                codes = keep_residual(codes, residual)  # zero residual where the scale computed nothing
            if routes is not None and si in routes.code_weights:
                codes = weight_codes(codes, routes.code_weights[si])
            state.f_hat = family.add_codes(state.f_hat, codes, si)
        if scheduler is not None:
            scheduler.after_scale(state, plan, hidden_RLC)
        state.records = PassRecords()
        for si in plan.scale_indices:
            if on_scale_end is not None:
                on_scale_end(si, state)
    state.work.kv_positions = tuple(state.kv_cache.filled()[0])
    state.work.kv_bytes = state.kv_cache.nbytes
    return state


def _pass_work(
    state: NextScaleState, plan: ScalePlan, layout: Optional[RowLayout], work, start_tokens: int
) -> PassWork:
    """The :class:`~.work.PassWork` of a pass that ran (``layout``: its rows) or was skipped (``layout`` ``None``)."""
    schedule = state.scale_schedule
    guided = state.layout.guided
    rows_run = 0 if layout is None else layout.run_rows
    unconditional = None
    if guided:
        unconditional = layout is not None and (not layout.halved or layout.run_slice.start > 0)
    scale_tokens = tuple(int(schedule[si][-2]) * int(schedule[si][-1]) for si in plan.scale_indices)
    return PassWork(
        scale_indices=tuple(plan.scale_indices),
        scale_tokens=scale_tokens,
        input_tokens=sum(start_tokens if si == 0 else n for si, n in zip(plan.scale_indices, scale_tokens)),
        skipped=layout is None,
        rows_run=rows_run,
        rows=state.layout.cache_rows,
        unconditional_ran=unconditional,
        num_layers=state.model.num_layers,
        routed=dict(work or {}),
        recorded=work is not None or layout is None,
    )


def scheduler_key(scheduler) -> Hashable:
    """What identifies ``scheduler``'s decisions by value (``scheduler.workspace_key``: its class and configuration),
    so that two schedulers with the same settings (a method name builds a new one per call) share captured passes;
    an object without one is identified by itself. ``None`` for no scheduler."""
    if scheduler is None:
        return None
    key = getattr(scheduler, "workspace_key", None)
    return key if key is not None else ("object", type(scheduler).__qualname__, id(scheduler))


def _run_pass(
    family,
    condition,
    state: NextScaleState,
    plan: ScalePlan,
    routes: Optional[PassRoutes],
    layout: RowLayout,
    pass_runner: Optional[Callable] = None,
    work: Optional[dict] = None,
):
    """Embed the inputs of the plan's scales and run the blocks once.

    Returns the hidden states (scale 0's from the last of the start tokens' outputs), the token count of each scale
    and the condition rows the pass ran on.
    """
    schedule = state.scale_schedule
    scale_hws = tuple((int(schedule[si][-2]), int(schedule[si][-1])) for si in plan.scale_indices)
    lengths = [h * w for h, w in scale_hws]
    cond_rows = family.select_rows(condition, layout.run_slice) if layout.halved else condition
    starts = plan.scale_indices[0] == 0
    later = [si for si in plan.scale_indices if si != 0]
    level_L = _schedule_scale_ids(state, state.f_hat.device, later) if later else None
    x_later, rope = family.embed(state.f_hat, plan.scale_indices, cond_rows, level_L)
    parts = [family.start(cond_rows)] if starts else []
    if later:
        parts.append(x_later.repeat(layout.run_rows // state.batch_size, 1, 1))
    x_RLC = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    num_start = family.num_start_tokens if starts else 0
    scale_ids = None
    if len(plan.scale_indices) > 1:
        scale_ids = level_L
        if starts:  # the start tokens (one or several) belong to scale 0
            start_ids = torch.zeros(num_start, dtype=torch.long, device=x_RLC.device)
            scale_ids = start_ids if level_L is None else torch.cat((start_ids, level_L.to(x_RLC.device)))
    records = PassRecords()
    context = VARForwardContext(
        call_cache=state.call_cache,
        kv_cache=state.kv_cache,
        rope_cos_sin=rope,
        token_scale_ids=scale_ids,
        routes=routes if routes else None,
        record_attention_layers=set(plan.record_attention_layers),
        attention_map=plan.attention_map,
        cache_rows=layout.cache_rows if layout.halved else None,
        cache_row_start=layout.run_slice.start if layout.halved else 0,
        scale_hws=scale_hws,
        records=records,
        work=work,
    )
    if pass_runner is None:
        hidden_RLC = family.run_blocks(x_RLC, cond_rows, context)
    else:
        hidden_RLC = pass_runner(family, x_RLC, cond_rows, context)
    if starts and num_start != lengths[0]:  # scale 0 is predicted from the last of the start tokens
        hidden_RLC = torch.cat((hidden_RLC[:, num_start - lengths[0] : num_start], hidden_RLC[:, num_start:]), dim=1)
    records.attention = context.attention_maps
    state.records = records
    return hidden_RLC, lengths, cond_rows


def last_block_pass(plans: Sequence[ScalePlan]) -> Optional[int]:
    """The index of the last pass that runs the blocks (``None``: every pass is skipped)."""
    run = [i for i, plan in enumerate(plans) if not plan.skip]
    return run[-1] if run else None


def cached_positions(
    num_start_tokens: int, scale_schedule: Sequence[Tuple[int, ...]], plans: Sequence[ScalePlan]
) -> int:
    """Positions per layer the call's KV cache is allocated for: the input tokens (``num_start_tokens`` for scale 0)
    of every pass that runs the blocks and is read by a later one, i.e. all but skipped passes and the last pass that
    runs (at least 1).

    An upper bound: a routed pass (pruned, depth-routed) keeps only the positions it computed. The cache is
    preallocated to it (fixed addresses, no ``cat``)."""
    last = last_block_pass(plans)
    total = 0
    for pass_index, plan in enumerate(plans):
        if plan.skip or pass_index == last:
            continue
        for si in plan.scale_indices:
            total += num_start_tokens if si == 0 else int(scale_schedule[si][-2]) * int(scale_schedule[si][-1])
    return max(1, total)


def kv_cache_nbytes(num_layers: int, cache_rows: int, positions: int, kv_channels: int, dtype: torch.dtype) -> int:
    """Bytes of a preallocated :class:`ScaleKVCache`: keys and values of ``positions`` positions of ``cache_rows``
    rows and ``kv_channels`` (heads x head dim) channels per layer, in ``dtype``."""
    return 2 * num_layers * cache_rows * positions * kv_channels * torch.empty((), dtype=dtype).element_size()


def _schedule_scale_ids(state: NextScaleState, device: torch.device, scale_indices: Sequence[int]) -> torch.Tensor:
    """``(L,)`` the scale index of every (non-start) token of ``scale_indices``, sliced from one table over the tokens
    of the whole schedule, filled on the device (no host data is uploaded) and kept in the call's
    :class:`~.state.ScheduleTables` (it depends only on the token counts and the device, and is never written to)."""
    scale_hws = tuple((int(s[-2]), int(s[-1])) for s in state.scale_schedule)
    table, offsets = state.tables.get(
        ("loop.scale_ids", scale_hws, str(device)), lambda: _scale_id_table(scale_hws, device)
    )
    return schedule_slice(table, offsets, scale_indices, dim=0)


def _scale_id_table(scale_hws: Tuple[Tuple[int, int], ...], device: torch.device) -> Tuple[torch.Tensor, List[int]]:
    """``(scale index of every token of the schedule, offset of each scale's first token)``."""
    lengths = [h * w for h, w in scale_hws]
    table = torch.cat([torch.full((n,), k, dtype=torch.long, device=device) for k, n in enumerate(lengths)])
    return table, [sum(lengths[:i]) for i in range(len(lengths) + 1)]
