"""DepthVARScheduler: bit-reversal depth mapping, scheduling function and rotation, balanced layers, cached proxies,
code blending, configuration and the pipeline shortcut.

Hand-built tensors test the rank-space pieces; loop-level tests run the tiny random pipeline (8 layers) at 256x256
(7 scales: ``reference_scale=-3`` is scale index 4 (8x8), dynamic scales 5 (12x12, budget 64/144) and 6 (16x16,
budget 1/4)) or at 0.25M sizes (10 scales) for the paper's R = 9 / R = 7 presets.
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F
from diffusers.configuration_utils import register_to_config

from diffusers_var_accel import DepthVARScheduler, ScalePlan, run_next_scale_loop, schedule_for_size
from diffusers_var_accel.models.infinity_resolutions import rope_grid_hw
from diffusers_var_accel.pipelines.infinity import InfinityScaleFamily
from diffusers_var_accel.schedulers import ComposedScheduler, LazyVARScheduler, VARAccelScheduler
from diffusers_var_accel.schedulers.scheduling_depthvar import (
    ROTATION_STEP,
    bit_reversal_permutation,
    layer_masks,
    plan_depth,
    scheduling_function,
)
from diffusers_var_accel.schedulers.specs import load_acceleration
from diffusers_var_accel.next_scale.executor import weight_codes
from diffusers_var_accel.next_scale.plan import PassRoutes, RecordRequest
from diffusers_var_accel.next_scale.maps import resize_map
from diffusers_var_accel.next_scale.executor import match_rows
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

DEPTH = 8
SCHEDULE, TEMPLATE = schedule_for_size(256, 256)
S = len(SCHEDULE)
DYNAMIC = (5, 6)


def gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def pipe():
    pipeline = build_tiny_infinity_pipeline(seed=0, depth=DEPTH)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def latents(pipe, size=(256, 256), acceleration=None, prompt="a red fox in the snow", generator=None, **kwargs):
    return pipe(
        prompt,
        height=size[0],
        width=size[1],
        generator=generator if generator is not None else gen(0),
        acceleration=acceleration,
        output_type="latent",
        **kwargs,
    ).images


def run_loop(pipe, scheduler, batch=2, cfg=3.0):
    transformer, vae = pipe.transformer, pipe.vae
    g = gen(3)
    text = torch.randn(batch, 6, transformer.config.text_channels, generator=g)
    mask = torch.ones(batch, 6, dtype=torch.bool)
    text, mask = torch.cat((text, transformer.null_text_embeds(mask))), torch.cat((mask, mask))
    family = InfinityScaleFamily(transformer, vae, SCHEDULE, rope_grid_hw(TEMPLATE), top_k=0, top_p=None)
    with torch.no_grad():
        condition = transformer.encode_condition(text, mask)
        return run_next_scale_loop(family, condition, SCHEDULE, batch, [cfg] * S, [1.0] * S, gen(0), scheduler)


class _Recording(DepthVARScheduler):
    """DepthVAR that also records every block's output and delta, and logs its routes (test only):
    ``log[(scale, layer)] = (input, index of the computed tokens or None, delta, output)``."""

    def route_pass(self, state, plan):
        routes = super().route_pass(state, plan) or PassRoutes()
        every = frozenset(range(state.model.num_layers))
        routes.record = routes.record | RecordRequest(block_outputs=every, block_deltas=every)
        self.routes[plan.scale_indices[0]] = {layer: route for (layer, _), route in routes.routes.items()}
        return routes

    def after_scale(self, state, plan, hidden_states_RLC):
        k, records = plan.scale_indices[0], state.records
        for layer, out in records.block_outputs.items():
            delta, route = records.block_deltas[layer], self.routes[k].get(layer)
            index = None if route is None else match_rows(route.index, out.shape[0])
            self.log[(k, layer)] = (out - delta, index, delta, out)
        super().after_scale(state, plan, hidden_states_RLC)


# ---------------------------------------------------------------------------------------------------------------------
# bit reversal, scheduling function, rotation, per-layer balance (hand-built)
# ---------------------------------------------------------------------------------------------------------------------
def test_bit_reversal_permutation():
    order = bit_reversal_permutation(32)
    assert order[:5] == [0, 16, 8, 24, 4]
    assert order == [int(format(i, "05b")[::-1], 2) for i in range(32)]
    assert bit_reversal_permutation(6) == [0, 4, 2, 1, 5, 3]  # over 8, dropping 6 and 7, order kept
    for L in (1, 2, 3, 5, 7, 12, 24, 40):
        assert sorted(bit_reversal_permutation(L)) == list(range(L)), L
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="num_layers"):
            bit_reversal_permutation(bad)


def test_a_token_runs_the_first_entries_of_its_bit_reversal_sequence():
    five = torch.tensor([5 / 32])
    assert layer_masks(five, 32)[0].nonzero()[:, 0].tolist() == [0, 4, 8, 16, 24]  # {0, 16, 8, 24, 4}
    assert layer_masks(five, 32, offsets=torch.tensor([1]))[0].nonzero()[:, 0].tolist() == [4, 8, 16, 20, 24]
    assert layer_masks(torch.tensor([0.0]), 32, min_depth=1)[0].nonzero()[:, 0].tolist() == [0]  # clamped to 1 layer
    assert layer_masks(torch.tensor([0.0, 1.0]), 24).sum(-1).tolist() == [0, 24]
    for bad in ([1.5], [-0.1], [float("nan")]):
        with pytest.raises(ValueError, match="depth score"):
            layer_masks(torch.tensor(bad), 32)
    with pytest.raises(ValueError, match="min_depth"):
        layer_masks(torch.tensor([0.5]), 4, min_depth=5)


def test_scheduling_function_has_the_budget_as_mean_and_rotates_cyclically():
    N = 20000
    rho = (torch.arange(N, dtype=torch.float64) + 0.5) / N
    for budget in (0.1, 0.25, 0.5, 0.9):
        for s in (0.0, 1 / 32):
            scores = scheduling_function(rho, budget, 0.0, s)
            assert abs(scores.mean().item() - budget) < 1e-3 and scores.min() >= s and scores.max() <= 1
            assert (scores.diff() >= 0).all()  # phase 0: the larger the change, the deeper
            for phase in (0.25, 0.7):
                torch.testing.assert_close(
                    scheduling_function(rho, budget, phase, s),
                    scheduling_function(torch.remainder(rho + phase, 1), budget, 0.0, s),
                )
    assert torch.equal(scheduling_function(rho, 1.0, 0.3), torch.ones(N, dtype=torch.float64))
    assert torch.equal(scheduling_function(rho, 0.02, 0.0, 0.05), torch.full((N,), 0.05, dtype=torch.float64))
    for kwargs in (dict(budget=1.2), dict(budget=0.5, min_score=-0.1)):
        with pytest.raises(ValueError, match="in \\[0, 1\\]"):
            scheduling_function(rho, **kwargs)
    with pytest.raises(ValueError, match="percentile"):
        scheduling_function(torch.tensor([1.5]), 0.5)


def test_every_layer_computes_a_balanced_share_of_the_tokens():
    N, L = 4096, 32
    offsets = torch.arange(N) % L
    # one depth score for every token: each layer computes exactly that share
    share = layer_masks(torch.full((N,), 0.25), L, offsets).float().mean(0)
    assert torch.equal(share, torch.full((L,), 0.25))
    # uniformly spread scores: each layer within a small tolerance of the mean share
    scores = torch.rand(N, generator=gen(0))
    share = layer_masks(scores, L, offsets).float().mean(0)
    assert (share - share.mean()).abs().max() < 0.02
    # the literal "first D entries" (no offsets) loads layer 0 with every token and the last entry with almost none
    literal = layer_masks(scores, L, min_depth=1).float().mean(0)
    assert literal[0] == 1 and literal[bit_reversal_permutation(L)[-1]] < 0.05
    # a depth plan for a budget: the tokens of each layer are the mean count +- 1 per depth class
    plan = plan_depth(torch.rand(2, N, generator=gen(1)), (64, 64), L, 576 / 4096, 0.5, 1, True)
    counts = torch.tensor([index.shape[1] for index in plan.layer_index.values()], dtype=torch.float)
    assert (counts - counts.mean()).abs().max() <= L and abs(counts.mean() / N - plan.depth.float().mean() / L) < 1e-6
    assert all(index.shape[0] == 2 and torch.equal(index, index.sort(1).values) for index in plan.layer_index.values())


def test_plan_maps_ranks_to_positions_and_rotation_moves_the_deep_positions():
    N, L, budget = 64, 8, 0.25
    ranking = torch.randperm(N, generator=gen(2)).float().unsqueeze(0)  # the rank of each position is its value
    rank = ranking[0].long()
    plain, rotated = (plan_depth(ranking, (8, 8), L, budget, phase, 1, True) for phase in (0.0, 0.25))
    rho = (torch.arange(N, dtype=torch.float64) + 0.5) / N
    for plan, phase in ((plain, 0.0), (rotated, 0.25)):
        expected = scheduling_function(rho, budget, phase, 1 / L).float()[rank]
        assert torch.equal(plan.scores.flatten(), expected)
        member = torch.zeros(N, L, dtype=torch.long)
        for l, index in plan.layer_index.items():
            member[index[0], l] = 1
        assert torch.equal(member.sum(1), plan.depth.flatten())  # the masks give every token its depth
        assert torch.equal(plan.depth.flatten(), (expected * L).floor().clamp(1, L).long())
    top = rank >= N - N // 4  # the 25% largest changes: deep without rotation, shallowest after a 0.25 rotation
    assert plain.scores.flatten()[top].min() > plain.scores.flatten()[~top].max()
    assert rotated.scores.flatten()[top].max() < rotated.scores.flatten()[~top].min()
    deep_plain = plain.depth.flatten() > 1
    deep_rotated = rotated.depth.flatten() > 1
    assert deep_plain[top].all() and not deep_rotated[top].any()  # the top quarter: deep, then shallow
    assert (deep_rotated & ~deep_plain).sum() >= N // 5  # positions shallow at one scale run deep at the next


def test_one_sort_for_every_layer_equals_a_sort_per_layer_and_rows_are_laid_out_once():
    """plan_depth sorts every layer's tokens in one call (keys ``l N + token``): the same tokens as sorting each layer
    on its own; ``index_rows`` lays a per-image plan out for the CFG rows once: each layer's rows are its image's
    tokens (conditional rows first), every layer's tensor contiguous."""
    from diffusers_var_accel.schedulers.scheduling_depthvar import rank_depth_plan

    N, L, budget = 24 * 24, 8, 0.3
    ranking = torch.rand(3, N, generator=gen(4))
    plan = plan_depth(ranking, (24, 24), L, budget, 0.25, 1, True)
    order = ranking.argsort(dim=1, stable=True)
    ranks = rank_depth_plan(N, L, budget, 0.25, 1, True)
    for l in range(L):
        assert torch.equal(plan.layer_index[l], order[:, ranks.ranks[l]].sort(dim=1).values)
    rows = plan.index_rows(6)
    for l in range(L):
        assert rows[l].is_contiguous() and torch.equal(rows[l], plan.layer_index[l].repeat(2, 1))
    assert all(torch.equal(plan.index_rows(3)[l], plan.layer_index[l]) for l in range(L))
    with pytest.raises(ValueError, match="cannot lay out 3 images"):
        plan.index_rows(4)


