"""The shared next-scale loop's extension points, exercised with small test schedulers on the official tiny model.

Each test compares an extension point's effect with what it must be: routing every token is bit-identical to the
dense path, a grouped pass leaves its first scale unchanged (block-causal mask), CFG halving equals guidance 1 at
that scale, recorded attention maps are probability rows, skipped scales add no codes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from diffusers_var_accel import (
    IdentityScheduler,
    InfinityBSQVAE,
    InfinityTransformer,
    ScalePlan,
    VARAccelScheduler,
    run_next_scale_loop,
)
from diffusers_var_accel.next_scale.plan import PassRoutes, TokenRoute
from diffusers_var_accel.models.infinity_resolutions import rope_grid_hw, schedule_for_size
from diffusers_var_accel.pipelines.infinity import InfinityScaleFamily
from diffusers_var_accel.schedulers.scheduling_var_base import validate_plans

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "infinity"
HEIGHT = WIDTH = 256
SCHEDULE, TEMPLATE = schedule_for_size(HEIGHT, WIDTH)
S = len(SCHEDULE)


@pytest.fixture(scope="module")
def models():
    transformer = InfinityTransformer.from_original_checkpoint(FIXTURE / "infinity_tiny.pth")
    vae = InfinityBSQVAE.from_original_checkpoint(FIXTURE / "vae_tiny.pth")
    return transformer, vae


def _condition(transformer, batch=2, guided=True):
    g = torch.Generator().manual_seed(3)
    text = torch.randn(batch, 6, transformer.config.text_channels, generator=g)
    mask = torch.ones(batch, 6, dtype=torch.bool)
    mask[1:, 4:] = False  # a padded row
    if guided:
        text, mask = torch.cat((text, transformer.null_text_embeds(mask))), torch.cat((mask, mask))
    return transformer.encode_condition(text, mask)


def _run(models, scheduler=None, cfg=3.0, cfg_list=None, teacher=None, batch=2, top_k=1, tables=None):
    transformer, vae = models
    family = InfinityScaleFamily(transformer, vae, SCHEDULE, rope_grid_hw(TEMPLATE), top_k=top_k, top_p=None)
    cfgs = list(cfg_list) if cfg_list is not None else [cfg] * S
    with torch.no_grad():
        return run_next_scale_loop(
            family,
            _condition(transformer, batch, any(c != 1 for c in cfgs)),
            SCHEDULE,
            batch,
            cfgs,
            [0.5] * S,
            torch.Generator().manual_seed(0),
            scheduler,
            teacher,
            tables=tables,
        )


def _teacher(batch=2, d=8):
    g = torch.Generator().manual_seed(11)
    return [torch.randint(0, 2, (batch, h * w, d), generator=g) for _, h, w in SCHEDULE]


class _Selector:
    """A token selector that logs the layers and sublayers it is asked about."""

    def __init__(self, keep, key, calls):
        self.keep, self.key, self.calls = keep, key, calls

    def __call__(self, x):
        self.calls.append(self.key)
        return self.keep(*self.key, x)


def _routes(keep, kinds, num_layers, calls):
    """Routes of every layer's ``kinds`` to ``keep(layer, kind, x)``; the others pass through (a block keeps its input,
    a sublayer adds a zero update). Block routes share one selector, so they form one span."""
    routes = {}
    for kind in kinds:
        shared = _Selector(keep, (0, kind), calls) if kind == "block" else None
        for layer in range(num_layers):
            routes[(layer, kind)] = TokenRoute(selector=shared or _Selector(keep, (layer, kind), calls))
    return routes


class _PlanScheduler(VARAccelScheduler):
    """Test scheduler: fixed plans, routes for chosen scales, and a log of after_scale calls."""

    def __init__(self, plans=None, routes_at=None, routes=None, code_weights=None):
        super().__init__()
        self._plans, self.routes_at, self.routes, self.after = plans, routes_at or set(), routes, []
        self.code_weights = code_weights

    def plan_scales(self, scale_schedule, model=None):
        return self._plans if self._plans is not None else super().plan_scales(scale_schedule, model)

    def route_pass(self, state, plan):
        routes = PassRoutes()
        if plan.scale_indices[0] in self.routes_at:
            routes.routes = self.routes(state)
        if self.code_weights is not None:
            routes.code_weights = self.code_weights(state, plan)
        return routes or None

    def after_scale(self, state, plan, hidden):
        self.after.append(
            (plan.scale_indices, hidden.shape, state.kv_cache.get_seq_length(0), dict(state.attention_maps))
        )


def test_identity_scheduler_is_the_default(models):
    a, b = _run(models), _run(models, IdentityScheduler())
    assert torch.equal(a.f_hat, b.f_hat)
    assert all(torch.equal(a.logits[i], b.logits[i]) for i in range(S))


def test_routing_every_token_is_bit_identical_to_dense(models):
    def everything(layer, kind, x):
        return torch.arange(x.shape[1]).expand(x.shape[0], -1)

    depth = models[0].config.depth
    for kinds in ({"block"}, {"self_attn", "cross_attn", "ffn"}):
        calls = []
        sched = _PlanScheduler(
            routes_at=set(range(1, S)), routes=lambda state, kinds=kinds: _routes(everything, kinds, depth, calls)
        )
        routed = _run(models, sched)
        dense = _run(models)
        assert torch.equal(routed.f_hat, dense.f_hat)
        assert all(torch.equal(routed.logits[i], dense.logits[i]) for i in range(S))
        assert {k for _, k in calls} >= kinds


def test_block_routes_of_one_index_form_one_span(models):
    """Consecutive block routes with the same tokens are gathered once: the selector runs once per pass."""
    keep, depth, calls = 5, models[0].config.depth, []
    sched = _PlanScheduler(
        routes_at={S - 1},
        routes=lambda state: _routes(
            lambda l, k, x: torch.arange(keep).expand(x.shape[0], -1), {"block"}, depth, calls
        ),
    )
    _run(models, sched)
    assert depth > 1 and calls == [(0, "block")]


def test_routing_a_subset_caches_only_kept_tokens_and_changes_the_output(models):
    keep, calls = 5, []
    sched = _PlanScheduler(
        routes_at={S - 2},
        routes=lambda state: _routes(
            lambda l, k, x: torch.arange(keep).expand(x.shape[0], -1), {"block"}, models[0].config.depth, calls
        ),
    )
    out = _run(models, sched)
    dense = _run(models)
    before = sum(h * w for _, h, w in SCHEDULE[:-2])
    assert sched.after[-2][2] == before + keep  # the routed scale appended only the kept tokens' K/V
    assert sched.after[-1][2] == before + keep  # and the last scale, read by no later pass, appended nothing
    assert not torch.equal(out.f_hat, dense.f_hat)
    torch.testing.assert_close(out.logits[S - 3], dense.logits[S - 3], atol=0, rtol=0)


def test_grouped_scales_use_a_block_causal_mask(models):
    teacher = _teacher()
    plans = [ScalePlan((i,)) for i in range(S - 2)] + [ScalePlan((S - 2, S - 1))]
    grouped = _run(models, _PlanScheduler(plans=plans), teacher=teacher)
    sequential = _run(models, teacher=teacher)
    # the first scale of the group sees the cache and itself only: same logits as the sequential loop
    torch.testing.assert_close(grouped.logits[S - 2], sequential.logits[S - 2], atol=1e-5, rtol=1e-5)
    # the second scale's input is approximated from f_hat before the group, so it differs
    assert not torch.allclose(grouped.logits[S - 1], sequential.logits[S - 1], atol=1e-3)
    assert torch.equal(grouped.f_hat, sequential.f_hat)  # teacher-forced codes: same summed latent


def test_routing_every_token_of_a_grouped_pass_is_bit_identical(models):
    """Routed tokens of a grouped pass get the gathered block-causal mask (one per row)."""
    teacher = _teacher()
    plans = [ScalePlan((i,)) for i in range(S - 3)] + [ScalePlan((S - 3, S - 2, S - 1))]

    # rows keep all tokens, in a row-dependent order, so the per-row mask gather is exercised
    def keep(layer, kind, x):
        index = torch.arange(x.shape[1]).expand(x.shape[0], -1).clone()
        index[1::2] = index[1::2].flip(-1)
        return index

    def routes(state):
        return _routes(keep, {"block"}, models[0].config.depth, [])

    routed = _run(models, _PlanScheduler(plans=plans, routes_at={S - 3}, routes=routes), teacher=teacher)
    dense = _run(models, _PlanScheduler(plans=plans), teacher=teacher)
    for si in range(S - 3, S):
        torch.testing.assert_close(routed.logits[si], dense.logits[si], atol=1e-5, rtol=1e-5)


def test_code_weights_feed_f_hat(models):
    def zero_last(state, plan):
        _, h, w = SCHEDULE[S - 1]
        return {S - 1: torch.zeros(state.batch_size, h, w)} if plan.scale_indices[0] == S - 1 else {}

    teacher = _teacher()
    zeroed = _run(models, _PlanScheduler(code_weights=zero_last), teacher=teacher)
    plans = [ScalePlan((i,)) for i in range(S - 1)] + [ScalePlan((S - 1,), skip=True)]
    skipped = _run(models, _PlanScheduler(plans=plans), teacher=teacher)
    torch.testing.assert_close(zeroed.f_hat, skipped.f_hat, atol=0, rtol=0)


def test_cfg_halving_equals_guidance_one_at_that_scale(models):
    plans = [ScalePlan((i,)) for i in range(S - 1)] + [ScalePlan((S - 1,), cfg_halve=True)]
    halved = _run(models, _PlanScheduler(plans=plans))
    reference = _run(models, cfg_list=[3.0] * (S - 1) + [1.0])
    assert halved.logits[S - 1].shape[0] == 2  # only the conditional rows went through the blocks and head
    # the halved pass runs 2 rows, the reference 4: batched fp32 GEMMs round differently (7.6e-6 on MKL's AVX2
    # kernels, 0 on its AVX-512 ones), so equal up to that rounding
    torch.testing.assert_close(halved.logits[S - 1], reference.logits[S - 1], atol=3e-5, rtol=0)
    assert torch.equal(halved.f_hat, reference.f_hat)


@pytest.mark.parametrize("last", [1, 3])
def test_unconditional_only_passes_equal_guidance_zero_there(models, last):
    """A pass that runs only the unconditional rows (null text, their AdaLN and head condition, their own KV history)
    samples the unconditional model, which Infinity's ``cfg c + (1 - cfg) u`` gives at cfg 0 with both rows: the
    same logits up to batched-GEMM rounding and the same tokens, at every such scale (each row attends only to its
    own history, so the conditional rows the reference still runs do not matter)."""
    plans = [ScalePlan((i,)) for i in range(S - last)] + [
        ScalePlan((i,), cfg_uncond_only=True) for i in range(S - last, S)
    ]
    uncond = _run(models, _PlanScheduler(plans=plans))
    reference = _run(models, cfg_list=[3.0] * (S - last) + [0.0] * last)
    for k in range(S):
        if k < S - last:
            assert torch.equal(uncond.logits[k], reference.logits[k])
        else:
            assert uncond.logits[k].shape[0] == 2  # the unconditional rows only went through the blocks and head
            torch.testing.assert_close(uncond.logits[k], reference.logits[k][2:], atol=3e-5, rtol=0)
        assert torch.equal(uncond.tokens[k], reference.tokens[k])
    assert torch.equal(uncond.f_hat, reference.f_hat)
    # the conditional rows' logits differ there: it is the other half that ran
    assert not torch.allclose(uncond.logits[S - 1], reference.logits[S - 1][:2], atol=1e-3)


def test_branch_rules_are_exclusive_and_unconditional_only_ends_the_passes():
    from diffusers_var_accel.next_scale.plan import validate_plans

    with pytest.raises(ValueError, match="two branch rules"):
        ScalePlan((3,), cfg_halve=True, cfg_uncond_only=True)
    plans = [ScalePlan((0,)), ScalePlan((1,), cfg_uncond_only=True), ScalePlan((2,))]
    with pytest.raises(ValueError, match=r"plan \(2,\) runs both CFG rows after the unconditional-only plan \(1,\)"):
        validate_plans(plans, 3)
    validate_plans(
        [ScalePlan((0,)), ScalePlan((1,), cfg_uncond_only=True), ScalePlan((2,), skip=True)], 3
    )  # a skip may follow


def test_recorded_attention_maps_are_probabilities(models):
    plans = [
        ScalePlan((i,), record_attention_layers=frozenset({0}) if i == 3 else frozenset(), attention_map="full")
        for i in range(S)
    ]
    sched = _PlanScheduler(plans=plans)
    out = _run(models, sched)
    dense = _run(models)
    maps = {idx: m for idx, _, _, m in sched.after}
    probs = maps[(3,)][0]
    L = SCHEDULE[3][1] * SCHEDULE[3][2]
    kv = sum(h * w for _, h, w in SCHEDULE[:4])
    assert probs.shape == (4, transformer_heads(models), L, kv)
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]), atol=1e-5, rtol=0)
    assert all(m == {} for idx, _, _, m in sched.after if idx != (3,))
    torch.testing.assert_close(out.logits[3], dense.logits[3], atol=1e-4, rtol=1e-5)


def test_recorded_attention_key_mean_is_the_reduced_full_map(models):
    maps = {}
    for kind in ("full", "key_mean"):
        plans = [
            ScalePlan((i,), record_attention_layers=frozenset({1}) if i == 4 else frozenset(), attention_map=kind)
            for i in range(S)
        ]
        sched = _PlanScheduler(plans=plans)
        _run(models, sched)
        maps[kind] = {idx: m for idx, _, _, m in sched.after}[(4,)][1]
    probs, reduced = maps["full"], maps["key_mean"]
    assert reduced.shape == (probs.shape[0], probs.shape[-1]) and reduced.dtype == torch.float32
    torch.testing.assert_close(reduced, probs.mean(dim=(1, 2)), atol=1e-7, rtol=1e-6)
    with pytest.raises(ValueError, match="attention_map"):
        ScalePlan((1,), attention_map="sum")


def transformer_heads(models):
    return models[0].config.num_heads


def test_skipped_scales_add_no_codes(models):
    teacher = _teacher()
    plans = [ScalePlan((i,)) for i in range(S - 1)] + [ScalePlan((S - 1,), skip=True)]
    skipped = _run(models, _PlanScheduler(plans=plans), teacher=teacher)
    full = _run(models, teacher=teacher)
    assert S - 1 not in skipped.tokens
    last_codes = models[1].add_scale_codes(
        None, models[1].bits_to_codes(teacher[-1].reshape(2, 16, 16, -1)), (16, 16), True
    )
    torch.testing.assert_close(skipped.f_hat + last_codes, full.f_hat, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "plans, message",
    [
        ([ScalePlan((i,)) for i in range(S - 1)] + [ScalePlan((S - 1, S))], "crosses the last scale"),
        ([ScalePlan((0,)), ScalePlan((2,))], "out of order"),
        ([ScalePlan((0, 1))], "scale 0"),
        ([ScalePlan((i,)) for i in range(S - 1)], "schedule has"),
    ],
)
def test_invalid_plans_are_rejected(plans, message):
    with pytest.raises(ValueError, match=message):
        validate_plans(plans, S)


def test_scheduler_for_another_model_family_is_rejected(models):
    with pytest.raises(ValueError, match="infinity"):
        _run(models, IdentityScheduler(model_family="hart"))


def test_no_tensor_state_survives_a_call(models):
    _run(models)
    for module in list(models[0].modules()) + list(models[1].modules()):
        for name, value in vars(module).items():
            if name in ("_parameters", "_buffers", "_modules"):
                continue
            assert not isinstance(value, torch.Tensor), f"{type(module).__name__}.{name} holds a tensor"


def test_kv_cache_is_sized_for_what_later_passes_read_and_passes_share_one_call_cache(models):
    """The cache's ``max_length`` is exactly what a generation keeps: the start token and every token of the later
    scales but the last one, whose keys no later pass reads (its pass attends to them without keeping them); every
    pass sees the same per-call ``call_cache`` dict."""
    from diffusers_var_accel.next_scale import loop as loop_module

    seen, lengths = [], []

    class _Recording(IdentityScheduler):
        def route_pass(self, state, plan):
            seen.append(state.call_cache)
            lengths.append((state.kv_cache.get_seq_length(0), state.kv_cache.stores))
            return super().route_pass(state, plan)

    state = _run(models, _Recording())
    kept = state.kv_cache.get_seq_length(0)
    assert kept == 1 + sum(h * w for _, h, w in SCHEDULE[1:-1])
    assert state.kv_cache.max_length == kept
    # before each pass: everything earlier is cached; only the last pass does not store
    assert lengths == [(0 if i == 0 else 1 + sum(h * w for _, h, w in SCHEDULE[1:i]), i != S - 1) for i in range(S)]
    family = InfinityScaleFamily(*models, SCHEDULE, rope_grid_hw(TEMPLATE), top_k=1, top_p=None)
    assert (
        loop_module.cached_positions(family.num_start_tokens, SCHEDULE, loop_module.identity_plans(SCHEDULE)) == kept
    )
    assert len(seen) == S and all(d is seen[0] for d in seen) and seen[0] is state.call_cache
    # the loop's scale-id table is a schedule constant: it lives in the call's ScheduleTables, not the call cache
    hws = tuple((int(h), int(w)) for _, h, w in SCHEDULE)
    assert not any(isinstance(k, tuple) and k[:1] == ("loop.scale_ids",) for k in state.call_cache)
    assert state.tables.get(("loop.scale_ids", hws, "cpu"), lambda: None) is not None


def test_kv_cache_size_follows_the_plan(models):
    """A grouped last pass and skipped last scales are not cached: only what a later pass reads is allocated."""
    from diffusers_var_accel.next_scale import loop as loop_module

    family = InfinityScaleFamily(*models, SCHEDULE, rope_grid_hw(TEMPLATE), top_k=1, top_p=None)
    tokens = [1] + [h * w for _, h, w in SCHEDULE[1:]]
    grouped = [ScalePlan((i,)) for i in range(S - 3)] + [ScalePlan(tuple(range(S - 3, S)))]
    assert loop_module.cached_positions(family.num_start_tokens, SCHEDULE, grouped) == sum(tokens[: S - 3])
    skipping = [ScalePlan((i,)) for i in range(S - 2)] + [
        ScalePlan((S - 2,), skip=True),
        ScalePlan((S - 1,), skip=True),
    ]
    assert loop_module.cached_positions(family.num_start_tokens, SCHEDULE, skipping) == sum(tokens[: S - 3])
    one_pass = [ScalePlan(tuple(range(S)))]
    assert (
        loop_module.cached_positions(family.num_start_tokens, SCHEDULE, one_pass) == 1
    )  # nothing to keep; the buffer stays valid


def test_the_last_pass_attends_to_its_own_keys_without_keeping_them():
    """``stores=False``: the returned keys are the cached ones then the given ones, and nothing is written."""
    from diffusers_var_accel.next_scale.cache import ScaleKVCache

    g = torch.Generator().manual_seed(0)
    for max_length in (5, None):
        cache = ScaleKVCache(1, max_length=max_length)
        k1, v1 = torch.randn(2, 3, 4, 8, generator=g), torch.randn(2, 3, 4, 8, generator=g)
        cache.update(k1, v1, 0)
        cache.stores = False
        k2, v2 = torch.randn(1, 3, 2, 8, generator=g), torch.randn(1, 3, 2, 8, generator=g)
        k_all, v_all = cache.update(k2, v2, 0, cache_rows=2)  # CFG halving: one row of two runs
        assert torch.equal(k_all, torch.cat((k1[:1], k2), dim=2)) and torch.equal(
            v_all, torch.cat((v1[:1], v2), dim=2)
        )
        assert cache.get_seq_length(0) == 4 and torch.equal(cache.get(0)[0], k1)
        # the unconditional row only: its own history, then its keys
        k_all, _ = cache.update(k2, v2, 0, cache_rows=2, row_start=1)
        assert torch.equal(k_all, torch.cat((k1[1:], k2), dim=2))
        with pytest.raises(ValueError, match="row_start 3 does not start a block of 1 rows of a cache of 2 rows"):
            cache.update(k2, v2, 0, cache_rows=2, row_start=3)


def test_scale_id_table_is_every_scale_filled_and_shared_only_through_the_callers_tables(models):
    from diffusers_var_accel.next_scale import ScheduleTables
    from diffusers_var_accel.next_scale import loop as loop_module

    hws = tuple((int(h), int(w)) for _, h, w in SCHEDULE)
    table, offsets = loop_module._scale_id_table(hws, torch.device("cpu"))
    expected = torch.cat([torch.full((h * w,), k, dtype=torch.long) for k, (h, w) in enumerate(hws)])
    assert torch.equal(table, expected) and offsets == [sum(h * w for h, w in hws[:i]) for i in range(len(hws) + 1)]
    key = ("loop.scale_ids", hws, "cpu")
    tables = ScheduleTables()
    first, second = _run(models, tables=tables), _run(models, tables=tables)
    assert first.tables is second.tables is tables and torch.equal(tables.get(key, lambda: None)[0], expected)
    shared = tables.get(key, lambda: None)[0]
    alone = _run(models)  # no owner: the call's own tables, dropped with it
    assert alone.tables is not tables and alone.tables.get(key, lambda: None)[0] is not shared
    assert torch.equal(alone.f_hat, first.f_hat) and torch.equal(second.f_hat, first.f_hat)


def test_unconditional_only_passes_on_hart_equal_its_unconditional_logits():
    """The same rule on HART: its guidance ``(1 + t) c - t u`` gives the unconditional logits at t = -1 (the loop
    takes HART's own weight), which is what an unconditional-only pass samples (same tokens; logits within batched-GEMM
    rounding); HART's diffusion head is off so that only the tokens carry the images."""
    from conftest import tiny_hart_patch_nums
    from diffusers_var_accel.pipelines.hart.pipeline_hart import HARTScaleFamily
    from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline

    pipe = build_tiny_hart_pipeline(
        seed=0, depth=4, embed_dim=32, patch_nums=tiny_hart_patch_nums(), tokenizer_ch_mult=(1,)
    )
    transformer = pipe.transformer
    text, positions = pipe.encode_prompt(["a red fox", "two green circles"], torch.device("cpu"))
    null, null_positions = transformer.null_context(2)
    with torch.no_grad():
        condition = transformer.encode_condition(torch.cat((text, null)), torch.cat((positions, null_positions)))
    family = HARTScaleFamily(transformer, pipe.vae, 1, None, False, None, use_diffusion_head=False)
    n, last = family.num_scales, 2

    def run(scheduler, guidance):
        with torch.no_grad():
            return run_next_scale_loop(
                family,
                condition,
                family.scale_schedule,
                2,
                guidance,
                [1.0] * n,
                torch.Generator().manual_seed(0),
                scheduler,
            )

    plans = [ScalePlan((i,)) for i in range(n - last)] + [
        ScalePlan((i,), cfg_uncond_only=True) for i in range(n - last, n)
    ]
    # the loop takes HART's own guidance weight t (0: none; t = -1 gives the unconditional logits)
    uncond = run(_PlanScheduler(plans=plans), [3.5] * n)
    reference = run(None, [3.5] * (n - last) + [-1.0] * last)
    for k in range(n):
        assert torch.equal(uncond.tokens[k], reference.tokens[k])
        if k >= n - last:
            torch.testing.assert_close(uncond.logits[k], reference.logits[k][2:], atol=3e-5, rtol=0)
    assert torch.equal(uncond.f_hat, reference.f_hat)
    guided = run(None, [3.5] * n)  # guidance kept there: other tokens (the rule changes what is sampled)
    assert any(not torch.equal(uncond.tokens[k], guided.tokens[k]) for k in range(n - last, n))
