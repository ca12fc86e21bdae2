"""The memory meter with the int8 KV cache (``var-accel memory --kv int8``): the cache is counted as it is allocated,
on meta tensors as on real ones, and equals the plan-sized count of ``pipe.kv_cache_bytes``."""

import pytest
from conftest import tiny_hart_patch_nums

from diffusers_var_accel.lab.bench.flop_meter import build_on_meta
from diffusers_var_accel.lab.bench.hart_flops import hart_generation
from diffusers_var_accel.lab.bench.memory import MemorySettings, track_generation
from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline


def _on_meta(module):
    return build_on_meta(type(module), **{k: v for k, v in module.config.items() if not k.startswith("_")})


def test_int8_kv_cache_is_counted_on_meta_as_on_real_tensors():
    pipe = build_tiny_hart_pipeline(depth=2, embed_dim=32, patch_nums=tiny_hart_patch_nums(), tokenizer_ch_mult=(1,))
    lazy = pipe.enable_lazyvar()

    def run(transformer, vae, kv_cache_dtype):
        return hart_generation(transformer, vae, batch_size=2, scheduler=lazy, kv_cache_dtype=kv_cache_dtype)

    track_generation(run(pipe.transformer, pipe.vae, None))  # a first call caches an 8-byte constant for the process
    on_cpu = track_generation(run(pipe.transformer, pipe.vae, "int8"))
    meta_transformer, meta_vae = _on_meta(pipe.transformer), _on_meta(pipe.vae)
    on_meta = track_generation(run(meta_transformer, meta_vae, "int8"))
    assert {p: r["bytes"] for p, r in on_meta.phase_peaks.items()} == {
        p: r["bytes"] for p, r in on_cpu.phase_peaks.items()
    }
    expected = pipe.kv_cache_bytes(lazy, batch_size=2, kv_cache_dtype="int8")
    assert on_meta.kv_cache_bytes == expected == on_cpu.kv_cache_bytes > 0
    # float32 weights: int8 keys and values are a quarter of the float cache, plus their scales and slot index
    full = pipe.kv_cache_bytes(lazy, batch_size=2, kv_cache_dtype=None)
    assert full / 4 < expected < full / 2
    # every byte of the cache (int8 buffers, scales, slot index) is tagged as the KV cache, none as activations
    loop = on_meta.phase_peaks["next_scale_loop"]["by_tag"]
    assert 0 < loop["kv_cache"] <= expected


def test_kv_setting_is_checked_and_labelled():
    with pytest.raises(ValueError, match="kv 'int4' is not one of none, int8"):
        MemorySettings("hart-0.7b", kv="int4").check()
    settings = MemorySettings("hart-0.7b", accel="lazyvar", kv="int8")
    settings.check()
    assert settings.label() == "lazyvar, bfloat16, int8 KV" and settings.kv_cache_dtype == "int8"
    assert MemorySettings("hart-0.7b").kv_cache_dtype is None


def test_int8_cache_writes_and_reads_without_a_sync():
    """Every path of :class:`Int8ScaleKVCache.update` (a first write, later ones, CFG halving with the unconditional
    rows, the last pass that keeps nothing) launches kernels only: no host read, nothing uploaded (capture-legal)."""
    import torch

    from diffusers_var_accel.lab.bench.launches import LaunchCounter
    from diffusers_var_accel.next_scale.quantized_cache import Int8ScaleKVCache

    k, v = torch.randn(4, 2, 3, 8), torch.randn(4, 2, 3, 8)
    cache = Int8ScaleKVCache(1, max_length=12, max_writes=4)
    with LaunchCounter() as counter:
        cache.update(k, v, 0)
        cache.update(k, v, 0)
        cache.update(k[2:], v[2:], 0, cache_rows=4, row_start=2)
        cache.stores = False
        keys, values = cache.update(k, v, 0)
    assert keys.shape == (4, 2, 12, 8) and values.dtype == k.dtype
    assert counter.total().syncs == 0, counter.syncs_by_source()
    assert counter.total().kernels > 0
