"""Composition of the four methods through the one executor: the rules of ``ComposedScheduler``, the compositions the
library promises (they run end to end on both families), and the table of every pair of presets (docs/acceleration.md):
each pair composes or fails with an error that names both members and the reason."""

from __future__ import annotations

import pytest
import torch

from diffusers_var_accel import (
    HART_CONFIGS,
    ARVARScheduler,
    ComposedScheduler,
    DepthVARScheduler,
    LazyVARScheduler,
)
from diffusers_var_accel.schedulers.scheduling_fastvar import pivotal_token_scores
from diffusers_var_accel.schedulers.scheduling_lazyvar import PivotalGroupTokens
from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline
from registry_lists import FAMILIES, METHODS

pytestmark = pytest.mark.usefixtures("one_thread")


#: Every pair of presets (both orders behave alike): ``None`` = composes, else the reason the error gives. The table in
#: docs/acceleration.md is this one.
PAIRS = {
    "infinity": {
        ("fastvar", "lazyvar"): "skips scale .* which LazyVARScheduler",
        ("fastvar", "depthvar"): "skips scale .* which DepthVARScheduler",
        ("fastvar", "arvar"): "skips scale .* which ARVARScheduler",
        ("lazyvar", "depthvar"): None,
        ("lazyvar", "arvar"): "must run alone, not in the group",
        (
            "depthvar",
            "arvar",
        ): "ARVARScheduler .* records the attention map of layer .* DepthVARScheduler .* routes that layer",
        (
            "fastvar",
            "stagevar",
        ): "StageVARScheduler .* records the block output of layer .* FastVARScheduler .* routes that layer",
        ("lazyvar", "stagevar"): "StageVARScheduler .* skips scale .* which LazyVARScheduler",
        ("depthvar", "stagevar"): "StageVARScheduler .* skips scale .* which DepthVARScheduler",
        ("arvar", "stagevar"): "StageVARScheduler .* skips scale .* which ARVARScheduler",
    },
    "hart": {
        ("fastvar", "lazyvar"): "FastVAR routes single-scale passes",
        (
            "fastvar",
            "depthvar",
        ): "FastVARScheduler .* records the sublayer update .* DepthVARScheduler .* routes that layer",
        ("fastvar", "arvar"): "routed as a whole block or per sublayer, not both",
        ("lazyvar", "depthvar"): None,
        ("lazyvar", "arvar"): "must run alone, not in the group",
        (
            "depthvar",
            "arvar",
        ): "ARVARScheduler .* records the attention map of layer .* DepthVARScheduler .* routes that layer",
        (
            "fastvar",
            "stagevar",
        ): "StageVARScheduler .* records the block output of layer .* FastVARScheduler .* routes that layer",
        ("lazyvar", "stagevar"): "StageVAR projects scale 13, which is decoded in the group \\[12, 13\\]",
        (
            "depthvar",
            "stagevar",
        ): "StageVARScheduler .* records the block output of layer .* DepthVARScheduler .* routes that layer",
        ("arvar", "stagevar"): "cfg_halve .* and cfg_uncond_only .* are two branch rules; a pass takes one",
    },
}

#: StageVAR's presets split the real models' blocks into 8 (Infinity-2B) and 24 (HART-0.7B) chunks; the tiny models
#: here have 4 blocks, so they run 4 chunks (one per block) at ratios of the presets' range.
STAGEVAR_CHUNKS = {
    "infinity": {"num_chunks": 4, "rank_ratios": ((0.2,) * 4,)},
    "hart": {"num_chunks": 4, "rank_ratios": ((0.3,) * 4,)},
}


@pytest.fixture(scope="module")
def pipes():
    infinity = build_tiny_infinity_pipeline(seed=0, depth=4)
    hart = build_tiny_hart_pipeline(seed=0, depth=4, patch_nums=HART_CONFIGS["hart-0.7b"]["patch_nums"])
    for pipe in (infinity, hart):
        pipe.set_progress_bar_config(disable=True)
    return {"infinity": infinity, "hart": hart}


def latents(pipes, family, scheduler=None):
    size = dict(height=1024, width=1024) if family == "infinity" else {}  # the real 13 / 14-scale schedules
    return pipes[family](
        "a fox in the snow",
        generator=torch.Generator().manual_seed(0),
        acceleration=scheduler,
        output_type="latent",
        **size,
    ).images


