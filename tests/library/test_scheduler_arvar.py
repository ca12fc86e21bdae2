"""ARVARScheduler: saliency (Eq. 1), top-K selection (Eq. 2), structural reconstruction (Eq. 3), branch halving,
configuration, composition and the pipeline shortcut.

Loop-level tests run the official tiny Infinity fixture (2 layers) at 256x256 (7 scales: the preset halves scale 5
(12x12) and prunes scale 6 (16x16) with saliency from scale 3 (6x6) and the canvas from scale 4 (8x8)); pipeline tests
use the tiny random pipeline.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline
from diffusers_var_accel import ARVARScheduler, InfinityBSQVAE, InfinityTransformer, LazyVARScheduler, ScalePlan
from diffusers_var_accel import run_next_scale_loop, schedule_for_size
from diffusers_var_accel.models.infinity_resolutions import rope_grid_hw
from diffusers_var_accel.pipelines.infinity import InfinityScaleFamily
from diffusers_var_accel.schedulers import ComposedScheduler, VARAccelScheduler
from diffusers_var_accel.schedulers.scheduling_arvar import (
    num_kept_tokens,
    retrospect_tokens,
    self_attention_saliency,
)
from diffusers_var_accel.next_scale.executor import scatter_tokens
from diffusers_var_accel.next_scale.executor import interpolate_tokens
from diffusers_var_accel.next_scale.plan import ModelInfo, RecordRequest
from diffusers_var_accel.next_scale.executor import match_rows


def upsample_tokens(x_RlC, source_hw, hw, mode="bilinear"):
    """ARVAR's canvas interpolation as the executor fills it (``EarlierScale(..., in_float32=True)``)."""
    return interpolate_tokens(x_RlC, source_hw, hw, mode, in_float32=True)


def structural_reconstruction(canvas_RlC, source_hw, hw, index_RK, computed_RKC, mode="bilinear"):
    """Eq. (3) as the executor carries it out: the upsampled canvas, the kept positions overwritten."""
    return scatter_tokens(upsample_tokens(canvas_RlC, source_hw, hw, mode), index_RK, computed_RKC)


FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "infinity"
SCHEDULE, TEMPLATE = schedule_for_size(256, 256)
S = len(SCHEDULE)
T, T_M, T_N = S - 1, S - 4, S - 3  # the preset's pruned scale and its attention / activation sources


def _tokens(k):
    return SCHEDULE[k][1] * SCHEDULE[k][2]


# ---------------------------------------------------------------------------------------------------------------------
# Eqs. (1)-(3) on hand-built tensors
# ---------------------------------------------------------------------------------------------------------------------
def test_saliency_of_a_hand_built_map_uses_the_self_keys_averaged_over_heads_and_queries():
    # 1 row, 2 heads, 4 queries of a 2x2 scale; keys = 3 cached + the 4 keys of the scale itself
    probs = torch.zeros(1, 2, 4, 7)
    probs[..., :3] = 0.5  # the cached keys get the most attention: they must not count
    probs[0, 0, :, 3 + 1] = 0.3  # head 0: every query attends to position 1
    probs[0, 1, :2, 3 + 2] = 0.5  # head 1: half of the queries attend to position 2 ...
    probs[0, 1, 2:, 3 + 0] = 0.4  # ... the other half to position 0
    probs[0, :, :, 3 + 3] = 0.02
    saliency = self_attention_saliency(probs, (2, 2))
    expected = torch.tensor([[0.4 * 2 / 8, 0.3 * 4 / 8], [0.5 * 2 / 8, 0.02]]).unsqueeze(0)
    torch.testing.assert_close(saliency, expected)
    assert retrospect_tokens(saliency, (2, 2), 0.5).tolist() == [[1, 2]]  # position 1 (0.15) and 2 (0.125)
    assert retrospect_tokens(saliency, (2, 2), 0.75).tolist() == [[1]]
    assert retrospect_tokens(saliency, (2, 2), 1.0).shape == (1, 0)


