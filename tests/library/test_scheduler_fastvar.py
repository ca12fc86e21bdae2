"""FastVARScheduler mechanics on hand-built tensors and the tiny random-weight pipeline (CPU, offline, fast).

PTS picks the tokens farthest from the mean, ``K = L - int(L * r)``, CTR is the area-interpolated cache with the kept
rows overwritten, ratio 0 routes every token bit-identically to the baseline, the preset fits every aspect ratio and
pixel budget, rows are independent, nothing survives a call, and bad settings raise. Faithfulness to the official
code is ``test_parity_fastvar.py``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from diffusers_var_accel import (
    FastVARScheduler,
    schedule_for_size,
    supported_sizes,
)
from diffusers_var_accel.next_scale.executor import scatter_tokens
from diffusers_var_accel.next_scale.executor import interpolate_tokens
from diffusers_var_accel.next_scale.plan import RecordRequest
from diffusers_var_accel.schedulers.scheduling_fastvar import num_kept_tokens, pivotal_token_scores, pivotal_tokens
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

PROMPT = "a red fox in the snow"
DEPTH = 6  # the Infinity preset prunes layers 3..27: layers 3, 4, 5 of this model


def gen(seed):
    return torch.Generator("cpu").manual_seed(seed)


def size_of(template, budget):
    return next(hw for hw, tb in supported_sizes().items() if tb == (template, budget))


SQUARE = size_of(1.0, "0.06M")  # 7 scales: the preset's -5..-1 are scales 2..6
WIDE = size_of(0.5, "0.06M")  # h:w = 1:2; caches 2x4, restores to 3x6 and 5x10
SMALL = size_of(0.75, "0.06M")


@pytest.fixture(scope="module")
def pipe():
    pipeline = build_tiny_infinity_pipeline(seed=0, depth=DEPTH)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


class _LoggingSelector:
    def __init__(self, selector, key, log):
        self.selector, self.key, self.log = selector, key, log

    def __call__(self, x_RLC):
        index = self.selector(x_RLC)
        self.log.setdefault("select", []).append((*self.key, x_RLC.shape, index.clone()))
        self.log.setdefault("index", {})[self.key] = index.clone()
        return index


class _Recording(FastVARScheduler):
    """FastVAR whose selectors are logged and whose routed sublayers' full updates are recorded (test only):
    ``log["restore"][(scale, layer, sublayer)] = (computed updates of the kept tokens or None, kept index or None,
    full update)``."""

    def route_pass(self, state, plan):
        routes = super().route_pass(state, plan)
        if routes is None:
            return None
        k = plan.scale_indices[0]
        routes.routes = {
            key: replace(route, selector=_LoggingSelector(route.selector, (k, *key), self.log))
            for key, route in routes.routes.items()
        }
        routes.record = routes.record | RecordRequest(sublayer_updates=frozenset(routes.routes))
        return routes

    def after_scale(self, state, plan, hidden_states_RLC):
        super().after_scale(state, plan, hidden_states_RLC)
        k = plan.scale_indices[0]
        for key, update in state.records.sublayer_updates.items():
            index = self.log.get("index", {}).get((k, *key))
            computed = None if index is None else update.gather(1, index[..., None].expand(-1, -1, update.shape[-1]))
            self.log.setdefault("restore", {})[(k, *key)] = (computed, index, update.clone())


def recording(**settings):
    scheduler = _Recording(**{**FastVARScheduler.presets["infinity"], **settings})
    scheduler.log = {}
    return scheduler


def run(pipe, size, acceleration=None, prompt=PROMPT, generator=None, **kwargs):
    return pipe(
        prompt,
        height=size[0],
        width=size[1],
        generator=generator if generator is not None else gen(0),
        acceleration=acceleration,
        output_type="latent",
        **kwargs,
    ).images


# ---------------------------------------------------------------------------------------------------------------------
# PTS and CTR on hand-built tensors
# ---------------------------------------------------------------------------------------------------------------------
def test_pts_keeps_the_tokens_farthest_from_the_mean():
    g = torch.Generator().manual_seed(0)
    x = 0.01 * torch.randn(2, 10, 8, generator=g)
    outliers = {0: [2, 7, 9], 1: [0, 4, 5]}  # rows choose independently
    for row, positions in outliers.items():
        for j, p in enumerate(positions):
            x[row, p] += (3.0 + j) * torch.linspace(-1, 1, 8)
    assert num_kept_tokens(10, 0.7) == 3
    kept = pivotal_tokens(x, 0.7)
    assert kept.tolist() == [outliers[0], outliers[1]]  # position order
    expected = ((x - x.mean(dim=1, keepdim=True)) ** 2).sum(-1)
    torch.testing.assert_close(pivotal_token_scores(x), expected)


@pytest.mark.parametrize(
    "L, r, K",
    [
        (1024, 0.4, 615),
        (1600, 0.5, 800),
        (2304, 0.5, 1152),
        (4096, 0.75, 1024),
        (100, 0.29, 72),
        (10, 0.0, 10),
        (1, 0.5, 1),
        (7, 0.99, 1),
    ],
)
def test_kept_count(L, r, K):
    assert num_kept_tokens(L, r) == K == L - int(L * r)
    assert pivotal_tokens(torch.randn(3, L, 4), r).shape == (3, K)


def restore_from_cache(cache, cached_hw, hw, index, computed):
    """CTR as the executor does it: the cached update area-interpolated to ``hw``, the kept tokens overwritten."""
    return scatter_tokens(interpolate_tokens(cache, cached_hw, hw, "area"), index, computed)


def test_restoration_is_the_area_interpolated_cache_with_kept_rows_overwritten():
    cache = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)  # (R, 2x2, C)
    index = torch.tensor([[0, 5, 15], [3, 6, 9]])
    computed = -torch.ones(2, 3, 3)
    out = restore_from_cache(cache, (2, 2), (4, 4), index, computed)
    # up-sizing 2x2 -> 4x4 by area: every cached token covers a 2x2 block
    canvas = cache.reshape(2, 2, 1, 2, 1, 3).expand(2, 2, 2, 2, 2, 3).reshape(2, 16, 3).clone()
    for r in range(2):
        canvas[r, index[r]] = -1
    assert torch.equal(out, canvas)
    # down-sizing 4x4 -> 2x2 by area: block means; a non-integer ratio is adaptive average pooling
    big = torch.randn(2, 16, 3)
    out = restore_from_cache(big, (4, 4), (2, 2), torch.tensor([[1], [2]]), torch.zeros(2, 1, 3))
    means = big.reshape(2, 2, 2, 2, 2, 3).mean(dim=(2, 4)).reshape(2, 4, 3)
    means[0, 1] = means[1, 2] = 0
    torch.testing.assert_close(out, means)
    odd = restore_from_cache(big, (4, 4), (3, 5), torch.tensor([[0], [0]]), big[:, :1])
    pooled = (
        F.adaptive_avg_pool2d(big.reshape(2, 4, 4, 3).permute(0, 3, 1, 2), (3, 5))
        .permute(0, 2, 3, 1)
        .reshape(2, 15, 3)
    )
    torch.testing.assert_close(odd[:, 1:], pooled[:, 1:])


# ---------------------------------------------------------------------------------------------------------------------
# on the pipeline
# ---------------------------------------------------------------------------------------------------------------------
def test_ratio_zero_without_skipping_is_bit_identical_to_the_baseline(pipe):
    scheduler = recording(prune_ratios=(0.0, 0.0), skip_last_scales=False, pruned_layers=None)
    routed = run(pipe, WIDE, scheduler)
    assert torch.equal(routed, run(pipe, WIDE))
    scales = scheduler.resolve(schedule_for_size(*WIDE)[0])
    restored = scheduler.log["restore"]
    for k in scales.prune_ratios:  # the restore path ran for every layer and sublayer, with every token kept
        for layer in range(DEPTH):
            for kind in ("self_attn", "cross_attn", "ffn"):
                computed, index, out = restored[(k, layer, kind)]
                assert index.shape[1] == out.shape[1] and torch.equal(out, computed)


def _loop_logits(pipe, scheduler, size):
    """Every scale's guided logits of one loop run (two images, CFG 3, full sampling) on ``size``."""
    from diffusers_var_accel import run_next_scale_loop
    from diffusers_var_accel.models.infinity_resolutions import rope_grid_hw
    from diffusers_var_accel.pipelines.infinity import InfinityScaleFamily

    transformer, vae = pipe.transformer, pipe.vae
    schedule, template = schedule_for_size(*size)
    g = gen(3)
    text = torch.randn(2, 6, transformer.config.text_channels, generator=g)
    mask = torch.ones(2, 6, dtype=torch.bool)
    text, mask = torch.cat((text, transformer.null_text_embeds(mask))), torch.cat((mask, mask))
    family = InfinityScaleFamily(transformer, vae, schedule, rope_grid_hw(template), top_k=0, top_p=None)
    with torch.no_grad():
        condition = transformer.encode_condition(text, mask)
        state = run_next_scale_loop(
            family, condition, schedule, 2, [3.0] * len(schedule), [1.0] * len(schedule), gen(0), scheduler
        )
    return [state.logits[k] for k in range(len(schedule))]


