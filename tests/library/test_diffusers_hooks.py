"""diffusers' step caches on the VAR transformers: refused when they are enabled, never at generation.

``transformer.enable_cache(config)`` raises for every cache config diffusers' ``CacheMixin`` takes, naming the config
and pointing at ``enable_acceleration``; ``apply_first_block_cache``, ``apply_mag_cache`` and ``apply_layer_skip``
raise at apply time (diffusers' own check: the VAR blocks are not in its block registry) and leave no hook behind.
(``apply_pyramid_attention_broadcast``, ``apply_faster_cache`` and ``apply_taylorseer_cache`` called directly are not
refused: see docs/compatibility.md.)
"""

from __future__ import annotations

import pytest
import torch
from diffusers import (
    FasterCacheConfig,
    FirstBlockCacheConfig,
    LayerSkipConfig,
    MagCacheConfig,
    PyramidAttentionBroadcastConfig,
    TaylorSeerCacheConfig,
)
from diffusers.hooks import apply_first_block_cache, apply_layer_skip, apply_mag_cache

CONFIGS = {
    "FirstBlockCacheConfig": lambda: FirstBlockCacheConfig(),
    "MagCacheConfig": lambda: MagCacheConfig(mag_ratios=torch.ones(10), num_inference_steps=10),
    "TaylorSeerCacheConfig": lambda: TaylorSeerCacheConfig(),
    "PyramidAttentionBroadcastConfig": lambda: PyramidAttentionBroadcastConfig(current_timestep_callback=lambda: 1),
    "FasterCacheConfig": lambda: FasterCacheConfig(
        current_timestep_callback=lambda: 1, attention_weight_callback=lambda _: 0.3
    ),
}


def hooked(transformer):
    """The modules that carry a diffusers hook (an empty registry left by a refused apply holds none)."""
    return [n for n, m in transformer.named_modules() if getattr(getattr(m, "_diffusers_hook", None), "hooks", None)]


@pytest.mark.parametrize("family", ["infinity", "hart"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_enable_cache_is_refused_naming_the_config_and_the_way_out(family, config, pipes):
    transformer = pipes(family).transformer
    with pytest.raises(ValueError, match=rf"{config} caches across the denoising steps.*enable_acceleration"):
        transformer.enable_cache(CONFIGS[config]())
    assert not transformer.is_cache_enabled and not hooked(transformer)


@pytest.mark.parametrize("family", ["infinity", "hart"])
@pytest.mark.parametrize(
    "apply, config",
    [
        (apply_first_block_cache, lambda: FirstBlockCacheConfig()),
        (apply_mag_cache, CONFIGS["MagCacheConfig"]),
        (apply_layer_skip, lambda: LayerSkipConfig(indices=[0])),
    ],
)
def test_block_caches_raise_at_apply_time_and_leave_no_hook(family, apply, config, pipes):
    transformer = pipes(family).transformer
    with pytest.raises(ValueError, match="not registered"):
        apply(transformer, config())
    assert not hooked(transformer)


def test_from_pipe_shares_the_models_and_the_acceleration(pipes):
    """``Pipeline.from_pipe(pipe)`` (diffusers' way to reuse loaded components) keeps the attached scheduler and gives
    the same latents."""
    from diffusers_var_accel import InfinityPipeline

    pipe = pipes("infinity")
    call = {"height": 144, "width": 432, "output_type": "latent"}
    try:
        pipe.enable_lazyvar()
        other = InfinityPipeline.from_pipe(pipe)
        assert other.transformer is pipe.transformer and other.acceleration is pipe.acceleration
        first = pipe("a fox", generator=torch.Generator().manual_seed(0), **call).images
        assert torch.equal(other("a fox", generator=torch.Generator().manual_seed(0), **call).images, first)
    finally:
        pipe.disable_acceleration()