def test_device_depth_plans_are_kept_in_the_callers_schedule_tables_only():
    """The rank-space depth plan's device copy is a schedule constant: kept in the ScheduleTables the call is given
    (the pipeline's, shared by its calls), and without them made for the one use; nothing module-level holds it."""
    from diffusers_var_accel.next_scale import ScheduleTables
    from diffusers_var_accel.schedulers import scheduling_depthvar
    from diffusers_var_accel.schedulers.scheduling_depthvar import rank_depth_plan

    args = (64, 4, 0.5, 0.25, 1, True)
    tables = ScheduleTables()
    first = rank_depth_plan(*args, device="meta", tables=tables)
    assert first.scores.is_meta and rank_depth_plan(*args, device="meta", tables=tables) is first and len(tables) == 1
    assert rank_depth_plan(*args, device="meta") is not first  # no owner: not kept
    assert not hasattr(scheduling_depthvar, "_DEVICE_PLANS")
    rows = plan_depth(torch.rand(2, 64, generator=gen(3)).to("meta"), (8, 8), 4, 0.5, 0.25, 1, True, tables=tables)
    assert rows.layer_index[0].is_meta and len(tables) == 1  # the same setting: the same table


def test_the_summed_change_of_stacked_deltas_is_that_of_the_layers():
    """Eq. (1) over stacked deltas (a few kernels per 8 layers) gives the bits of the per-layer form (a mean per
    layer, one sum over the layers), for any number of layers (chunks of 8 and a remainder) and dtype; and the value
    of the layer-by-layer sum, within fp32 rounding."""
    from diffusers_var_accel.schedulers.scheduling_depthvar import summed_change

    for n in (1, 5, 8, 19, 32):
        for dtype in (torch.float32, torch.bfloat16):
            deltas = torch.randn(n, 2, 37, 24, generator=gen(n)).to(dtype)
            stacked = summed_change(deltas)
            assert stacked.dtype == torch.float32 and stacked.shape == (2, 37)
            assert torch.equal(stacked, summed_change(list(deltas)))
            chained = deltas[0].float().abs().mean(-1)
            for l in range(1, n):
                chained = chained + deltas[l].float().abs().mean(-1)
            torch.testing.assert_close(stacked, chained, rtol=1e-6, atol=0)