def test_saliency_is_interpolated_to_the_pruned_scale():
    saliency = torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 1.0]]])  # two rows choose independently
    kept = retrospect_tokens(saliency, (4, 4), 0.75)  # bilinear: the 2x2 corner around the salient cell
    assert kept.tolist() == [[0, 1, 4, 5], [10, 11, 14, 15]]
    up = F.interpolate(saliency[:, None], size=(4, 4), mode="bilinear", align_corners=False).flatten(1)
    torch.testing.assert_close(upsample_tokens(saliency.flatten(1)[..., None], (2, 2), (4, 4))[..., 0], up)
    # ties go to the earlier position (nearest: every source cell covers 2x2 equal scores)
    assert retrospect_tokens(torch.ones(1, 2, 2), (4, 4), 0.75, "nearest").tolist() == [[0, 1, 2, 3]]


@pytest.mark.parametrize(
    "tokens, ratio, kept", [(4096, 0.75, 1024), (1600, 0.75, 400), (10, 0.25, 8), (7, 1.0, 0), (7, 0.0, 7)]
)
def test_number_of_kept_tokens(tokens, ratio, kept):
    assert num_kept_tokens(tokens, ratio) == kept


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "area"])
def test_reconstruction_overwrites_exactly_the_kept_positions(mode):
    canvas = torch.arange(2 * 4 * 3, dtype=torch.float32).view(2, 4, 3)  # 2 rows of a 2x2 map, 3 channels
    index = torch.tensor([[0, 5, 15], [3, 4, 9]])
    computed = 100 + torch.arange(2 * 3 * 3, dtype=torch.float32).view(2, 3, 3)
    out = structural_reconstruction(canvas, (2, 2), (4, 4), index, computed, mode)
    up = (
        F.interpolate(
            canvas.view(2, 2, 2, 3).permute(0, 3, 1, 2),
            size=(4, 4),
            mode=mode,
            **({"align_corners": False} if mode == "bilinear" else {}),
        )
        .permute(0, 2, 3, 1)
        .reshape(2, 16, 3)
    )
    for r in range(2):
        kept = set(index[r].tolist())
        for p in range(16):
            assert torch.equal(out[r, p], computed[r, index[r].tolist().index(p)] if p in kept else up[r, p]), (r, p)
    # nothing kept: the canvas
    assert torch.equal(structural_reconstruction(canvas, (2, 2), (4, 4), index[:, :0], computed[:, :0], mode), up)


# ---------------------------------------------------------------------------------------------------------------------
# plans and configuration
# ---------------------------------------------------------------------------------------------------------------------
def test_plans_halve_and_record_on_every_schedule():
    for n in (7, 10, 12, 13):
        plans = ARVARScheduler().plan_scales([(1, 1, 1)] * n)
        assert [p.scale_indices for p in plans] == [(k,) for k in range(n)]
        assert [k for k, p in enumerate(plans) if p.cfg_halve] == [n - 2]
        assert [k for k, p in enumerate(plans) if p.record_attention_layers] == [
            n - 4
        ]  # only T - M pays explicit attention
        # with the model, exactly its layers; a caller without it gets every layer a setting could name
        with_model = ARVARScheduler().plan_scales([(1, 1, 1)] * n, ModelInfo(num_layers=6, family="infinity"))
        assert with_model[n - 4].record_attention_layers == frozenset(range(6))
        assert [replace(p, record_attention_layers=frozenset()) for p in with_model] == [
            replace(p, record_attention_layers=frozenset()) for p in plans
        ]
        assert plans[n - 4].record_attention_layers >= frozenset(range(1024))
    ranged = ARVARScheduler(pruned_layers=(1, 30)).plan_scales(
        [(1, 1, 1)] * 13, ModelInfo(num_layers=6, family="hart")
    )
    assert ranged[9].record_attention_layers == {1, 2, 3, 4, 5}  # the range cut at the model's depth
    plans = ARVARScheduler(pruned_layers=(1, 3), attention_distance=2, branch_halving_scales=(-2, -1)).plan_scales(
        [(1, 1, 1)] * 13
    )
    assert plans[10].record_attention_layers == {1, 2} and [k for k, p in enumerate(plans) if p.cfg_halve] == [11, 12]
    nothing = ARVARScheduler(branch_halving_scales=(), prune_ratios=(0.0,)).plan_scales([(1, 1, 1)] * 13)
    assert nothing == [ScalePlan((k,)) for k in range(13)]  # r = 0 prunes nothing and records nothing
    scales = ARVARScheduler(pruned_scales=(-2, -1), prune_ratios=(0.5,)).resolve([(1, 1, 1)] * 13)
    assert scales.prune_ratios == {11: 0.5, 12: 0.5} and scales.attention_sources == {11: 8, 12: 9}
    assert scales.activation_sources == {11: 9, 12: 10}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prune_ratios=(-0.1,)), r"prune_ratios\[0\]"),
        (dict(pruned_scales=(-3, -2, -1), prune_ratios=(0.5, 0.5)), "one per scale"),
        (dict(attention_distance=2.5), "attention_distance"),
        (
            dict(pruned_scales=(2,), attention_distance=3),
            "attention_distance must be an integer >= 1 that reaches no further",
        ),
        (dict(pruned_scales=(4,), activation_distance=5), "activation_distance must be"),
        (dict(pruned_scales=(-1, -1)), "distinct"),
    ],
)
def test_invalid_settings_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ARVARScheduler(**kwargs)