def preset(family, method, **overrides):
    if method == "stagevar":
        overrides = {**STAGEVAR_CHUNKS[family], **overrides}
    return METHODS[method].from_preset(family, **overrides)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pair", list(PAIRS["infinity"]))
@pytest.mark.parametrize("reverse", [False, True])
def test_every_pair_of_presets_composes_or_names_both_members(pipes, family, pair, reverse):
    members = [preset(family, m) for m in (reversed(pair) if reverse else pair)]
    reason = PAIRS[family][pair]
    if reason is None:
        out = latents(pipes, family, ComposedScheduler(members))
        assert torch.isfinite(out).all()
        assert not torch.equal(out, latents(pipes, family, members[0]))  # both methods act
        assert not torch.equal(out, latents(pipes, family, members[1]))
    else:
        with pytest.raises(ValueError, match=reason):
            latents(pipes, family, ComposedScheduler(members))


@pytest.mark.parametrize("family", FAMILIES)
def test_fastvar_with_branch_halving_before_its_skipped_scales(pipes, family):
    """FastVAR's preset and ARVAR's branch halving at the 4th/3rd scales from the end (which FastVAR prunes): halving
    combines with pruning, and FastVAR's skipped scales are no conflict since ARVAR does not act on them."""
    fastvar = preset(family, "fastvar")
    halving = ARVARScheduler(branch_halving_scales=[-4, -3], pruned_scales=[], model_family=family)
    out = latents(pipes, family, ComposedScheduler([fastvar, halving]))
    assert torch.isfinite(out).all()
    assert not torch.equal(out, latents(pipes, family, fastvar))
    assert torch.equal(out, latents(pipes, family, ComposedScheduler([halving, fastvar])))