# ---------------------------------------------------------------------------------------------------------------------
# the method on the tiny model
# ---------------------------------------------------------------------------------------------------------------------
def test_full_depth_everywhere_is_bit_identical_to_the_baseline(pipe):
    scheduler = DepthVARScheduler(reference_scale=-1, start_scale=2)  # budget 1 on every scale 2..6: S = 1, D = L
    assert set(scheduler.budgets(SCHEDULE).values()) == {1.0}
    state, baseline = run_loop(pipe, scheduler), run_loop(pipe, None)
    plans = scheduler.depth_plans(state)
    assert sorted(plans) == list(range(2, S)) and all(bool((p.scores == 1).all()) for p in plans.values())
    assert all(index.shape[1] == p.scores[0].numel() for p in plans.values() for index in p.layer_index.values())
    assert torch.equal(state.f_hat, baseline.f_hat)
    assert all(torch.equal(state.logits[k], baseline.logits[k]) for k in range(S))


def test_skipped_layers_take_the_previous_scales_upsampled_layer_delta(pipe):
    scheduler = _Recording(reference_scale=-3)
    scheduler.log, scheduler.routes = {}, {}
    state = run_loop(pipe, scheduler)
    plans = scheduler.depth_plans(state)
    assert sorted(plans) == list(DYNAMIC)
    for k in DYNAMIC:
        h, w = SCHEDULE[k][1:]
        for l in range(DEPTH):
            x, index, _, out = scheduler.log[(k, l)]
            _, _, delta_prev, _ = scheduler.log[(k - 1, l)]
            delta_prev = delta_prev.transpose(1, 2).reshape(4, -1, *SCHEDULE[k - 1][1:])
            proxy = (
                F.interpolate(delta_prev, size=(h, w), mode="bilinear", align_corners=False).flatten(2).transpose(1, 2)
            )
            assert torch.equal(index, plans[k].layer_index[l].repeat(2, 1))  # both CFG rows of an image: one plan
            skipped = torch.ones(4, h * w, dtype=torch.bool).scatter_(1, index, False)
            assert skipped.any() and (~skipped).any()
            torch.testing.assert_close(out[skipped], (x + proxy)[skipped], atol=1e-5, rtol=0)
            assert not torch.allclose(out[~skipped], (x + proxy)[~skipped], atol=1e-3)  # computed tokens ran the block
    # the scale before the first dynamic one ran every token (full depth: no route)
    assert all(scheduler.log[(DYNAMIC[0] - 1, l)][1] is None for l in range(DEPTH))
    # only the computed tokens' keys/values entered each layer's cache (the last scale's: none, no later pass reads them)
    dense = sum(h * w for _, h, w in SCHEDULE[: DYNAMIC[0]])
    assert DYNAMIC[-1] == S - 1
    for l in range(DEPTH):
        assert state.kv_cache.get_seq_length(l) == dense + sum(plans[k].layer_index[l].shape[1] for k in DYNAMIC[:-1])


