"""StageVAR (FasterVAR) on the tiny Infinity model: the released setting's plans, a batch on a non-square size with
images independent of each other, its draws reproducible from the call's seeds, and clear errors. Parity with the
official code: tests/test_parity_stagevar.py."""

from __future__ import annotations

import pytest
import torch

from diffusers_var_accel import supported_sizes
from diffusers_var_accel.schedulers.scheduling_stagevar import (
    RepresentativeMixer,
    StageVARScheduler,
    representative_probabilities,
    stage_rank,
)
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")
WIDE = next(hw for hw, tb in supported_sizes().items() if tb == (0.5, "0.06M"))  # h:w = 1:2


@pytest.fixture(scope="module")
def pipe():
    pipeline = build_tiny_infinity_pipeline(seed=0, depth=4)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def _stagevar(**overrides):
    return StageVARScheduler(**{"num_chunks": 2, "rank_ratios": ((0.2, 0.35),), **overrides})


def _images(pipe, scheduler, generators, prompts=("a red fox", "a blue bird")):
    return pipe(
        list(prompts),
        height=WIDE[0],
        width=WIDE[1],
        generator=generators,
        acceleration=scheduler,
        guidance_scale=3.0,
        output_type="pt",
    ).images


def g(seed):
    return torch.Generator().manual_seed(seed)


def test_released_plans_guidance_off_on_the_last_three_the_last_two_skipped():
    plans = StageVARScheduler().plan_scales([(1, s, s) for s in (1, 2, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64)])
    assert [p.cfg_uncond_only for p in plans] == [False] * 10 + [True, False, False]
    assert [p.skip for p in plans] == [False] * 11 + [True, True]


def test_a_batch_on_a_non_square_size_keeps_every_image_independent(pipe):
    scheduler = _stagevar()
    first = _images(pipe, scheduler, [g(1), g(2)])
    other = _images(pipe, scheduler, [g(1), g(3)], prompts=("a red fox", "two green circles"))
    assert torch.equal(first[0], other[0]) and not torch.equal(first[1], other[1])
    assert not torch.equal(first, _images(pipe, None, [g(1), g(2)]))
    assert torch.equal(first, _images(pipe, scheduler, [g(1), g(2)]))  # the draws follow the call's seeds


def test_a_projection_seed_draws_the_same_mixtures_for_any_token_seed(pipe):
    """``projection_seed``: one generator for every row's positions and projections (the official draw order)."""
    scheduler = _stagevar(projection_seed=5)
    assert torch.equal(_images(pipe, scheduler, [g(1), g(2)]), _images(pipe, scheduler, [g(1), g(2)]))
    assert not torch.equal(
        _images(pipe, scheduler, [g(1), g(2)]), _images(pipe, _stagevar(projection_seed=6), [g(1), g(2)])
    )


def test_ranks_and_probabilities():
    assert stage_rank(0.016776672694393688, 1600) == 27 and stage_rank(1.0, 10) == 10
    x = torch.tensor([[[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]]])
    # the values to float32 rounding (the official expression's own rounding: the near-tie test below)
    assert torch.allclose(representative_probabilities(x), torch.tensor([[25 / 26, 0.0, 1 / 26]]), rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(rank_ratios=((0.2,),)), "each rank_ratios entry must hold 2 ratios"),
        (dict(rank_ratios=()), "rank_ratios needs one list per projected scale"),
        (dict(num_chunks=0), "num_chunks must be a positive integer"),
        (dict(projection_seed="7"), "projection_seed must be an integer"),
        (dict(skipped_scales=(-3,)), "are both skipped and projected"),
    ],
)
def test_bad_settings_name_the_value(pipe, overrides, message):
    with pytest.raises(ValueError, match=message):
        scheduler = _stagevar(**overrides)
        _images(pipe, scheduler, [g(1), g(2)])


def test_chunks_must_divide_the_depth(pipe):
    with pytest.raises(ValueError, match="num_chunks=3 does not divide the model's 4 layers"):
        _images(pipe, StageVARScheduler(num_chunks=3, rank_ratios=((0.2, 0.2, 0.2),)), [g(1), g(2)])


# ---------------------------------------------------------------------------------------------------------------------
# HART, the paper variant, graphs
# ---------------------------------------------------------------------------------------------------------------------
HART_SCHEDULE = [(1, p, p) for p in (1, 2, 3, 4, 5, 7, 9, 12, 16, 21, 27, 36, 48, 64)]


