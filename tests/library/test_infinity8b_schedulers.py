"""The five acceleration schedulers on the Infinity-8B code path (spatial patchify), on a tiny random model.

The token maps the schedulers see are the patchified ones (the token schedule); the summed codes live on the VAE
latent, twice the token map per side. Every supported aspect ratio (the 0.06M budget, 7 scales), batch 2 with a
padded text row.
"""

from __future__ import annotations

import pytest
import torch

from diffusers_var_accel import supported_sizes
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline
from registry_lists import METHODS

D = 4  # VAE latent channels; 16 bits per token
SIZES = sorted(hw for hw, (_, budget) in supported_sizes().items() if budget == "0.06M")
#: The overrides of the packaged presets that a 2-block, 7-scale model needs (layer ranges and an absolute scale
#: index are tuned for the real 32/40-layer, 13-scale models); every registered library method is tested, with its
#: entry here if it has one.
OVERRIDES = {
    "fastvar": dict(pruned_layers=None),
    "lazyvar": dict(),
    "depthvar": dict(reference_scale=-3),
    "arvar": dict(),
    "stagevar": dict(num_chunks=2, rank_ratios=((0.13648282097649195, 0.2502819846292948),)),  # 8 chunks of 32 layers
}


@pytest.fixture(scope="module")
def pipe():
    pipeline = build_tiny_infinity_pipeline(seed=0, codebook_dim=D, spatial_patchify=True, with_text_encoder=False)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def _text(batch=2):
    g = torch.Generator().manual_seed(5)
    embeds = torch.randn(batch, 6, 32, generator=g)
    mask = torch.ones(batch, 6, dtype=torch.bool)
    mask[1:, 4:] = False
    return embeds, mask


def _generate(pipe, size, rows=slice(0, 2), acceleration=None, text=None):
    """Latents, tokens per scale and the token rows block 0's FFN computed (all scales together)."""
    embeds, mask = _text() if text is None else text
    tokens, computed = {}, [0]

    def record(p, si, scale, kwargs):
        tokens[si] = None if kwargs["tokens"] is None else kwargs["tokens"].clone()
        return {}

    hook = pipe.transformer.blocks[0].ffn.fc1.register_forward_hook(
        lambda m, args, out: computed.__setitem__(0, computed[0] + args[0].shape[0] * args[0].shape[1])
    )
    try:
        latents = pipe(
            prompt_embeds=embeds[rows],
            prompt_attention_mask=mask[rows],
            height=size[0],
            width=size[1],
            guidance_scale=3.0,
            top_k=1,
            top_p=None,
            acceleration=acceleration,
            output_type="latent",
            generator=[torch.Generator().manual_seed(10 + b) for b in range(2)][rows],
            callback_on_step_end=record,
            callback_on_step_end_tensor_inputs=["tokens"],
        ).images
    finally:
        hook.remove()
    return latents, tokens, computed[0]


def _scheduler(pipe, method):
    scheduler = getattr(pipe, f"enable_{method}")(**OVERRIDES.get(method, {}))
    pipe.disable_acceleration()  # used per call below, so the module-scoped pipeline stays unaccelerated
    return scheduler


@pytest.mark.parametrize("size", SIZES, ids=[f"{h}x{w}" for h, w in SIZES])
def test_every_scheduler_runs_on_the_patchify_path(pipe, size):
    schedule, _ = pipe.scale_schedule_for(*size)
    _, h, w = schedule[-1]
    base_latents, base_tokens, base_computed = _generate(pipe, size)
    assert base_latents.shape == (2, D, 2 * h, 2 * w)  # summed codes on the VAE latent (un-patchified)
    assert pipe.pixels_per_token * w == size[1] and pipe.pixels_per_token * h == size[0]
    for si, (_, hs, ws) in enumerate(schedule):
        assert base_tokens[si].shape == (2, hs * ws, 4 * D)  # token layout of the patchified maps
    for method in METHODS:
        latents, tokens, computed = _generate(pipe, size, acceleration=_scheduler(pipe, method))
        assert latents.shape == base_latents.shape and torch.isfinite(latents).all(), method
        assert computed < base_computed, (method, computed, base_computed)  # it pruned tokens of the token maps
        for si, t in tokens.items():
            if t is not None:
                assert t.shape == base_tokens[si].shape, (method, si)
        # the scales before any acceleration are the baseline's, bit for bit
        assert torch.equal(tokens[0], base_tokens[0]) and torch.equal(tokens[1], base_tokens[1]), method