def _code_weights(scheduler, pipe):
    """``{scale: weights}`` the scheduler's passes declared in one run."""
    seen = {}

    class _Spy(type(scheduler)):
        def route_pass(self, state, plan):
            routes = super().route_pass(state, plan)
            seen.update(routes.code_weights if routes is not None else {})
            return routes

    run_loop(pipe, _Spy(**{k: v for k, v in scheduler.to_dict().items() if k != "_class_name"}))
    return seen


def test_codes_of_dynamic_scales_are_weighted_by_the_depth_score(pipe):
    scheduler = DepthVARScheduler(reference_scale=-3)
    state = run_loop(pipe, scheduler)
    codes = torch.randn(2, 8, 12, 12, generator=gen(4))
    scores = scheduler.depth_plans(state)[5].scores
    assert scores.shape == (2, 12, 12) and scores.min() < 0.5
    assert torch.equal(weight_codes(codes, scores), codes * scores.unsqueeze(1))
    assert set(_code_weights(scheduler, pipe)) == set(DYNAMIC)  # only dynamic scales are weighted
    off = DepthVARScheduler(reference_scale=-3, code_blending=False)
    off_state = run_loop(pipe, off)
    assert _code_weights(off, pipe) == {}
    assert not torch.equal(off_state.f_hat, state.f_hat)


