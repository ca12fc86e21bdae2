"""LazyVARScheduler: update index, token selection with the cumulative retained index, parallel group decoding, zero
residuals, configuration and the pipeline shortcut.

Loop-level tests run the official tiny Infinity fixture at 256x256 (7 scales: the default group is scales 3..6, with
token maps 6x6, 8x8, 12x12, 16x16); pipeline tests use the tiny random pipeline.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from diffusers.configuration_utils import register_to_config

from diffusers_var_accel import InfinityBSQVAE, InfinityTransformer, LazyVARScheduler, ScalePlan, run_next_scale_loop
from diffusers_var_accel import schedule_for_size, supported_sizes
from diffusers_var_accel.next_scale.executor import keep_residual
from diffusers_var_accel.next_scale.plan import PassRoutes, TokenRoute
from diffusers_var_accel.models.infinity_resolutions import rope_grid_hw
from diffusers_var_accel.pipelines.infinity import InfinityScaleFamily
from diffusers_var_accel.schedulers import ComposedScheduler, VARAccelScheduler
from diffusers_var_accel.schedulers.scheduling_lazyvar import lazyvar_keep_indices, num_kept_tokens, update_index
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "infinity"
SCHEDULE, TEMPLATE = schedule_for_size(256, 256)
S = len(SCHEDULE)
GROUP = tuple(range(S - 4, S))
PRESET_RATIOS = (0.20, 0.10, 0.05, 0.01)


@pytest.fixture(scope="module")
def models():
    transformer = InfinityTransformer.from_original_checkpoint(FIXTURE / "infinity_tiny.pth")
    vae = InfinityBSQVAE.from_original_checkpoint(FIXTURE / "vae_tiny.pth")
    return transformer, vae


def _family(models):
    return InfinityScaleFamily(*models, SCHEDULE, rope_grid_hw(TEMPLATE), top_k=0, top_p=None)


def _run(models, scheduler=None, teacher=None, family=None, on_scale_end=None, cfg=3.0, batch=2):
    transformer = models[0]
    g = torch.Generator().manual_seed(3)
    text = torch.randn(batch, 6, transformer.config.text_channels, generator=g)
    mask = torch.ones(batch, 6, dtype=torch.bool)
    text, mask = torch.cat((text, transformer.null_text_embeds(mask))), torch.cat((mask, mask))
    with torch.no_grad():
        condition = transformer.encode_condition(text, mask)
        return run_next_scale_loop(
            family or _family(models),
            condition,
            SCHEDULE,
            batch,
            [cfg] * S,
            [1.0] * S,
            torch.Generator().manual_seed(0),
            scheduler,
            teacher,
            on_scale_end,
        )


def _check_cumulative_index(kept, hws, u_BHW, ratios):
    """Walk the group largest scale first, with the positions claimed so far (a token of an h x w map covers the final
    positions (Y, X) with (Y h // H, X w // W) equal to its own cell). Returns the number of doubly assigned positions.

    A scale with at least n free tokens (covering no claimed position) must keep only free tokens; a scale with fewer
    must keep all of them. The largest scale keeps the top n of the update index.
    """
    B, H, W = u_BHW.shape
    claimed = torch.zeros(B, H, W, dtype=torch.bool)
    overlaps = 0
    for m in reversed(range(len(hws))):
        (h, w), n, index = hws[m], num_kept_tokens(ratios[m], hws[m][0] * hws[m][1]), kept[m]
        assert index.shape == (B, n) and all(len(set(row.tolist())) == n for row in index)
        keep = torch.zeros(B, h * w, dtype=torch.bool).scatter_(1, index, True).view(B, h, w)
        ys = torch.tensor([y * h // H for y in range(H)])[:, None].expand(H, W)
        xs = torch.tensor([x * w // W for x in range(W)])[None, :].expand(H, W)
        covered = keep[:, ys, xs]
        taken = torch.zeros(B, h, w, dtype=torch.bool)
        rows, Ys, Xs = claimed.nonzero(as_tuple=True)
        taken[rows, ys[Ys, Xs], xs[Ys, Xs]] = True
        enough = (~taken).flatten(1).sum(1) >= n
        assert not (covered & claimed)[enough].any()
        assert (keep | taken)[~enough].all()  # too few free tokens: every free one is kept
        overlaps += int((covered & claimed).sum())
        claimed |= covered
    top = torch.sort(u_BHW.flatten(1), dim=1, descending=True, stable=True).indices[:, : kept[-1].shape[1]]
    assert torch.equal(kept[-1], top.sort(1).values)  # the highest-update tokens go to the largest scale
    return overlaps


# ---------------------------------------------------------------------------------------------------------------------
# update index and token selection
# ---------------------------------------------------------------------------------------------------------------------
def test_update_index_is_one_minus_cosine():
    prev = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [3.0, 4.0]]).T.reshape(1, 2, 2, 2)
    cur = torch.tensor([[2.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [-4.0, 3.0]]).T.reshape(1, 2, 2, 2)
    expected = torch.tensor([[0.0, 1 - 2**-0.5], [2.0, 1.0]]).unsqueeze(0)
    torch.testing.assert_close(update_index(prev, cur), expected, atol=1e-6, rtol=0)
    # f_hat_{-1} := 0: every position of the first scale is new
    torch.testing.assert_close(update_index(None, cur), torch.ones(1, 2, 2))


@pytest.mark.parametrize(
    "ratio, tokens, n",
    [
        (0.2, 1600, 320),
        (0.05, 2304, 116),
        (0.01, 4096, 41),
        (0.01, 36, 1),
        (0.0, 100, 0),
        (1.0, 7, 7),
        (0.1, 1600, 160),
    ],
)
def test_number_of_kept_tokens_is_the_ceiling(ratio, tokens, n):
    assert num_kept_tokens(ratio, tokens) == n


def test_selection_keeps_the_top_tokens_of_a_hand_built_map():
    u = torch.tensor(
        [[0.0, 0.95, 0.41, 0.42], [0.0, 0.0, 0.43, 0.44], [0.1, 0.0, 0.0, 0.0], [0.0, 0.2, 0.0, 0.3]]
    ).unsqueeze(0)
    (kept,) = lazyvar_keep_indices(u, [(4, 4)], [0.25])
    assert kept.tolist() == [[1, 3, 6, 7]]
    # area downsampling: the 2x2 cell with the largest mean (top-right), not the one with the largest value
    (kept,) = lazyvar_keep_indices(u, [(2, 2)], [0.25])
    assert kept.tolist() == [[1]]


@pytest.mark.parametrize("mode, small", [("claimed", [1, 3]), ("count", [1, 3]), (None, [0, 3])])
def test_cumulative_index_on_a_hand_built_map(mode, small):
    # the four largest updates fill the top-left 2x2 cell; cell means: top-left 0.9, bottom-right 0.5, top-right 0.3
    u = torch.zeros(1, 4, 4)
    u[0, :2, :2] = 0.9
    u[0, :2, 2:] = 0.3
    u[0, 2:, :2] = 0.1
    u[0, 2:, 2:] = 0.5
    kept_small, kept_final = lazyvar_keep_indices(u, [(2, 2), (4, 4)], [0.5, 0.25], mode)
    assert kept_final.tolist() == [[0, 1, 4, 5]]  # the largest scale takes the highest-update tokens
    # "count": cum = 4 positions of the 4x4 map = 1 token of the 2x2 map, skipped; "claimed": cell 0 is taken
    assert kept_small.tolist() == [small]


def test_count_mode_skips_the_papers_count():
    hws, ratios = [(32, 32), (40, 40), (48, 48), (64, 64)], PRESET_RATIOS
    u = torch.rand(2, 64, 64, generator=torch.Generator().manual_seed(0))
    kept = lazyvar_keep_indices(u, hws, ratios, "count")
    n = [num_kept_tokens(r, h * w) for r, (h, w) in zip(ratios, hws)]
    for m, (h, w) in enumerate(hws):
        cum = round(sum(n[k] * 64 * 64 / (hws[k][0] * hws[k][1]) for k in range(m + 1, 4)) * h * w / (64 * 64))
        order = torch.sort(
            F.interpolate(u[:, None], size=(h, w), mode="area").flatten(1), dim=1, descending=True, stable=True
        ).indices
        assert torch.equal(kept[m], order[:, cum : cum + n[m]].sort(1).values)
    assert [k.shape[1] for k in kept] == [205, 160, 116, 41]


@pytest.mark.parametrize(
    "ratios", [PRESET_RATIOS, (0.4, 0.2, 0.1, 0.02), (0.3, 0.2), (0.15, 0.1, 0.05), (0.6, 0.3, 0.2)]
)
def test_cumulative_index_never_assigns_a_position_to_two_scales(ratios):
    """Over every supported schedule: smooth update indices (as real latents give) and white noise."""
    g = torch.Generator().manual_seed(len(ratios))
    for height, width in supported_sizes():
        schedule, _ = schedule_for_size(height, width)
        hws = [tuple(s[-2:]) for s in schedule[-len(ratios) :]]
        H, W = hws[-1]
        smooth = F.interpolate(torch.rand(2, 1, 5, 5, generator=g), size=(H, W), mode="bilinear")[:, 0]
        noise = torch.rand(2, H, W, generator=g)
        for u in (smooth, noise):
            overlaps = _check_cumulative_index(lazyvar_keep_indices(u, hws, ratios), hws, u, ratios)
            if sum(ratios) <= 0.4 and u is smooth:
                assert overlaps == 0, (height, width)


# ---------------------------------------------------------------------------------------------------------------------
# plans and configuration
# ---------------------------------------------------------------------------------------------------------------------
def test_plans_group_the_last_scales_of_every_schedule():
    for num_scales in (7, 10, 12, 13):
        plans = LazyVARScheduler().plan_scales([(1, 1, 1)] * num_scales)
        assert [p.scale_indices for p in plans] == [(k,) for k in range(num_scales - 4)] + [
            tuple(range(num_scales - 4, num_scales))
        ]
    sequential = LazyVARScheduler(parallel_decoding=False).plan_scales([(1, 1, 1)] * 13)
    assert [p.scale_indices for p in sequential] == [(k,) for k in range(13)]
    middle = LazyVARScheduler(group_scales=(-6, -5), keep_ratios=(0.5, 0.5)).plan_scales([(1, 1, 1)] * 13)
    assert [p.scale_indices for p in middle] == [(k,) for k in range(7)] + [(7, 8), (9,), (10,), (11,), (12,)]
    assert LazyVARScheduler(keep_ratios=(0, 0, 0, 0)).plan_scales([(1, 1, 1)] * 13)[-1] == ScalePlan(
        tuple(range(9, 13)), skip=True
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(group_scales=(), keep_ratios=()), "non-empty"),
        (dict(group_scales=(9, 8), keep_ratios=(0.1, 0.1)), "consecutive"),
        (dict(keep_ratios=(0.2, 0.1)), "one keep ratio per scale"),
    ],
)
def test_invalid_settings_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LazyVARScheduler(**kwargs)


@pytest.mark.parametrize(
    "group, num_scales, message",
    [
        ((11, 12, 13), 13, "outside"),
        ((-8, -7), 7, "outside"),
        ((9, -1), 13, "not consecutive"),
        ((-7, -6), 7, "scale 0"),
    ],
)
def test_groups_that_do_not_fit_the_schedule_raise(group, num_scales, message):
    scheduler = LazyVARScheduler(group_scales=group, keep_ratios=(0.1,) * len(group))
    with pytest.raises(ValueError, match=message):
        scheduler.plan_scales([(1, 1, 1)] * num_scales)


def test_presets():
    infinity = LazyVARScheduler.from_preset("infinity")
    # the constructor's defaults are the paper's Infinity setting; the default family is None (fits every family)
    assert {
        **infinity.to_dict(),
        "model_family": None,
    } == LazyVARScheduler().to_dict() and LazyVARScheduler().model_family is None
    assert [p.scale_indices for p in infinity.plan_scales([(1, 1, 1)] * 13)][-1] == (9, 10, 11, 12)  # scales 10..13
    assert LazyVARScheduler.from_preset("hart").model_family == "hart"
    assert LazyVARScheduler.from_preset("infinity", keep_ratios=(0.4, 0.2, 0.1, 0.02)).config.keep_ratios == (
        0.4,
        0.2,
        0.1,
        0.02,
    )
    with pytest.raises(ValueError, match="no setting"):
        LazyVARScheduler.from_preset("infinity", ratios=(0.1,))


# ---------------------------------------------------------------------------------------------------------------------
# the method on the official tiny model
# ---------------------------------------------------------------------------------------------------------------------
class _InputsFromBeforeTheGroup:
    """The family, except that the group's inputs come from ``f_hat`` before the group (what PGD approximates)."""

    def __init__(self, family, f_hat_before):
        self._family, self._f_hat_before = family, f_hat_before

    def __getattr__(self, name):
        return getattr(self._family, name)

    def embed(self, f_hat, scale_indices, condition, scale_index_L):
        in_group = [si in GROUP for si in scale_indices]
        assert all(in_group) or not any(in_group), f"pass {scale_indices} mixes the group and other scales"
        return self._family.embed(
            self._f_hat_before if all(in_group) else f_hat, scale_indices, condition, scale_index_L
        )


class _OneByOne(VARAccelScheduler):
    """Reference: the group's scales one pass each, pruned to given tokens, zero residual elsewhere (each block on its
    own: one route per layer, so no span)."""

    def __init__(self, kept):
        super().__init__()
        self.kept = kept

    def route_pass(self, state, plan):
        k = plan.scale_indices[0]
        if k not in self.kept or self.kept[k].shape[1] == SCHEDULE[k][1] * SCHEDULE[k][2]:
            return None
        return PassRoutes(
            routes={
                (layer, "block"): TokenRoute(index=self.kept[k].clone()) for layer in range(state.model.num_layers)
            },
            residual_tokens={k: self.kept[k]},
        )


def _grouped_and_one_by_one(models, scheduler):
    before = {}
    grouped = _run(
        models,
        scheduler,
        on_scale_end=lambda k, st: before.setdefault("f_hat", st.f_hat.clone()) if k == GROUP[0] - 1 else None,
    )
    teacher = [grouped.tokens[k] for k in range(S)]
    kept = scheduler.kept_tokens(grouped)
    reference = _run(models, _OneByOne(kept), teacher, _InputsFromBeforeTheGroup(_family(models), before["f_hat"]))
    return grouped, reference, kept


def test_grouped_decoding_of_all_tokens_equals_decoding_the_scales_one_by_one(models):
    scheduler = LazyVARScheduler(keep_ratios=(1, 1, 1, 1), cumulative_index=None)
    grouped, reference, kept = _grouped_and_one_by_one(models, scheduler)
    assert all(kept[k].shape[1] == SCHEDULE[k][1] * SCHEDULE[k][2] for k in GROUP)
    for k in range(S):
        torch.testing.assert_close(grouped.logits[k], reference.logits[k], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grouped.f_hat, reference.f_hat, atol=1e-6, rtol=0)


def test_pruned_group_equals_decoding_the_kept_tokens_one_by_one(models):
    scheduler = LazyVARScheduler()
    grouped, reference, kept = _grouped_and_one_by_one(models, scheduler)
    assert [kept[k].shape[1] for k in GROUP] == [8, 7, 8, 3]
    for k in range(S):
        torch.testing.assert_close(grouped.logits[k], reference.logits[k], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grouped.f_hat, reference.f_hat, atol=1e-6, rtol=0)
    # the group attended to the cache and its kept tokens' keys/values only; being the last pass, it kept none
    before = sum(SCHEDULE[k][1] * SCHEDULE[k][2] for k in range(GROUP[0]))
    assert grouped.kv_cache.attended_length(0) == before + sum(kept[k].shape[1] for k in GROUP)
    assert grouped.kv_cache.get_seq_length(0) == before


def test_pruned_positions_get_a_zero_residual(models):
    scheduler, before = LazyVARScheduler(), {}
    state = _run(
        models,
        scheduler,
        on_scale_end=lambda k, st: before.setdefault("f_hat", st.f_hat.clone()) if k == GROUP[0] - 1 else None,
    )
    vae, (H, W) = models[1], SCHEDULE[-1][1:]
    kept, support, added = scheduler.kept_tokens(state), torch.zeros(2, 1, H, W), 0
    for k in GROUP:
        h, w = SCHEDULE[k][1:]
        keep = torch.zeros(2, h * w).scatter_(1, kept[k], 1.0).view(2, 1, h, w)
        codes = vae.bits_to_codes(state.tokens[k].reshape(2, h, w, -1))
        assert torch.equal(keep_residual(codes, kept[k]), codes * keep)  # pruned codes are zeroed
        if k < S - 1:
            support = (
                support + vae.add_scale_codes(None, keep.expand(-1, codes.shape[1], -1, -1), (H, W), False)[:, :1]
            )
        added = added + vae.add_scale_codes(None, codes * keep, (H, W), is_last_scale=k == S - 1)
    delta = state.f_hat - before["f_hat"]
    torch.testing.assert_close(delta, added, atol=1e-6, rtol=0)
    # f_hat changes only where a kept token reaches: its cell (blurred by the upsampling) for the smaller scales,
    # exactly the kept positions for the last scale (final resolution)
    last = torch.zeros(2, H * W, dtype=torch.bool).scatter_(1, kept[S - 1], True).view(2, 1, H, W)
    outside = (support == 0).expand_as(delta)
    changed = (delta != 0).any(1, keepdim=True).expand_as(delta)
    assert torch.equal(changed[outside], last.expand_as(delta)[outside])
    assert (support == 0).float().mean() > 0.2  # not vacuous: much of the latent is out of reach


def test_without_parallel_decoding_each_scale_uses_the_index_after_the_previous_one(models):
    scheduler, f_hats = LazyVARScheduler(parallel_decoding=False), {}
    state = _run(models, scheduler, on_scale_end=lambda k, st: f_hats.__setitem__(k, st.f_hat.clone()))
    kept = scheduler.kept_tokens(state)
    for k, r in zip(GROUP, PRESET_RATIOS):
        u = update_index(f_hats.get(k - 2), f_hats[k - 1])
        (expected,) = lazyvar_keep_indices(u, [tuple(SCHEDULE[k][1:])], [r], None)
        assert torch.equal(kept[k], expected)
    assert state.kv_cache.attended_length(0) == sum(h * w for _, h, w in SCHEDULE[: GROUP[0]]) + sum(
        kept[k].shape[1] for k in GROUP
    )


def test_zero_keep_ratios_add_nothing(models):
    before = {}
    remember = lambda k, st: before.setdefault("f_hat", st.f_hat.clone()) if k == GROUP[0] - 1 else None  # noqa: E731
    nothing = _run(models, LazyVARScheduler(keep_ratios=(0, 0, 0, 0)), on_scale_end=remember)
    assert torch.equal(nothing.f_hat, before["f_hat"]) and not set(GROUP) & set(nothing.tokens)  # the pass is skipped
    for parallel in (True, False):
        scheduler = LazyVARScheduler(keep_ratios=(0.2, 0.0, 0.05, 0.01), parallel_decoding=parallel)
        state = _run(models, scheduler)
        assert scheduler.kept_tokens(state).get(GROUP[1], torch.empty(2, 0)).shape == (2, 0)
        assert (GROUP[1] in state.tokens) == parallel  # without PGD the empty scale is skipped


# ---------------------------------------------------------------------------------------------------------------------
# the pipeline
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pipe():
    pipeline = build_tiny_infinity_pipeline(seed=0)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def _latents(pipe, prompt="a red fox in the snow", seed=0, height=256, width=256, **kwargs):
    generator = kwargs.pop("generator", torch.Generator().manual_seed(seed))
    return pipe(prompt, height=height, width=width, generator=generator, output_type="latent", **kwargs).images


class _HalveLastScale(VARAccelScheduler):
    """A second rule for the composition test: CFG-halve the last scale (ARVAR's branch halving)."""

    @register_to_config
    def __init__(self, model_family=None):
        super().__init__()

    def plan_scales(self, scale_schedule, model=None):
        n = len(scale_schedule)
        return [ScalePlan((k,), cfg_halve=k == n - 1) for k in range(n)]


def test_composed_with_cfg_halving_of_the_last_scale(pipe):
    rows = {}

    def record(p, k, scale, kwargs):
        rows[k] = kwargs["logits"].shape[0]
        return {}

    prompts = ["a red fox in the snow", "two cats"]
    composed = ComposedScheduler([LazyVARScheduler(), _HalveLastScale()])
    out = _latents(
        pipe,
        prompts,
        acceleration=composed,
        top_k=1,
        callback_on_step_end=record,
        callback_on_step_end_tensor_inputs=["logits"],
    )
    num_scales = len(rows)
    assert rows[num_scales - 1] == 2 and rows[0] == 4  # the group's pass ran the conditional rows only
    assert [rows[k] for k in range(num_scales)] == [4] * (num_scales - 4) + [2] * 4
    # equal to LazyVAR alone with guidance 1 on the group (a halved pass has a zero guidance difference)
    reference = _latents(
        pipe, prompts, acceleration=LazyVARScheduler(), top_k=1, cfg_list=[4.0] * (num_scales - 4) + [1.0] * 4
    )
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=0)