def test_the_hart_release_runs_48_and_64_unguided_and_projects_64_layer_by_layer():
    """FasterVAR's hart/sample_fastervar.py: guidance 0 on the last two scales, nothing skipped; at 64² each of the 24
    layers is its own chunk with ``r = int(ratio min(N, C)) + 1`` (C = 1536: r from 29 to 656, spec §2.2)."""
    hart = StageVARScheduler.from_preset("hart")
    plans = hart.plan_scales(HART_SCHEDULE)
    assert [p.cfg_uncond_only for p in plans] == [False] * 12 + [True, True] and not any(p.skip for p in plans)
    assert hart.chunks(24) == [(j, j + 1) for j in range(24)]
    mixers = [RepresentativeMixer(ratio, [], hart.config.rank_basis) for ratio in hart.config.rank_ratios[0]]
    ranks = [m.rank(64 * 64, 1536) for m in mixers]
    assert (min(ranks), max(ranks)) == (29, 656)
    # Infinity's basis is the token count: the same ratio gives a rank 64 * 64 / 1536 times larger at 64²
    assert RepresentativeMixer(0.25, [], "tokens").rank(4096, 1536) == 1025
    assert RepresentativeMixer(0.25, [], "tokens_or_width").rank(4096, 1536) == 385


def test_on_hart_a_batch_keeps_every_image_independent_and_the_positions_matter(pipes):
    pipe = pipes("hart")
    depth = pipe.transformer.config.depth
    scheduler = StageVARScheduler.from_preset("hart", num_chunks=depth, rank_ratios=((0.3,) * depth,))

    def run(s, generators, prompts=("a red fox", "a blue bird")):
        return pipe(list(prompts), generator=generators, acceleration=s, guidance_scale=3.0, output_type="pt").images

    first = run(scheduler, [g(1), g(2)])
    other = run(scheduler, [g(1), g(3)], prompts=("a red fox", "two green circles"))
    assert torch.equal(first[0], other[0]) and not torch.equal(first[1], other[1])
    assert torch.equal(first, run(scheduler, [g(1), g(2)]))
    assert not torch.equal(first, run(None, [g(1), g(2)]))
    at_first = StageVARScheduler(**{**scheduler.config, "mixture_positions": "first"})
    assert not torch.equal(first, run(at_first, [g(1), g(2)]))


def test_the_paper_variant_projects_the_whole_fidelity_stage_and_skips_nothing():
    """Spec §6 #1: the paper projects and restores over 40², 48² and 64²; the release skips 48² and 64². The ranks
    of the released alpha = 0.96 table at 48² and 64² are the spec's (§2.2)."""
    paper = StageVARScheduler.paper_variant()
    schedule = [(1, s, s) for s in (1, 2, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64)]
    plans = paper.plan_scales(schedule)
    assert not any(p.skip for p in plans) and [p.cfg_uncond_only for p in plans] == [False] * 10 + [True] * 3
    ranks = {
        side: [stage_rank(r, side * side) for r in ratios]
        for side, ratios in zip((40, 48, 64), paper.config.rank_ratios)
    }
    assert ranks[40] == [27, 219, 337, 401, 410, 317, 252, 306]
    assert ranks[48] == [31, 271, 437, 512, 541, 422, 309, 376]
    assert ranks[64] == [34, 223, 341, 273, 233, 122, 157, 228]
    assert paper.paper_variant(projection_seed=3).config.projection_seed == 3
    with pytest.raises(ValueError, match="no setting"):
        StageVARScheduler.paper_variant(alpha=0.9)