class _RankingSpy(DepthVARScheduler):
    """DepthVAR that keeps, per call, the ranking map and the depth map of its first dynamic scale (test only)."""

    def before_scale(self, state, plan):
        super().before_scale(state, plan)
        call, k = self.call_state(state), plan.scale_indices[0]
        if k in call.plans and not self.seen:
            hw = tuple(int(v) for v in state.scale_schedule[k][-2:])
            ranking = call.source.change.view(-1, state.batch_size, *call.source.hw).mean(0)
            self.seen.append((resize_map(ranking, hw, "bilinear").flatten(1), call.plans[k].depth.flatten(1)))


def test_batched_ranking_equals_the_single_runs_to_rounding_and_so_do_the_depths_of_untied_tokens(pipe):
    """DepthVAR's batch = single claim (``batch_equals_single_runs`` is False): the ranking map of the first dynamic
    scale equals each single run's within fp32 rounding, and every token whose ranking value is further than that from
    every other token's gets the same depth; only near-tied ranks may swap (which happens on some CPUs)."""
    prompts, seeds = ["a red fox in the snow", "two cats"], (11, 22)
    spy = _RankingSpy(reference_scale=-3)
    spy.seen = []
    latents(pipe, prompt=prompts, generator=[gen(s) for s in seeds], acceleration=spy, guidance_scale=3.0)
    ((batch_ranking, batch_depth),) = spy.seen
    rounding = 1e-5
    for i, (prompt, seed) in enumerate(zip(prompts, seeds)):
        spy.seen = []
        latents(pipe, prompt=prompt, generator=[gen(seed)], acceleration=spy, guidance_scale=3.0)
        ((ranking, depth),) = spy.seen
        torch.testing.assert_close(batch_ranking[i : i + 1], ranking, atol=rounding, rtol=0)
        gaps = (ranking[0, :, None] - ranking[0, None, :]).abs().fill_diagonal_(float("inf")).min(dim=1).values
        untied = gaps > 2 * rounding
        assert untied.float().mean() > 0.5  # the check below covers most tokens
        assert torch.equal(batch_depth[i][untied], depth[0][untied])
        assert depth.unique().numel() > 1  # the depths do vary: a plan that ignored the ranking would pass trivially


