"""The opt-in int8 KV cache (``pipe.enable_kv_cache_quantization("int8")``).

With it on, every method on both families makes the same plan and keeps as many tokens in every layer as with the
float cache (teacher-forced tokens, so the two calls see the same scales: the acceleration summary and every route
are compared); the cache really is int8 (its buffers' dtypes, its bytes against the plan-sized count of
``pipe.kv_cache_bytes``); the quantiser's round trip is bounded; bad values are refused; turning it off again gives the
float cache's image bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from diffusers_var_accel.next_scale.cache import ScaleKVCache
from diffusers_var_accel.next_scale.quantized_cache import (
    Int8ScaleKVCache,
    quantize_per_channel,
    quantize_per_token,
)
from registry_lists import CASES_WITH_BASELINE_AND_COMPOSITION, SMALLEST_SIZE, tiny_scheduler


def teacher_for(pipe, family):
    """Random tokens for every scale (each call below draws the same ones, whatever the cache returns)."""
    g = torch.Generator().manual_seed(1)
    if family == "infinity":
        bits = int(pipe.transformer.config.codebook_dim)
        schedule = pipe.scale_schedule_for(**SMALLEST_SIZE[family])[0]
        return [torch.randint(0, 2, (1, h * w, bits), generator=g) for _, h, w in schedule]
    vocab = int(pipe.vae.quantize.embedding.weight.shape[0])
    return [torch.randint(0, vocab, (1, p * p), generator=g) for p in pipe.transformer.config.patch_nums]


def run(pipe, family, method, teacher, monkeypatch):
    """One teacher-forced call: its summary, the positions of every route given by the scheduler, the caches made."""
    scheduler = tiny_scheduler(method, family)
    routes, caches = [], []
    if scheduler is not None:
        route_pass = scheduler.route_pass

        def recording(state, plan):
            out = route_pass(state, plan)
            for key, route in sorted((out.routes if out is not None else {}).items()):
                while route is not None:
                    routes.append((key, None if route.index is None else route.index.clone()))
                    route = route.inner
            return out

        monkeypatch.setattr(scheduler, "route_pass", recording)
    for cls in (ScaleKVCache, Int8ScaleKVCache):
        init = cls.__init__

        def recorded(self, *args, _init=init, _cls=cls, **kwargs):
            _init(self, *args, **kwargs)
            if type(self) is _cls:  # once (Int8ScaleKVCache calls ScaleKVCache.__init__)
                caches.append(self)

        monkeypatch.setattr(cls, "__init__", recorded)
    pipe(
        "a red fox",
        generator=torch.Generator().manual_seed(0),
        acceleration=scheduler,
        guidance_scale=3.0,
        teacher_tokens=teacher,
        output_type="latent",
        **SMALLEST_SIZE[family],
    )
    monkeypatch.undo()
    return pipe.acceleration_summary(), routes, caches, scheduler


@pytest.mark.parametrize("method, family", CASES_WITH_BASELINE_AND_COMPOSITION)
def test_int8_cache_keeps_the_plan_and_the_tokens(method, family, pipes, monkeypatch):
    pipe = pipes(family)
    teacher = teacher_for(pipe, family)
    pipe.disable_kv_cache_quantization()
    full, full_routes, (full_cache,), scheduler = run(pipe, family, method, teacher, monkeypatch)
    pipe.enable_kv_cache_quantization("int8")
    try:
        quant, quant_routes, (quant_cache,), _ = run(pipe, family, method, teacher, monkeypatch)
    finally:
        pipe.disable_kv_cache_quantization()

    # the same plan, rows, tokens per layer and positions kept; the same routes with as many tokens per row. Which
    # tokens a data-dependent selection keeps can differ (LazyVAR, DepthVAR and ARVAR score tokens from hidden states
    # that the int8 cache perturbs: docs/memory.md gives the overlap); the structure cannot
    assert {k: v for k, v in quant.items() if k != "kv_bytes"} == {k: v for k, v in full.items() if k != "kv_bytes"}
    assert [key for key, _ in quant_routes] == [key for key, _ in full_routes]
    for (key, index_q), (_, index_f) in zip(quant_routes, full_routes):
        assert (index_q is None) == (index_f is None), key
        if index_q is not None:
            assert index_q.shape == index_f.shape, key

    # the cache is int8 with its scales, and its bytes are what the plan sizes
    assert type(full_cache) is ScaleKVCache and type(quant_cache) is Int8ScaleKVCache
    assert {t.dtype for t in quant_cache._key_buffers + quant_cache._value_buffers} == {torch.int8}
    assert {t.dtype for t in quant_cache._key_scales + quant_cache._value_scales} == {torch.float32}
    size = dict(SMALLEST_SIZE[family], dtype=torch.float32)
    assert full["kv_bytes"] == pipe.kv_cache_bytes(scheduler, **size, kv_cache_dtype=None)
    assert quant["kv_bytes"] == pipe.kv_cache_bytes(scheduler, **size, kv_cache_dtype="int8")
    # counted independently: int8 keys and values (a quarter of float32's), a float32 value scale per row, head and
    # position, a float32 key scale per row, head, channel and pass, an int32 slot per position; every layer
    layers, rows, width = len(pipe.transformer.blocks), 2, int(pipe.transformer.config.embed_dim)
    heads = int(pipe.transformer.config.num_heads)
    positions = full["kv_bytes"] // (2 * layers * rows * width * 4)
    assert full["kv_bytes"] == 2 * layers * rows * width * 4 * positions
    passes = len(full["passes"])
    per_layer = 2 * rows * width * positions + rows * heads * positions * 4 + rows * width * passes * 4 + positions * 4
    assert quant["kv_bytes"] == layers * per_layer
    assert quant["kv_bytes"] < full["kv_bytes"] / 2


def test_int8_cache_off_again_is_the_float_cache_bit_for_bit(pipes):
    pipe = pipes("infinity")
    kwargs = dict(guidance_scale=3.0, output_type="latent", **SMALLEST_SIZE["infinity"])
    before = pipe("a red fox", generator=torch.Generator().manual_seed(0), **kwargs).images
    pipe.enable_kv_cache_quantization()
    assert pipe.kv_cache_dtype == "int8"
    quantised = pipe("a red fox", generator=torch.Generator().manual_seed(0), **kwargs).images
    pipe.disable_kv_cache_quantization()
    assert pipe.kv_cache_dtype is None
    after = pipe("a red fox", generator=torch.Generator().manual_seed(0), **kwargs).images
    assert torch.equal(before, after)
    assert torch.isfinite(quantised).all()


def test_round_trip_error_is_bounded():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 40, 16, generator=g)
    x[..., 5] *= 50  # an outlier channel, as keys have
    x[:, :, 7] *= 20  # an outlier token
    x[0, 0, :, 9] = 0  # an all-zero channel reads back as zeros
    for quantize, reduce_dim in ((quantize_per_channel, 2), (quantize_per_token, 3)):
        q, scale = quantize(x)
        assert q.dtype == torch.int8 and scale.dtype == x.dtype
        assert int(q.abs().max()) <= 127
        amax = x.abs().amax(dim=reduce_dim, keepdim=True)
        error = (q.float() * scale - x).abs()
        # rounding: half a step of amax / 127, plus float rounding of the scale
        assert bool((error <= amax / 127 * 0.5 * (1 + 1e-5) + 1e-12).all())
        assert bool((error <= amax / 100).all())
    # per channel: the outlier channel does not coarsen the other channels (per token it would)
    q, scale = quantize_per_channel(x)
    normal = [c for c in range(16) if c != 5]
    assert float((q.float() * scale - x)[..., normal].abs().max()) < float(x[..., 5].abs().amax()) / 127 / 4


def test_the_cache_reads_back_the_quantised_positions_and_returns_the_pass_exactly():
    g = torch.Generator().manual_seed(0)
    cache = Int8ScaleKVCache(2, max_length=12, max_writes=3)
    first_k, first_v = torch.randn(2, 2, 4, 8, generator=g), torch.randn(2, 2, 4, 8, generator=g)
    keys, values = cache.update(first_k, first_v, 1)
    assert torch.equal(keys, first_k) and torch.equal(values, first_v)  # the pass's own, exactly
    second_k, second_v = 30 * torch.randn(2, 2, 5, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g)
    keys, values = cache.update(second_k, second_v, 1)
    assert keys.shape == (2, 2, 9, 8) and torch.equal(keys[:, :, 4:], second_k)
    # the first write's positions keep their own per-channel scales (a larger later write does not coarsen them)
    q, scale = quantize_per_channel(first_k)
    assert torch.equal(keys[:, :, :4], q * scale)
    q, scale = quantize_per_token(first_v)
    assert torch.equal(values[:, :, :4], q * scale)
    stored_k, _ = cache.get(1)
    assert torch.allclose(stored_k, torch.cat((first_k, second_k), 2), atol=float(second_k.abs().max()) / 127)
    assert cache.get(0) == (None, None) and cache.get_seq_length(1) == 9
    with pytest.raises(ValueError, match="max_length=12"):
        cache.update(torch.zeros(2, 2, 4, 8), torch.zeros(2, 2, 4, 8), 1)
    cache.update(torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 1, 8), 1)
    with pytest.raises(ValueError, match="max_writes=3"):
        cache.update(torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 1, 8), 1)


@pytest.mark.parametrize("bad", ["int4", "fp8", "bfloat16", torch.float16, 8, None])
def test_unknown_forms_are_refused_naming_the_allowed_ones(bad, pipes):
    pipe = pipes("infinity")
    with pytest.raises(ValueError, match="'int8'"):
        pipe.enable_kv_cache_quantization(bad)
    assert pipe.kv_cache_dtype is None
    if bad is not None:
        with pytest.raises(ValueError, match="'int8'"):
            pipe.kv_cache_bytes(kv_cache_dtype=bad)
    with pytest.raises(ValueError, match="max_length"):
        Int8ScaleKVCache(2, max_length=None, max_writes=1)


def test_captured_or_compiled_passes_are_refused_with_the_way_out(pipes):
    pipe = pipes("infinity")
    pipe.enable_kv_cache_quantization("int8")
    pipe._pass_runner = _WorkspaceRunner()
    try:
        with pytest.raises(ValueError, match="disable_cuda_graphs"):
            pipe(
                "a red fox",
                generator=torch.Generator().manual_seed(0),
                output_type="latent",
                **SMALLEST_SIZE["infinity"],
            )
    finally:
        pipe._pass_runner = None
        pipe.disable_kv_cache_quantization()


class _WorkspaceRunner:
    """A pass runner that keeps KV caches per workspace (what PassGraphs and compiled passes do)."""

    def kv_cache(self, key, num_layers, max_length, rows=None):
        raise AssertionError("not reached: the loop refuses before asking")

    def __call__(self, family, hidden, condition, context):
        raise AssertionError("not reached")