@pytest.mark.parametrize("recorded", [False, True])
def test_ratio_zero_gives_the_baselines_logits_at_every_scale(pipe, recorded):
    """Below the latents too: at r = 0 (every token kept, the cache scale's updates recorded, every restore path run)
    each scale's logits are the baseline's bit for bit, because a recorded or routed sublayer adds its gated update
    with the dense path's one ``addcmul`` (two roundings, ``x + value * gate``, changed 82-88 % of the logits from
    the cache scale on by up to 1.3e-6). ``recorded``: every routed sublayer's full update is recorded as well."""
    settings = dict(prune_ratios=(0.0, 0.0), skip_last_scales=False, pruned_layers=None)
    scheduler = (
        recording(**settings) if recorded else FastVARScheduler(**{**FastVARScheduler.presets["infinity"], **settings})
    )
    baseline = _loop_logits(pipe, None, WIDE)
    routed = _loop_logits(pipe, scheduler, WIDE)
    assert len(routed) == len(baseline) and all(torch.equal(a, b) for a, b in zip(routed, baseline))


def test_pruned_scales_restore_the_cache_scale_update(pipe):
    scheduler = recording()
    schedule = schedule_for_size(*WIDE)[0]
    scales = scheduler.resolve(schedule)
    run(pipe, WIDE, scheduler)
    log = scheduler.log
    c = scales.cache_scale
    for k, ratio in scales.prune_ratios.items():
        h, w = schedule[k][-2:]
        for layer in range(3, DEPTH):
            for kind in ("self_attn", "cross_attn", "ffn"):
                computed, index, out = log["restore"][(k, layer, kind)]
                assert index.shape == (2, num_kept_tokens(h * w, ratio))  # CFG: cond and uncond rows
                cached = log["restore"][(c, layer, kind)][2]
                canvas = F.interpolate(
                    cached.reshape(2, *schedule[c][-2:], -1).permute(0, 3, 1, 2), size=(h, w), mode="area"
                )
                expected = (
                    canvas.permute(0, 2, 3, 1)
                    .reshape(2, h * w, -1)
                    .scatter(1, index[..., None].expand_as(computed), computed)
                )
                assert torch.equal(out, expected)
    # layers outside pruned_layers run dense; "block" is never routed; nothing routed at other scales
    selected = [(k, layer, kind) for k, layer, kind, _, index in log["select"] if index is not None]
    assert {k for k, _, _ in selected} == set(scales.prune_ratios)  # the cache scale runs dense and records
    assert {(layer, kind) for k, layer, kind in log["restore"] if k == c} == {
        (l, s) for l in range(3, DEPTH) for s in ("self_attn", "cross_attn", "ffn")
    }
    assert {layer for _, layer, _ in selected} == {3, 4, 5} and {kind for _, _, kind in selected} == {
        "self_attn",
        "cross_attn",
        "ffn",
    }