def test_rotation_in_the_loop_rotates_the_second_dynamic_scale(pipe):
    rotated, plain = DepthVARScheduler(reference_scale=-3), DepthVARScheduler(reference_scale=-3, rotation_step=0.0)
    assert rotated.config.rotation_step == 0.25  # the default rotates
    rotated_plans, plain_plans = (s.depth_plans(run_loop(pipe, s)) for s in (rotated, plain))
    assert torch.equal(rotated_plans[5].scores, plain_plans[5].scores)  # first dynamic scale: phase 0 in both
    N, budget = 256, 0.25  # scale 6: 16x16 tokens, budget 64 / 256; same ranking map in both runs
    rho = (torch.arange(N, dtype=torch.float64) + 0.5) / N
    plain, rotated = plain_plans[6].scores.flatten(1), rotated_plans[6].scores.flatten(1)
    assert torch.equal(
        rotated.sort(1).values, scheduling_function(rho, budget, 0.25, 1 / DEPTH).float().sort().values.expand(2, -1)
    )
    # the top quarter of the ranking (distinct plain scores, phase 0 increases with the rank) moves to u = rho + 1/4 - 1
    top = plain.argsort(1, descending=True)[:, : N // 4]
    expected = scheduling_function(rho[N - N // 4 :].flip(0), budget, 0.25, 1 / DEPTH).float()
    assert torch.equal(rotated.gather(1, top), expected.expand(2, -1))
    assert not torch.equal(rotated_plans[6].depth, plain_plans[6].depth)


class _HalveLastScale(VARAccelScheduler):
    @register_to_config
    def __init__(self, model_family=None):
        super().__init__()

    def plan_scales(self, scale_schedule, model=None):
        return [ScalePlan((k,), cfg_halve=k == len(scale_schedule) - 1) for k in range(len(scale_schedule))]


def test_composition(pipe):
    composed = ComposedScheduler([DepthVARScheduler(reference_scale=-3), _HalveLastScale()])
    assert torch.isfinite(latents(pipe, acceleration=composed)).all()
    # depth within LazyVAR's kept tokens: the group's scales are ranked by the scale before the group
    grouped = ComposedScheduler([LazyVARScheduler(), DepthVARScheduler(reference_scale=-3)])
    assert torch.isfinite(latents(pipe, acceleration=grouped)).all()
    # DepthVAR ranks the scale after a group by the group's last scale: refused unless it ends before the group
    after = ComposedScheduler(
        [LazyVARScheduler(group_scales=(-4, -3), keep_ratios=(0.2, 0.1)), DepthVARScheduler(reference_scale=-3)]
    )
    with pytest.raises(ValueError, match="end_scale"):
        latents(pipe, acceleration=after)


# ---------------------------------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------------------------------
def test_presets():
    infinity = DepthVARScheduler.from_preset("infinity")
    # the preset is the class's defaults for the family but R: the paper's R = 9 counted from the end (-5: the same
    # scale on the 13 scales of 1M, and a scale of every shorter schedule), and the default rotation step 0.25 (the
    # paper states none; chosen on the calibration prompts, docs/depthvar.md)
    assert infinity.to_dict() == DepthVARScheduler(model_family="infinity", reference_scale=-5).to_dict()
    assert infinity.config.reference_scale == -5 and infinity.config.rotation_step == 0.25
    assert DepthVARScheduler().config.reference_scale == 9  # the class default stays the paper's 1-based R
    assert DepthVARScheduler().config.rotation_step == 0.25 and DepthVARScheduler().model_family is None
    one_m = [(1, s, s) for s in (1, 2, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64)]
    assert infinity.budgets(one_m) == {9: 576 / 1024, 10: 576 / 1600, 11: 576 / 2304, 12: 576 / 4096}
    r7 = DepthVARScheduler.from_preset("infinity", reference_scale=7)
    assert r7.budgets(one_m) == {k: 256 / (one_m[k][1] ** 2) for k in range(7, 13)}
    assert load_acceleration("depthvar:reference_scale=7", "infinity").to_dict() == r7.to_dict()
    hart = DepthVARScheduler.from_preset("hart")
    hart_schedule = [(1, s, s) for s in (1, 2, 3, 4, 5, 7, 9, 12, 16, 21, 27, 36, 48, 64)]
    assert hart.model_family == "hart" and min(hart.budgets(hart_schedule)) == 10


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(reference_scale=9), "R=9 is outside the schedule's 7 scales"),
        (dict(reference_scale=-8), "outside"),
        (dict(reference_scale=3, start_scale=7), "start_scale"),
        (dict(reference_scale=3, start_scale=-7), "scale 0"),
    ],
)
def test_settings_that_do_not_fit_the_schedule_raise(pipe, settings, message):
    with pytest.raises(ValueError, match=message):
        DepthVARScheduler(**settings).plan_scales(SCHEDULE)
    with pytest.raises(ValueError, match=message):
        latents(pipe, acceleration=DepthVARScheduler(**settings))