@pytest.mark.parametrize(
    "kwargs, num_scales, message",
    [
        (dict(attention_distance=7), 7, "attention_distance 7 reaches before scale 0 from pruned scale 6"),
        (dict(activation_distance=13), 13, "activation_distance 13 reaches before scale 0"),
        (dict(pruned_scales=(-8,)), 7, "pruned scale -8 is outside"),
        (dict(pruned_scales=(13,)), 13, "outside"),
        (dict(branch_halving_scales=(-8,)), 7, "branch halving scale -8 is outside"),
        (dict(pruned_scales=(-2, -1), activation_distance=1), 13, "source 11 of pruned scale 12 is pruned too"),
        (dict(pruned_scales=(5, -8)), 13, "twice"),
    ],
)
def test_settings_that_do_not_fit_the_schedule_raise(kwargs, num_scales, message):
    with pytest.raises(ValueError, match=message):
        ARVARScheduler(**kwargs).plan_scales([(1, 1, 1)] * num_scales)


def test_presets():
    infinity = ARVARScheduler.from_preset("infinity")
    # the constructor's defaults are the paper's Infinity setting; the default family is None (fits every family)
    assert {
        **infinity.to_dict(),
        "model_family": None,
    } == ARVARScheduler().to_dict() and ARVARScheduler().model_family is None
    assert infinity.config.branch_halving_scales == [-2] and infinity.config.pruned_scales == [-1]
    assert infinity.config.prune_ratios == [0.75] and (
        infinity.config.attention_distance,
        infinity.config.activation_distance,
    ) == (3, 2)
    hart = ARVARScheduler.from_preset("hart")  # HART's 14 steps: BH at step 13, AR at step 14, sources at 11 and 12
    assert hart.model_family == "hart" and hart.resolve([(1, 1, 1)] * 14) == ARVARScheduler().resolve([(1, 1, 1)] * 14)
    assert hart.resolve([(1, 1, 1)] * 14).attention_sources == {13: 10} and hart.resolve([(1, 1, 1)] * 14).halved == {
        12
    }
    assert ARVARScheduler.from_preset("infinity", prune_ratios=(0.5,)).config.prune_ratios == [0.5]
    with pytest.raises(ValueError, match="no setting"):
        ARVARScheduler.from_preset("infinity", ratio=0.5)


# ---------------------------------------------------------------------------------------------------------------------
# the method on the official tiny model
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models():
    transformer = InfinityTransformer.from_original_checkpoint(FIXTURE / "infinity_tiny.pth")
    vae = InfinityBSQVAE.from_original_checkpoint(FIXTURE / "vae_tiny.pth")
    return transformer, vae


def _run(models, scheduler=None, cfg_list=None, teacher=None, batch=2):
    transformer, vae = models
    g = torch.Generator().manual_seed(3)
    text = torch.randn(batch, 6, transformer.config.text_channels, generator=g)
    mask = torch.ones(batch, 6, dtype=torch.bool)
    cfgs = list(cfg_list) if cfg_list is not None else [3.0] * S
    if any(c != 1 for c in cfgs):
        text, mask = torch.cat((text, transformer.null_text_embeds(mask))), torch.cat((mask, mask))
    family = InfinityScaleFamily(transformer, vae, SCHEDULE, rope_grid_hw(TEMPLATE), top_k=0, top_p=None)
    with torch.no_grad():
        return run_next_scale_loop(
            family,
            transformer.encode_condition(text, mask),
            SCHEDULE,
            batch,
            cfgs,
            [1.0] * S,
            torch.Generator().manual_seed(0),
            scheduler,
            teacher,
        )


