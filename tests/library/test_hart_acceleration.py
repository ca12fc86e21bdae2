"""The four acceleration schedulers on HART: the same classes as on Infinity, their "hart" presets, the shared loop.

A tiny random-weight HART with the real 14-scale schedule of HART-0.7B (1 .. 64) runs on the CPU in about a second.
Random weights show no redundancy between scales, so these tests check mechanics (what runs, what is restored, that
disabled acceleration is exact), not image quality; FastVAR's numerical faithfulness on HART is
``test_parity_fastvar_hart.py``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from diffusers_var_accel import (
    HART_CONFIGS,
    ARVARScheduler,
    FastVARScheduler,
    IdentityScheduler,
    LazyVARScheduler,
)
from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline
from registry_lists import methods_with_preset, tiny_preset

PATCH_NUMS = HART_CONFIGS["hart-0.7b"]["patch_nums"]


@pytest.fixture(scope="module")
def pipe():
    p = build_tiny_hart_pipeline(seed=0, depth=4, embed_dim=32, patch_nums=PATCH_NUMS, tokenizer_ch_mult=(1,))
    p.set_progress_bar_config(disable=True)
    return p


def run(pipe, seed=0, record=None, **kwargs):
    kwargs.setdefault("guidance_scale", 4.5)

    def callback(p, si, scale, values):
        if record is not None:
            record[si] = {k: v.clone() for k, v in values.items() if v is not None}
        return {}

    return pipe(
        "a red fox",
        generator=torch.Generator().manual_seed(seed),
        output_type="pt",
        callback_on_step_end=callback,
        callback_on_step_end_tensor_inputs=["tokens", "logits", "latents"],
        **kwargs,
    ).images


@pytest.fixture(scope="module")
def baseline(pipe):
    return run(pipe)


def test_identity_scheduler_is_the_baseline(pipe, baseline):
    assert torch.equal(run(pipe, acceleration=IdentityScheduler()), baseline)


def test_fastvar_with_nothing_pruned_is_the_baseline(pipe, baseline):
    """Routing every token through PTS/CTR (r = 0) computes the dense pass exactly."""
    fastvar = FastVARScheduler.from_preset("hart", prune_ratios=[0.0, 0.0])
    assert torch.equal(run(pipe, acceleration=fastvar), baseline)


def test_last_scale_gives_the_diffusion_head_every_computed_token(pipe):
    """Every method with a HART preset (on the tiny model: see ``registry_lists.tiny_preset``) conditions the diffusion
    head on a finite hidden state for every position of the final map (and every CFG row that ran), pruned or not;
    LazyVAR, whose pruned positions get a zero residual, runs the head on its kept tokens only."""
    from diffusers_var_accel.schedulers.scheduling_lazyvar import num_kept_tokens

    head = pipe.transformer.diffusion_head
    seen = []
    original = head.sample

    def spy(z, *args, **kwargs):
        seen.append(z.clone())
        return original(z, *args, **kwargs)

    final = PATCH_NUMS[-1] ** 2
    head.sample = spy
    try:
        for method in methods_with_preset("hart"):
            seen.clear()
            scheduler = tiny_preset(method, "hart")
            run(pipe, acceleration=scheduler)
            assert len(seen) == 1, method
            tokens = num_kept_tokens(scheduler.config.keep_ratios[-1], final) if method == "lazyvar" else final
            assert tokens < final or method != "lazyvar"
            rows = seen[0].shape[0] // tokens
            assert seen[0].shape[0] == rows * tokens and rows in (1, 2), (method, seen[0].shape)
            assert torch.isfinite(seen[0]).all(), method
    finally:
        del head.sample


def test_fastvar_prunes_the_hart_preset_scales(pipe):
    """The "hart" preset computes K = L - int(L r) tokens per row at the 48x48 and 64x64 scales, in every block."""
    kept = {}

    class Recording(FastVARScheduler):
        def route_pass(self, state, plan):
            routes = super().route_pass(state, plan)
            for key, route in routes.routes.items() if routes is not None else ():

                def spy(x, select=route.selector, key=(plan.scale_indices[0], *key)):
                    index = select(x)
                    kept[key] = index.shape
                    return index

                routes.routes[key] = replace(route, selector=spy)
            return routes

    run(
        pipe,
        acceleration=Recording(
            **{k: v for k, v in FastVARScheduler.from_preset("hart").to_dict().items() if k != "_class_name"}
        ),
    )
    n = len(PATCH_NUMS)
    depth = len(pipe.transformer.blocks)
    for si, ratio in ((n - 2, 0.5), (n - 1, 0.75)):
        L = PATCH_NUMS[si] ** 2
        for layer in range(depth):
            for sublayer in ("self_attn", "ffn"):
                assert kept[(si, layer, sublayer)] == (2, L - int(L * ratio)), (si, layer, sublayer)


def test_lazyvar_groups_the_last_two_scales_into_one_pass(pipe):
    plans = LazyVARScheduler.from_preset("hart").plan_scales([(1, p, p) for p in PATCH_NUMS])
    n = len(PATCH_NUMS)
    assert [p.scale_indices for p in plans] == [(k,) for k in range(n - 2)] + [(n - 2, n - 1)]


def test_arvar_halves_the_branch_and_needs_guidance(pipe):
    record = {}
    run(pipe, record=record, acceleration=ARVARScheduler.from_preset("hart"))
    n = len(PATCH_NUMS)
    assert record[n - 2]["logits"].shape[0] == 1  # branch halving: only the conditional row ran at 48x48
    assert record[n - 1]["logits"].shape[0] == 2
    with pytest.raises(ValueError, match="guidance"):
        run(pipe, guidance_scale=0.0, acceleration=ARVARScheduler.from_preset("hart"))


def test_a_scheduler_for_no_family_in_particular_runs_on_both(pipe):
    """(Schedulers configured for the other family are refused: test_method_conformance.py.)"""
    infinity = build_tiny_infinity_pipeline(seed=0, depth=4)
    infinity.set_progress_bar_config(disable=True)
    neutral = FastVARScheduler(
        prune_scales=(-2,),
        prune_ratios=(0.5,),
        pruned_layers=None,
        cache_scale=-3,
        skip_last_scales=False,
        skipped_scales=(),
        model_family=None,
    )
    assert torch.isfinite(run(pipe, acceleration=neutral)).all()
    out = infinity(
        "a red fox",
        height=256,
        width=256,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
        acceleration=neutral,
    ).images
    assert torch.isfinite(out).all()