@pytest.mark.parametrize("size", [WIDE, SMALL, size_of(1.333, "0.25M")])
def test_preset_fits_every_aspect_ratio_and_pixel_budget(pipe, size):
    schedule = schedule_for_size(*size)[0]
    scheduler = FastVARScheduler.from_preset("infinity")
    scales = scheduler.resolve(schedule)
    n = len(schedule)
    assert (
        sorted(scales.prune_ratios) == [n - 4, n - 3]
        and scales.cache_scale == n - 5
        and scales.skipped == {n - 2, n - 1}
    )
    seen = []
    out = pipe(
        PROMPT,
        height=size[0],
        width=size[1],
        generator=gen(0),
        acceleration=scheduler,
        output_type="latent",
        callback_on_step_end=lambda p, si, s, kw: seen.append((si, kw["tokens"] is None)) or {},
        callback_on_step_end_tensor_inputs=["tokens"],
    ).images
    assert out.shape == (1, 8, *schedule[-1][-2:])
    assert seen == [(si, si in scales.skipped) for si in range(n)]


def test_skip_only_and_prune_only_variants(pipe):
    baseline = run(pipe, SQUARE)
    skip_only = FastVARScheduler(prune_scales=(), prune_ratios=())
    schedule = schedule_for_size(*SQUARE)[0]
    plans = skip_only.plan_scales(schedule)
    assert [p.skip for p in plans] == [False] * (len(schedule) - 2) + [True, True]
    assert not torch.equal(run(pipe, SQUARE, skip_only), baseline)
    prune_only = FastVARScheduler.from_preset("infinity", skip_last_scales=False)
    assert not any(p.skip for p in prune_only.plan_scales(schedule))
    assert not torch.equal(run(pipe, SQUARE, prune_only), baseline)


