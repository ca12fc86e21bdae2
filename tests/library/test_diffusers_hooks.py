"""diffusers' step caches on the VAR transformers: refused when they are enabled, never at generation.

``transformer.enable_cache(config)`` raises for every cache config diffusers' ``CacheMixin`` takes, naming the config
and pointing at ``enable_acceleration``; ``apply_first_block_cache``, ``apply_mag_cache`` and ``apply_layer_skip``
raise at apply time (diffusers' own check: the VAR blocks are not in its block registry) and leave no hook behind;
``apply_pyramid_attention_broadcast``, ``apply_faster_cache`` and ``apply_taylorseer_cache`` raise at apply time too
(the transformer refuses to be walked by them, its modules' hook registries refuse their hooks), naming the function
and pointing at ``enable_acceleration``, and leave no hook behind.
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
from diffusers.hooks import (
    apply_faster_cache,
    apply_first_block_cache,
    apply_layer_skip,
    apply_mag_cache,
    apply_pyramid_attention_broadcast,
    apply_taylorseer_cache,
)

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
    "apply, config, message",
    [
        # the head block's hook is refused by the transformer's hook registry before diffusers' block registry is read
        (apply_first_block_cache, lambda: FirstBlockCacheConfig(), r"^apply_first_block_cache \(FBCHeadBlockHook\)"),
        (apply_mag_cache, CONFIGS["MagCacheConfig"], r"^apply_mag_cache \(MagCacheHeadHook\)"),
        (apply_layer_skip, lambda: LayerSkipConfig(indices=[0]), "not registered"),
    ],
)
def test_block_caches_raise_at_apply_time_and_leave_no_hook(family, apply, config, message, pipes):
    transformer = pipes(family).transformer
    with pytest.raises(ValueError, match=message):
        apply(transformer, config())
    assert not hooked(transformer)


STEP_CACHE_APPLIES = {
    "apply_pyramid_attention_broadcast": (
        apply_pyramid_attention_broadcast,
        CONFIGS["PyramidAttentionBroadcastConfig"],
    ),
    "apply_faster_cache": (apply_faster_cache, CONFIGS["FasterCacheConfig"]),
    # TaylorSeer's default patterns match no Infinity module (nothing would be hooked) and HART's attention
    "apply_taylorseer_cache": (apply_taylorseer_cache, CONFIGS["TaylorSeerCacheConfig"]),
    "apply_taylorseer_cache(lite)": (apply_taylorseer_cache, lambda: TaylorSeerCacheConfig(use_lite_mode=True)),
}


@pytest.mark.parametrize("family", ["infinity", "hart"])
@pytest.mark.parametrize("name", sorted(STEP_CACHE_APPLIES))
def test_step_caches_applied_directly_raise_at_apply_time_and_leave_no_hook(family, name, pipes):
    """Called on the transformer, each raises before hooking anything (no forward is wrapped: a refused hook never
    reaches diffusers' ``register_hook``), also where its patterns match no module (TaylorSeer's defaults on
    Infinity)."""
    transformer = pipes(family).transformer
    apply, config = STEP_CACHE_APPLIES[name]
    function = name.split("(")[0]
    # FasterCache hooks the transformer itself first: its hook registry refuses (and names the hook)
    with pytest.raises(ValueError, match=rf"^{function}( \(\w+Hook\))? caches across the denoising.*enable_accel"):
        apply(transformer, config())
    assert not hooked(transformer)
    assert not [
        n for n, m in transformer.named_modules() if "forward" in vars(m)
    ]  # a hook sets the instance's forward


@pytest.mark.parametrize("family", ["infinity", "hart"])
def test_step_cache_hooks_on_a_submodule_are_refused_by_its_hook_registry(family, pipes):
    """Called on a part of the transformer with patterns that match its modules, the hook registries of the blocks
    and attention modules refuse each step cache's hook, naming the function and the hook."""
    transformer = pipes(family).transformer
    attention = "sa" if family == "infinity" else "attn"
    configs = {
        apply_pyramid_attention_broadcast: lambda: PyramidAttentionBroadcastConfig(
            spatial_attention_block_identifiers=[attention], current_timestep_callback=lambda: 1
        ),
        apply_faster_cache: CONFIGS["FasterCacheConfig"],
        apply_taylorseer_cache: lambda: TaylorSeerCacheConfig(cache_identifiers=[rf"0\.{attention}"]),
    }
    for apply, config in configs.items():
        with pytest.raises(ValueError, match=rf"^{apply.__name__} \(\w+Hook\) caches across.*enable_acceleration"):
            apply(transformer.blocks, config())
        assert not hooked(transformer), apply.__name__


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