def test_graph_runners_refuse_projected_passes_and_run_the_unguided_ones(monkeypatch):
    """The mixer draws inside the pass, which a captured or compiled pass cannot hold: the loop refuses a scheduler
    that says so before any pass runs, and both runners refuse a projected pass of one that does not, each naming the
    way out. Without projection the unguided (unconditional-only) passes run in graphs, as eager."""
    from diffusers_var_accel import InfinityPipeline
    from diffusers_var_accel.embedded import EMBEDDED_SAMPLING

    emb = InfinityPipeline.from_pretrained("embedded")
    emb.set_progress_bar_config(disable=True)

    def run():
        return emb("two red circles", generator=g(3), output_type="pt", **EMBEDDED_SAMPLING).images

    own = StageVARScheduler.from_pretrained("embedded/stagevar").config
    unguided_run = [s for s in own.unconditional_scales if s not in own.skipped_scales]  # unguided scales that run
    projected = dict(projected_scales=unguided_run[:1], rank_ratios=[[0.25] * own.num_chunks])
    scheduler = emb.enable_stagevar(**projected)  # the embedded preset with its first running unguided scale projected
    assert (
        scheduler.draws_inside_passes
        and not emb.enable_stagevar(projected_scales=(), rank_ratios=()).draws_inside_passes
    )
    emb.enable_stagevar(**projected)
    try:
        for enable, name in (
            (lambda: emb.enable_cuda_graphs(capture="trace"), "enable_cuda_graphs"),
            (lambda: emb.compile_passes(backend="eager", fullgraph=True), "compile_passes"),
        ):
            enable()
            with pytest.raises(ValueError, match="StageVARScheduler draws random numbers inside its passes"):
                run()
            with monkeypatch.context() as undeclared:  # a scheduler that does not say so: the runner's own check
                undeclared.setattr(StageVARScheduler, "draws_inside_passes", False)
                with pytest.raises(
                    ValueError, match=rf"{name}\(\): this pass runs layers \[0, 3\] on random token mixtures"
                ):
                    run()
            emb.disable_cuda_graphs()
        emb.enable_stagevar(projected_scales=(), rank_ratios=())
        eager = run()
        emb.enable_cuda_graphs(capture="trace")
        assert torch.equal(run(), eager) and torch.equal(run(), eager) and emb._pass_runner.replayed_passes > 0
    finally:
        emb.disable_cuda_graphs()
        emb.disable_acceleration()


def test_a_near_tie_is_drawn_as_the_official_expression_rounds_it():
    """The positions are an exponential race on the probabilities, so their float32 rounding decides near-ties. Rows
    whose squared norms are proportional to the race's exponential draws make every race value the same number
    mathematically: the order is then decided by rounding alone. The official code's draws (its expression
    ``c * norm(x, dim=2) ** 2 / total``, normalised again, then ``multinomial``) must be reproduced; the plain
    ``x.square().sum(-1) / sum`` (what this computed before) draws another order."""
    num_tokens, width, rank, seed = 64, 8, 16, 5
    race_draws = torch.empty(1, num_tokens).exponential_(generator=g(seed))
    directions = torch.randn(num_tokens, width, generator=g(1))
    directions = directions / directions.norm(dim=-1, keepdim=True)
    x = (directions * race_draws.reshape(num_tokens, 1).sqrt()).unsqueeze(0)

    row_norm2 = torch.norm(x, dim=2) ** 2  # the official expression, written out
    official = 0.1 * row_norm2 / row_norm2.sum(dim=1, keepdim=True)
    official = official / official.sum(dim=1, keepdim=True)
    expected = torch.multinomial(official, rank, replacement=False, generator=g(seed))

    positions, _ = RepresentativeMixer(rank / num_tokens - 1e-9, [g(seed)])(x)
    assert positions.shape == (1, rank) and torch.equal(positions, expected)
    energy = x.square().sum(-1)
    plain = torch.multinomial(energy / energy.sum(-1, keepdim=True), rank, replacement=False, generator=g(seed))
    assert not torch.equal(plain, expected)  # the construction is a near-tie that the expression decides


@pytest.mark.parametrize("num_tokens, rank", [(1600, 27), (4096, 656), (10, 10), (50, 1)])
def test_positions_are_multinomials_draws_without_its_sync(num_tokens, rank):
    """The write positions are ``torch.multinomial(..., replacement=False)``'s, bit for bit and in its order, and the
    generator is left where it leaves it (the projection drawn next is the same), with no host check of the
    probabilities (sync-free on a GPU)."""
    from diffusers_var_accel.next_scale.capture_check import CaptureCheck
    from diffusers_var_accel.schedulers.scheduling_stagevar import draw_without_replacement

    probs = torch.rand(1, num_tokens, generator=g(0)).square()
    probs = probs / probs.sum()
    expected_gen, ours_gen = g(5), g(5)
    expected = torch.multinomial(probs, rank, replacement=False, generator=expected_gen)
    with CaptureCheck("drawing positions", allow_draws=True):  # raises at the first host sync or upload
        ours = draw_without_replacement(probs, rank, ours_gen)
    assert torch.equal(ours, expected)
    assert torch.equal(torch.randn(4, generator=ours_gen), torch.randn(4, generator=expected_gen))