def test_min_depth_beyond_the_model_raises(pipe):
    with pytest.raises(ValueError, match="min_depth 9"):
        latents(pipe, acceleration=DepthVARScheduler(reference_scale=-3, min_depth=DEPTH + 1))


def _edge_scene_ranking(side: int) -> torch.Tensor:
    """A ranking map (Eq. 1) of one image at ``side x side``: a square object whose outline changed most, its inside
    a little, the background least (a small gradient breaks ties as real maps do)."""
    y, x = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    lo, hi = side // 4, 3 * side // 4
    inside = (y >= lo) & (y < hi) & (x >= lo) & (x < hi)
    edge = inside & ((y == lo) | (y == hi - 1) | (x == lo) | (x == hi - 1))
    change = 0.01 + 1e-4 * (x + side * y).float() / side**2
    change = torch.where(inside, torch.full_like(change, 0.3), change)
    return torch.where(edge, torch.full_like(change, 1.0), change).flatten()[None], edge, inside


def _edge_scene_depths(rotation_step: float):
    """The depth map of every dynamic scale of Infinity's 1M schedule (R = 7, L = 32) for the edge scene, with the
    scene's edge and background masks: ``[(depth (side, side), edge, background)]``."""
    scheduler = DepthVARScheduler(reference_scale=7, rotation_step=rotation_step)
    one_m = [(1, s, s) for s in (1, 2, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64)]
    budgets, out = scheduler.budgets(one_m), []
    for k, budget in budgets.items():
        side = one_m[k][1]
        ranking, edge, inside = _edge_scene_ranking(side)
        phase = (rotation_step * (k - min(budgets))) % 1.0
        plan = plan_depth(ranking, (side, side), 32, budget, phase, scheduler.config.min_depth, True)
        out.append((plan.depth[0].float(), edge, ~inside))
    return out