# ---------------------------------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------------------------------
def test_presets():
    infinity = FastVARScheduler.from_preset("infinity")
    # the constructor's defaults are the paper's Infinity setting; the default family is None (fits every family)
    assert {
        **infinity.to_dict(),
        "model_family": None,
    } == FastVARScheduler().to_dict() and FastVARScheduler().model_family is None
    hart = FastVARScheduler.from_preset("hart")
    hart_schedule = [(1, s, s) for s in (1, 2, 3, 4, 5, 7, 9, 12, 16, 21, 27, 36, 48, 64)]
    scales = hart.resolve(hart_schedule)
    assert scales.prune_ratios == {12: 0.5, 13: 0.75} and hart_schedule[scales.cache_scale][1:] == (36, 36)
    assert scales.skipped == frozenset() and hart.config.pruned_layers is None and hart.model_family == "hart"
    assert FastVARScheduler.from_preset("infinity", prune_ratios=(0.3, 0.3)).config.prune_ratios == [0.3, 0.3]
    with pytest.raises(ValueError, match="no setting"):
        FastVARScheduler.from_preset("infinity", ratio=0.3)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(prune_ratios=(0.4,)), "one ratio per pruned scale"),
        (dict(cache_scale=-3), "before every pruned scale"),
        (dict(prune_scales=(9, 10), cache_scale=10), "before every pruned scale"),
        (dict(pruned_layers=(-1, 3)), "layer range"),
        (dict(pruned_layers=(1, 2, 3)), "layer range"),
        (dict(skipped_scales=(-3, -1)), "both pruned and skipped"),
        (dict(prune_scales=(-4, -4)), "twice"),
    ],
)
def test_invalid_settings_raise(settings, message):
    with pytest.raises(ValueError, match=message):
        FastVARScheduler(**settings)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(prune_scales=(-8, -3), cache_scale=-9), "prune scale -8 is outside the schedule"),  # 7 scales
        (dict(cache_scale=-9), "outside the schedule"),
        (dict(skipped_scales=(-2, 7)), "outside the schedule"),
        (dict(prune_scales=(4, -3)), "twice"),  # 4 and -3 are the same scale of 7
        (dict(prune_scales=(3, 5), skipped_scales=(-2,)), "both pruned and skipped"),
        (dict(prune_scales=(3, 4), cache_scale=-3), "not before"),
        (dict(prune_scales=(3, 4), cache_scale=-5, skipped_scales=(2,)), "skipped"),
    ],
)
def test_settings_resolved_against_a_schedule_raise(settings, message):
    schedule = schedule_for_size(*SMALL)[0]
    assert len(schedule) == 7
    with pytest.raises(ValueError, match=message):
        FastVARScheduler(**settings).plan_scales(schedule)


def test_pruned_layers_beyond_the_model_raise(pipe):
    with pytest.raises(ValueError, match="selects no layer"):
        run(pipe, SQUARE, FastVARScheduler(pruned_layers=(DEPTH, 28)))


def test_a_routed_scale_in_a_grouped_pass_raises():
    """FastVAR routes single-scale passes; a composition that groups its cache or pruned scale is refused."""
    from diffusers_var_accel import NextScaleState, ScaleKVCache, ScalePlan

    scheduler = FastVARScheduler.from_preset("infinity", skip_last_scales=False)
    schedule = schedule_for_size(*SQUARE)[0]
    state = NextScaleState(tuple(schedule), 1, 2, ScaleKVCache(DEPTH))
    with pytest.raises(ValueError, match="single-scale"):
        scheduler.route_pass(state, ScalePlan((3, 4)))
    assert scheduler.route_pass(state, ScalePlan((0,))) is None
    assert scheduler.route_pass(state, ScalePlan((5, 6))) is None  # nothing of FastVAR's in this group


def test_ratio_one_restores_every_token_from_the_cache():
    """r = 1 keeps no token: every sublayer update of the pruned layers comes from the area-interpolated cache."""
    from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

    pipe = build_tiny_infinity_pipeline(seed=1, depth=4)
    pipe.set_progress_bar_config(disable=True)
    kwargs = dict(height=256, width=256, generator=torch.Generator().manual_seed(0), output_type="latent", top_k=1)
    full = FastVARScheduler(prune_ratios=(1.0, 1.0), pruned_layers=None, skip_last_scales=False)
    half = FastVARScheduler(prune_ratios=(0.5, 0.5), pruned_layers=None, skip_last_scales=False)
    a = pipe("a red circle", acceleration=full, **kwargs).images
    b = pipe("a red circle", acceleration=half, **kwargs).images
    assert torch.isfinite(a).all() and not torch.equal(a, b)