#: StageVAR's branch rule alone (guidance off on its scales, no projection) with each method's token rule, per family:
#: the StageVAR overrides with which each pair composes.
STAGEVAR_BRANCH_RULE = {
    "infinity": {"fastvar": {}, "lazyvar": {"skipped_scales": ()}, "depthvar": {"skipped_scales": ()}},
    "hart": {"fastvar": {}, "lazyvar": {}, "depthvar": {}},
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("other", ["fastvar", "lazyvar", "depthvar"])
def test_stagevar_branch_rule_composes_with_the_token_rules(pipes, family, other):
    """The spec's composition: StageVAR's unguided (unconditional-only) scales with FastVAR's pruning, LazyVAR's
    kept tokens or DepthVAR's depths on the same scales (on Infinity without StageVAR's skip, which LazyVAR's group
    and DepthVAR's dynamic scales would lose). Either order gives the same latent, and both methods act."""
    stagevar = preset(family, "stagevar", projected_scales=(), rank_ratios=(), **STAGEVAR_BRANCH_RULE[family][other])
    member = preset(family, other)
    out = latents(pipes, family, ComposedScheduler([stagevar, member]))
    assert torch.isfinite(out).all()
    assert torch.equal(out, latents(pipes, family, ComposedScheduler([member, stagevar])))
    assert not torch.equal(out, latents(pipes, family, stagevar)) and not torch.equal(
        out, latents(pipes, family, member)
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_depth_within_kept_tokens_at_full_depth_is_lazyvar_alone(pipes, family):
    """A nested route that keeps every kept token in every layer changes nothing: DepthVAR at budget 1 on LazyVAR's
    group gives LazyVAR's latent bit for bit, in either order of the members."""
    lazyvar = preset(family, "lazyvar")
    group = len(lazyvar.config.group_scales)
    full_depth = DepthVARScheduler(reference_scale=-1, start_scale=-group, model_family=family)
    alone = latents(pipes, family, lazyvar)
    assert torch.equal(latents(pipes, family, ComposedScheduler([lazyvar, full_depth])), alone)
    assert torch.equal(latents(pipes, family, ComposedScheduler([full_depth, lazyvar])), alone)


@pytest.mark.parametrize("family", FAMILIES)
def test_depthvar_with_an_end_scale_before_a_lazyvar_group(pipes, family):
    lazyvar = preset(family, "lazyvar")
    group = len(lazyvar.config.group_scales)
    depthvar = DepthVARScheduler(reference_scale=-(group + 3), end_scale=-(group + 1), model_family=family)
    assert sorted(depthvar.budgets([(1, s, s) for s in range(1, 14)])) == [13 - group - 2, 13 - group - 1]
    out = latents(pipes, family, ComposedScheduler([depthvar, lazyvar]))
    assert torch.isfinite(out).all() and not torch.equal(out, latents(pipes, family, lazyvar))
    # a dynamic scale right after a group would be ranked by a grouped scale: refused, the error names end_scale
    inner = ComposedScheduler(
        [
            LazyVARScheduler(group_scales=(-4, -3), keep_ratios=(0.2, 0.1), model_family=family),
            DepthVARScheduler(reference_scale=-3, model_family=family),
        ]
    )
    with pytest.raises(ValueError, match="end_scale"):
        latents(pipes, family, inner)


@pytest.mark.parametrize("family", FAMILIES)
def test_lazyvar_with_pivotal_token_scores(pipes, family):
    """The paper's "PTS instead of the update index" ablation: FastVAR's scores choose LazyVAR's tokens."""
    pts = preset(family, "lazyvar", token_scores="pivotal")
    out = latents(pipes, family, pts)
    assert torch.isfinite(out).all() and not torch.equal(out, latents(pipes, family, preset(family, "lazyvar")))
    # keeping every token, the PTS route computes all of them: the parallel group decoded densely
    ones = [1.0] * len(pts.config.keep_ratios)
    everything = preset(family, "lazyvar", token_scores="pivotal", keep_ratios=ones)
    dense_group = preset(family, "lazyvar", keep_ratios=ones)
    torch.testing.assert_close(
        latents(pipes, family, everything), latents(pipes, family, dense_group), atol=1e-5, rtol=0
    )


def test_pivotal_group_selection_keeps_each_scales_top_tokens_and_writes_nothing():
    x = torch.randn(4, 4 + 9, 8, generator=torch.Generator().manual_seed(0))  # 2 images x 2 CFG rows; scales 2x2, 3x3
    select = PivotalGroupTokens((5, 6), (4, 9), (2, 3), 2)
    before = dict(vars(select))
    index = select(x)
    assert vars(select) == before  # a pure selector: it returns its choice and keeps nothing
    assert index.shape == (4, 5) and torch.equal(index[:2], index[2:])  # an image's two rows share the choice
    chosen = select.split(index)
    for k, offset, length, n in ((5, 0, 4, 2), (6, 4, 9, 3)):
        want = pivotal_token_scores(x[:2, offset : offset + length]).topk(n, dim=1).indices.sort(dim=1).values
        assert torch.equal(chosen[k], want)
    assert torch.equal(index[:2, 2:] - 4, chosen[6])


def test_the_pivotal_selection_reaches_the_call_through_the_pass_records(pipes):
    """The positions the pivotal selector chooses in a pass are the pass's recorded selection, the zero-residual
    positions of its scales and the call's kept tokens (``kept_tokens``), with nothing written by the selector."""
    from diffusers_var_accel.schedulers.scheduling_lazyvar import PIVOTAL_SELECTION

    pts = preset("infinity", "lazyvar", token_scores="pivotal")
    seen = {}
    route_pass = pts.route_pass

    def spy(state, plan):
        routes = route_pass(state, plan)
        if routes is not None:
            assert PIVOTAL_SELECTION in routes.record.selections and len(routes.residual_tokens) == 0  # not chosen yet
            seen[plan.scale_indices] = (state, routes)
        return routes

    pts.route_pass = spy
    latents(pipes, "infinity", pts)
    assert len(seen) == 1
    ((scales, (state, routes)),) = seen.items()
    kept = pts.kept_tokens(state)
    assert sorted(routes.residual_tokens) == sorted(kept) == list(scales)
    for k in scales:
        assert torch.equal(routes.residual_tokens[k], kept[k]) and kept[k].shape[0] == state.batch_size


def test_bad_token_scores_are_refused():
    with pytest.raises(ValueError, match="token_scores"):
        LazyVARScheduler(token_scores="random")