@pytest.mark.parametrize("rotation_step", [None, 0.0, 1 / 3])  # 0.5 cycles two phases only: 97 % of positions
def test_the_papers_claims_edges_run_deeper_on_average_and_rotation_brings_every_position_deep(rotation_step):
    """What the paper claims for its scheduling function with rotation, on the worked example's scene (R = 7): the
    most-changed tokens (edges) run more layers than the background on average over the dynamic scales; and, with
    rotation, regions computed shallowly at one scale get deep compute at a later one: every position runs more
    layers than its scale's mean at some dynamic scale. Without rotation most of the background never does.
    Literal full depth (``D = L``) needs ``S = 1``, which ``G'`` gives only at a budget of 1 (the scales up to R, where
    every position runs every layer anyway), so "deep" here is "deeper than the scale's mean"."""
    step = DepthVARScheduler().config.rotation_step if rotation_step is None else rotation_step
    depths = _edge_scene_depths(step)
    assert len(depths) == 6
    edge_mean = sum(float(d[edge].mean()) for d, edge, _ in depths) / len(depths)
    background_mean = sum(float(d[background].mean()) for d, _, background in depths) / len(depths)
    assert edge_mean > background_mean
    deep = torch.zeros(64, 64, dtype=torch.bool)
    for depth, _, _ in depths:
        above = (depth > depth.mean()).float()[None, None]
        deep |= F.interpolate(above, size=(64, 64), mode="nearest")[0, 0].bool()
    background_64 = _edge_scene_depths(0.0)[-1][2]
    if step == 0:
        # no rotation: most of the background (all but the gradient's top at the mildest scale) stays shallow
        assert deep[background_64].float().mean() < 0.5
    else:
        assert deep.all()


def test_with_rotation_the_edges_are_not_deeper_at_every_dynamic_scale():
    """The claim the rotation gives up (a test of it once kept rotation off): at the second dynamic scale the default
    step wraps the most-changed tokens to the shallow end, so edges run fewer layers than the background there."""
    depths = _edge_scene_depths(DepthVARScheduler().config.rotation_step)
    (first, edge0, background0), (second, edge1, background1) = depths[:2]
    assert first[edge0].min() >= first[background0].max()  # the first dynamic scale is never rotated
    assert second[edge1].mean() < second[background1].mean()


@pytest.mark.parametrize("preset", ["infinity-2b/depthvar", "hart-0.7b/depthvar", "embedded/depthvar"])
def test_every_packaged_preset_uses_the_default_rotation(preset):
    """What `enable_depthvar()` loads on every model rotates by the class default (docs/depthvar.md)."""
    assert DepthVARScheduler.from_pretrained(preset).config.rotation_step == ROTATION_STEP == 0.25


def test_the_calibration_grids_do_not_search_the_decided_rotation():
    grids = DepthVARScheduler.calibration_grid(DEPTH) + DepthVARScheduler.composition_calibration_grid(DEPTH)
    assert {setting["rotation_step"] for setting in grids} == {ROTATION_STEP}
    grid = DepthVARScheduler.calibration_grid(DEPTH)
    assert {s["reference_scale"] for s in grid if "start_scale" not in s} == {-2, -3, -4, -5, -6}
    later = [s for s in grid if "start_scale" in s]  # deeper references whose dynamic scales start later
    assert later and all(s["reference_scale"] < s["start_scale"] < 0 and s["code_blending"] for s in later)


def test_the_later_starts_of_the_grid_fill_the_budgets_between_two_reference_scales():
    """On a schedule with many small late steps (the embedded model's 13 scales), R alone jumps from about 1.5x to 2x
    counted FLOPs; a setting whose dynamic scales start later lies between (budget: the mean depth fraction per token)."""
    schedule = [(1, s, s) for s in (1, 2, 3, 4, 5, 6, 8, 10, 12, 13, 14, 15, 16)]
    tokens = [s[1] * s[2] for s in schedule]

    def depth_fraction(setting):
        budgets = DepthVARScheduler(**setting).budgets(schedule)
        return sum(tokens[i] * budgets.get(i, 1.0) for i in range(len(tokens))) / sum(tokens)

    grid = DepthVARScheduler.calibration_grid(DEPTH)
    after = sorted(depth_fraction(s) for s in grid if "start_scale" not in s and s["code_blending"])
    low, high = max(zip(after[:-1], after[1:]), key=lambda pair: pair[1] - pair[0])  # R's widest step
    assert low < 0.8 * high  # R = -6 -> -5: 0.61 -> 0.78 of the full depth
    assert [s for s in grid if "start_scale" in s and low < depth_fraction(s) < high]