@pytest.mark.parametrize("method", [None, *METHODS])
def test_batch_rows_equal_single_runs(pipe, method):
    """With one generator per image, each image of a batch of 2 is its single run (same bits at every scale). DepthVAR
    ranks every token by a continuous score, which batched rounding can reorder at a near-tie (``batch_equals_single_runs``
    is False): its scales before the first one it acts on are compared; its rows are checked by the next test."""
    size = (256, 320)  # an aspect ratio other than 1:1
    scheduler = None if method is None else _scheduler(pipe, method)
    exact = scheduler is None or scheduler.batch_equals_single_runs
    compared = None if exact else min(scheduler.acted_scales(pipe.scale_schedule_for(*size)[0]))
    batch_latents, batch_tokens, _ = _generate(pipe, size, acceleration=scheduler)
    for b in range(2):
        latents, tokens, _ = _generate(pipe, size, rows=slice(b, b + 1), acceleration=scheduler)
        for si, t in tokens.items():
            if t is not None and (exact or si < compared):
                assert torch.equal(batch_tokens[si][b : b + 1], t), (method, b, si)
        if exact:
            torch.testing.assert_close(batch_latents[b : b + 1], latents, atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", [None, *METHODS])
def test_batch_rows_are_independent(pipe, method):
    """Bit for bit on any CPU: the first image of the batch (latents and tokens of every scale) does not change when
    the second image's text does (same padding, so the shapes and every kernel stay the same)."""
    size = (256, 320)
    scheduler = None if method is None else _scheduler(pipe, method)
    embeds, mask = _text()
    other = embeds.clone()
    other[1] = torch.randn(other[1].shape, generator=torch.Generator().manual_seed(6))
    latents_a, tokens_a, _ = _generate(pipe, size, acceleration=scheduler, text=(embeds, mask))
    latents_b, tokens_b, _ = _generate(pipe, size, acceleration=scheduler, text=(other, mask))
    for si, t in tokens_a.items():
        if t is not None:
            assert torch.equal(t[:1], tokens_b[si][:1]), (method, si)
    assert torch.equal(latents_a[:1], latents_b[:1])
    assert not torch.equal(latents_a[1:], latents_b[1:])  # the second text does reach the second image


def test_zero_pruning_reproduces_the_baseline(pipe):
    """FastVAR pruning nothing and skipping nothing on the patchify path is the baseline bit for bit."""
    from diffusers_var_accel import FastVARScheduler

    size = (320, 256)
    scheduler = FastVARScheduler(
        prune_scales=[-3, -2],
        prune_ratios=[0.0, 0.0],
        pruned_layers=None,
        cache_scale=-4,
        skip_last_scales=False,
        model_family="infinity",
    )
    base, base_tokens, _ = _generate(pipe, size)
    ours, tokens, _ = _generate(pipe, size, acceleration=scheduler)
    assert torch.equal(base, ours)
    assert all(torch.equal(base_tokens[si], tokens[si]) for si in base_tokens)


def test_pipeline_rejects_components_whose_bits_do_not_fit(pipe):
    from diffusers_var_accel import InfinityPipeline

    with pytest.raises(ValueError, match="apply_spatial_patchify=True"):
        pipe.transformer.register_to_config(apply_spatial_patchify=False)
        try:
            InfinityPipeline(transformer=pipe.transformer, vae=pipe.vae, text_encoder=None, tokenizer=None)
        finally:
            pipe.transformer.register_to_config(apply_spatial_patchify=True)
    assert pipe.transformer.token_patch_size == 2