def _teacher(batch=2, d=8):
    g = torch.Generator().manual_seed(11)
    return [torch.randint(0, 2, (batch, h * w, d), generator=g) for _, h, w in SCHEDULE]


class _Spy(VARAccelScheduler):
    """Runs a scheduler and records its routers' decisions and the attention maps handed to ``after_scale``."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.log, self.maps, self.routes = inner, {}, {}, {}

    def plan_scales(self, scale_schedule, model=None):
        return self.inner.plan_scales(scale_schedule, model)

    def before_scale(self, state, plan):
        self.inner.before_scale(state, plan)

    def acted_scales(self, scale_schedule):
        return self.inner.acted_scales(scale_schedule)

    def route_pass(self, state, plan):
        routes = self.inner.route_pass(state, plan)
        if routes is not None:
            routes.record = routes.record | RecordRequest(block_outputs=routes.routed_layers())
            self.routes[plan.scale_indices[0]] = {layer: route for (layer, _), route in routes.routes.items()}
        return routes

    def after_scale(self, state, plan, hidden):
        k = plan.scale_indices[0]
        self.maps[k] = dict(state.attention_maps)
        for layer, out in state.records.block_outputs.items():
            route = self.routes.get(k, {}).get(layer)
            index = None if route is None else match_rows(route.index, out.shape[0])
            computed = None if index is None else out.gather(1, index[..., None].expand(-1, -1, out.shape[-1]))
            self.log[(k, layer)] = (computed, index, out.clone())
        self.inner.after_scale(state, plan, hidden)


def test_pruned_scale_computes_the_salient_tokens_and_reconstructs_the_rest(models):
    arvar = ARVARScheduler(branch_halving_scales=(), prune_ratios=(0.5,))
    spy = _Spy(arvar)
    state = _run(models, spy, teacher=_teacher())
    L, (h, w) = _tokens(T), SCHEDULE[T][1:]
    assert set(spy.maps[T_M]) == {0, 1} and all(m == {} for k, m in spy.maps.items() if k != T_M)
    for layer in (0, 1):
        probs = spy.maps[T_M][layer]
        # the loop keeps the map reduced to the attention each key receives (mean over heads and queries)
        assert probs.shape == (4, sum(_tokens(k) for k in range(T_M + 1)))
        expected = retrospect_tokens(self_attention_saliency(probs, SCHEDULE[T_M][1:]), (h, w), 0.5)
        kept = arvar.kept_tokens(state)[(T, layer)]
        assert kept.shape == (4, L // 2) and torch.equal(kept, expected)
        assert not torch.equal(kept[:2], kept[2:])  # conditional and unconditional rows choose their own tokens
        computed, index, out = spy.log[(T, layer)]
        assert torch.equal(index, kept)
        # Eq. (3): the block output at T - N, upsampled, overwritten at the kept positions by the fresh outputs
        y_source = spy.log[(T_N, layer)][2]
        canvas = upsample_tokens(y_source, SCHEDULE[T_N][1:], (h, w))
        pruned = torch.ones(4, L, dtype=torch.bool).scatter_(1, kept, False)
        assert torch.equal(out[pruned], canvas[pruned])
        assert not torch.allclose(out[~pruned], canvas[~pruned], atol=1e-3)  # the kept positions were computed
        # T attended to the cache and the kept tokens' keys/values only (T is the last pass: it keeps none)
        assert state.kv_cache.attended_length(layer) == sum(_tokens(k) for k in range(T)) + L // 2
        assert state.kv_cache.get_seq_length(layer) == sum(_tokens(k) for k in range(T))
    # the recording pass (T - N) runs dense and records its block outputs (no route)
    assert spy.log[(T_N, 0)][1] is None and spy.log[(T_N, 0)][2].shape[1] == _tokens(T_N)


def test_sources_run_as_without_pruning(models):
    """Up to T the run equals one that only records the same maps (the canvas recorder routes every token)."""
    arvar = ARVARScheduler(branch_halving_scales=(), prune_ratios=(0.75,))

    class _RecordOnly(VARAccelScheduler):
        def plan_scales(self, scale_schedule, model=None):
            return arvar.plan_scales(scale_schedule, model)

    teacher = _teacher()
    pruned, reference = _run(models, arvar, teacher=teacher), _run(models, _RecordOnly(), teacher=teacher)
    assert all(torch.equal(pruned.logits[k], reference.logits[k]) for k in range(T))
    assert not torch.equal(pruned.logits[T], reference.logits[T])


def test_a_ratio_that_keeps_every_token_matches_the_baseline(models):
    teacher = _teacher()
    baseline = _run(models, teacher=teacher)
    exact = _run(models, ARVARScheduler(branch_halving_scales=(), prune_ratios=(0.0,)), teacher=teacher)
    assert all(torch.equal(exact.logits[k], baseline.logits[k]) for k in range(S))  # r = 0: nothing recorded or routed
    arvar = ARVARScheduler(branch_halving_scales=(), prune_ratios=(1e-9,))  # active, keeps all L tokens
    everything = _run(models, arvar, teacher=teacher)
    assert arvar.kept_tokens(everything)[(T, 0)].shape == (4, _tokens(T))
    for k in range(S):  # only the explicit softmax at T - M differs from SDPA
        torch.testing.assert_close(everything.logits[k], baseline.logits[k], atol=1e-5, rtol=1e-5)


def test_ratio_one_outputs_the_canvas_in_the_pruned_layers_only(models):
    arvar = ARVARScheduler(branch_halving_scales=(), prune_ratios=(1.0,), pruned_layers=(1, 4))
    spy = _Spy(arvar)
    state = _run(models, spy)
    assert (T, 0) not in spy.log and spy.log[(T, 1)][1].shape == (4, 0)
    torch.testing.assert_close(
        spy.log[(T, 1)][2], upsample_tokens(spy.log[(T_N, 1)][2], SCHEDULE[T_N][1:], SCHEDULE[T][1:])
    )
    before = sum(_tokens(k) for k in range(T))
    assert state.kv_cache.attended_length(0) == before + _tokens(T) and state.kv_cache.attended_length(1) == before


def test_branch_halving_copies_the_conditional_branch(models):
    state = _run(models, ARVARScheduler(branch_halving_scales=(-2, -1), pruned_scales=()))
    starts = [sum(_tokens(j) for j in range(k)) for k in range(S + 1)]
    for layer in (0, 1):
        keys, values = state.kv_cache.get(layer)
        assert keys.shape[2] == starts[S - 1]  # the last scale's keys are read by no later pass: not kept
        for k in range(S - 1):
            part = slice(starts[k], starts[k + 1])
            equal = torch.equal(keys[:2, :, part], keys[2:, :, part]) and torch.equal(
                values[:2, :, part], values[2:, :, part]
            )
            assert equal == (k >= S - 2), (layer, k)  # the unconditional rows hold the conditional keys/values
    assert [state.logits[k].shape[0] for k in range(S)] == [4] * (S - 2) + [2, 2]  # only the conditional rows ran
    reference = _run(models, cfg_list=[3.0] * (S - 2) + [1.0, 1.0])  # = guidance 1 at the halved scales
    # the halved pass runs 2 rows, the reference 4: batched fp32 GEMMs round differently (7.6e-6 on MKL's AVX2
    # kernels, 0 on its AVX-512 ones), so equal up to that rounding
    torch.testing.assert_close(state.logits[S - 1], reference.logits[S - 1], atol=3e-5, rtol=0)


@pytest.mark.parametrize("halved, source_rows, pruned_rows", [((T_M, T_N), 2, 4), ((T,), 4, 2)])
def test_sources_and_pruned_scale_with_different_cfg_rows(models, halved, source_rows, pruned_rows):
    arvar = ARVARScheduler(branch_halving_scales=halved, prune_ratios=(0.5,))
    spy = _Spy(arvar)
    kept = arvar.kept_tokens(_run(models, spy))[(T, 0)]
    assert kept.shape[0] == source_rows
    index = spy.log[(T, 0)][1]
    assert index.shape[0] == pruned_rows
    if pruned_rows > source_rows:  # the unconditional rows use the conditional rows' positions and canvas
        assert torch.equal(index[:2], index[2:])
    else:  # a halved pruned scale takes the conditional rows' choice
        assert torch.equal(index, kept[:2])


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


def test_ratio_zero_without_branch_halving_is_the_baseline(pipe):
    arvar = ARVARScheduler(branch_halving_scales=(), prune_ratios=(0.0,))
    assert torch.equal(_latents(pipe, acceleration=arvar), _latents(pipe))


def test_branch_halving_without_cfg_raises(pipe):
    with pytest.raises(
        ValueError, match=r"branch halving at scales \[5\] needs classifier-free guidance.*branch_halving_scales=\(\)"
    ):
        _latents(pipe, acceleration=ARVARScheduler(), guidance_scale=1.0)
    out = _latents(pipe, acceleration=ARVARScheduler(branch_halving_scales=()), guidance_scale=1.0)  # AR alone runs
    assert torch.isfinite(out).all()


def test_composed_with_lazyvar_groups_halves_the_group(pipe):
    rows = {}

    def record(p, k, scale, kwargs):
        rows[k] = kwargs["logits"].shape[0]
        return {}

    prompts = ["a red fox in the snow", "two cats"]
    composed = ComposedScheduler(
        [LazyVARScheduler.from_preset("infinity"), ARVARScheduler(branch_halving_scales=(-1,), pruned_scales=())]
    )
    out = _latents(
        pipe,
        prompts,
        acceleration=composed,
        top_k=1,
        callback_on_step_end=record,
        callback_on_step_end_tensor_inputs=["logits"],
    )
    n = len(rows)
    plans = composed.plan_scales(schedule_for_size(256, 256)[0])
    assert [p.cfg_halve for p in plans] == [False] * (n - 4) + [True]  # the group's one pass holds the last scale
    assert [rows[k] for k in range(n)] == [4] * (n - 4) + [2] * 4  # the group ran the conditional rows only
    reference = _latents(pipe, prompts, acceleration=LazyVARScheduler(), top_k=1, cfg_list=[4.0] * (n - 4) + [1.0] * 4)
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=0)


def test_pruning_inside_a_group_raises(pipe):
    composed = ComposedScheduler([LazyVARScheduler.from_preset("infinity"), ARVARScheduler()])
    with pytest.raises(ValueError, match="must run alone"):
        _latents(pipe, acceleration=composed)


def test_a_halved_pass_takes_its_rows_of_the_calls_constants():
    """A CFG-halved pass runs the conditional rows of the call's condition: the condition says so
    (``constant_source``), a selection of a selection names rows of the first, and a cross-attention given the
    call's text and those rows equals the one given the selected text (the keys/values are row-wise)."""
    from diffusers_var_accel.next_scale.context import VARForwardContext

    torch.manual_seed(0)
    transformer = InfinityTransformer(depth=1, embed_dim=32, num_heads=2, text_channels=16, scale_schedule=None)
    full = transformer.encode_condition(torch.randn(4, 5, 16), torch.tensor([[1] * 5, [1] * 3 + [0] * 2] * 2))
    assert full.constant_source() == (full, None)
    half = full.select_rows(slice(0, 2))
    source, rows = half.constant_source()
    assert source is full and rows == slice(0, 2)
    assert half.select_rows(slice(1, 2)).constant_source()[1] == slice(1, 2, 1)
    ca = transformer.blocks[0].ca
    x = torch.randn(2, 7, 32)
    context = VARForwardContext(kv_cache=None, rope_cos_sin=None, call_cache={})
    given_rows = ca(x, full.text_RTC, full.text_mask_R11T, context, encoder_rows=rows)
    assert ("cross_kv", 0, 4) in context.call_cache  # computed once for the call's rows
    assert torch.equal(
        given_rows, ca(x, half.text_RTC, half.text_mask_R11T, VARForwardContext(kv_cache=None, rope_cos_sin=None))
    )
