"""The model side of static passes: a preallocated KV cache, per-call constants, fused RoPE, grouped passes without
host reads. Everything here must leave the numbers exactly as they were (bit for bit on the CPU in fp32)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import diffusers_var_accel.next_scale.loop as loop_module
from diffusers_var_accel import (
    ScalePlan,
    HART_CONFIGS,
    ScaleKVCache,
    schedule_for_size,
    supported_sizes,
)
from diffusers_var_accel.models.attention_processor import (
    VARAttnProcessor,
    adjacent_pairing_signs,
    adjacent_pairing_tables,
    apply_rope_2d,
    apply_rope_half,
    half_pairing_signs,
    half_pairing_tables,
    rotate_pairs,
)
from diffusers_var_accel.next_scale.context import VARForwardContext, block_causal_mask
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline
from registry_lists import FAMILIES, METHOD_NAMES, METHODS, tiny_preset


def _kv(rows, length, generator, heads=2, dim=4):
    return (
        torch.randn(rows, heads, length, dim, generator=generator),
        torch.randn(rows, heads, length, dim, generator=generator),
    )


# ---------------------------------------------------------------------------------------------------------------------
# preallocated KV cache
# ---------------------------------------------------------------------------------------------------------------------
def test_preallocated_cache_holds_what_the_growing_cache_holds_at_fixed_addresses():
    g = torch.Generator().manual_seed(0)
    grown, fixed = ScaleKVCache(2), ScaleKVCache(2, max_length=10)
    addresses = None
    for length in (1, 4, 5):
        k, v = _kv(3, length, g)
        for layer in range(2):
            k_ref, v_ref = grown.update(k, v, layer)
            k_all, v_all = fixed.update(k, v, layer)
            assert torch.equal(k_all, k_ref) and torch.equal(v_all, v_ref)
        seen = [(fixed.get(layer)[0].data_ptr(), fixed.get(layer)[1].data_ptr()) for layer in range(2)]
        assert addresses is None or seen == addresses  # views of the same buffers, pass after pass
        addresses = seen
    assert fixed.get_seq_length(1) == grown.get_seq_length(1) == 10


def test_preallocated_cache_takes_strided_keys():
    g = torch.Generator().manual_seed(1)
    k_RLHc, v_RLHc = torch.randn(2, 3, 2, 4, generator=g), torch.randn(2, 3, 2, 4, generator=g)
    cache = ScaleKVCache(1, max_length=3)
    k_all, v_all = cache.update(k_RLHc.transpose(1, 2), v_RLHc.transpose(1, 2), 0)
    assert torch.equal(k_all, k_RLHc.transpose(1, 2)) and torch.equal(v_all, v_RLHc.transpose(1, 2))


@pytest.mark.parametrize("max_length", [None, 8])
def test_cfg_halving_writes_the_given_rows_into_every_half(max_length):
    g = torch.Generator().manual_seed(2)
    cache = ScaleKVCache(1, max_length=max_length)
    k0, v0 = _kv(4, 2, g)
    cache.update(k0, v0, 0)
    k1, v1 = _kv(2, 3, g)
    k_all, v_all = cache.update(k1, v1, 0, cache_rows=4)
    assert k_all.shape == (2, 2, 5, 4)  # the rows that ran
    assert torch.equal(k_all[:, :, 2:], k1) and torch.equal(v_all[:, :, :2], v0[:2])
    keys, values = cache.get(0)
    assert torch.equal(keys[2:, :, 2:], k1) and torch.equal(values[2:, :, 2:], v1)
    assert torch.equal(keys[2:, :, :2], k0[2:])
    with pytest.raises(ValueError, match="3 rows"):
        cache.update(*_kv(3, 1, g), 0, cache_rows=4)


def test_preallocated_cache_overflow_and_mismatch_are_clear_errors():
    g = torch.Generator().manual_seed(3)
    cache = ScaleKVCache(1, max_length=4)
    cache.update(*_kv(2, 3, g), 0)
    with pytest.raises(ValueError, match=r"after 3 cached ones needs 5.*max_length=4"):
        cache.update(*_kv(2, 2, g), 0)
    with pytest.raises(ValueError, match="heads"):
        cache.update(*_kv(2, 1, g, heads=3), 0)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_length"):
            ScaleKVCache(1, max_length=bad)


@pytest.mark.parametrize("max_length", [None, 9])
def test_crop_select_and_reset_keep_working(max_length):
    g = torch.Generator().manual_seed(4)
    cache = ScaleKVCache(2, max_length=max_length)
    k, v = _kv(4, 5, g)
    for layer in range(2):
        cache.update(k, v, layer)
    cache.crop(3)
    assert cache.get_seq_length(0) == 3 and torch.equal(cache.get(1)[0], k[:, :, :3])
    cache.batch_select_indices([0, 2])
    assert torch.equal(cache.get(0)[1], v[[0, 2], :, :3])
    k2, v2 = _kv(2, 2, g)
    k_all, _ = cache.update(k2, v2, 0)
    assert torch.equal(k_all, torch.cat((k[[0, 2], :, :3], k2), dim=2))
    cache.reset()
    assert cache.get_seq_length(0) == 0 and cache.get(0) == (None, None)


# ---------------------------------------------------------------------------------------------------------------------
# RoPE of q and k together
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotate_pairs_is_the_reference_rope_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(5)
    R, L, H, c = 3, 7, 2, 16
    qk_RL2Hc = torch.randn(R, L, 2, H, c, generator=g).to(dtype)
    angles = torch.randn(L, c // 2, generator=g) * 10
    infinity_table = torch.stack((angles.cos(), angles.sin()))[:, None, None]  # (2, 1, 1, L, c/2)
    out = rotate_pairs(qk_RL2Hc, adjacent_pairing_tables(infinity_table), halves=False)
    for i in range(2):
        reference = apply_rope_2d(qk_RL2Hc[:, :, i].transpose(1, 2), infinity_table).transpose(1, 2)
        assert torch.equal(out[:, :, i], reference)
    per_row = torch.randn(R, L, c // 2, generator=g) * 10
    emb = torch.cat((per_row, per_row), dim=-1)
    hart_table = torch.stack((emb.cos(), emb.sin())).unsqueeze(2)  # (2, R, 1, L, c)
    out = rotate_pairs(qk_RL2Hc, half_pairing_tables(hart_table, dtype), halves=True)
    for i in range(2):
        reference = apply_rope_half(qk_RL2Hc[:, :, i].transpose(1, 2), hart_table.to(dtype)).transpose(1, 2)
        assert torch.equal(out[:, :, i], reference)


def test_rotate_pairs_with_a_cast_writes_the_cast_rotation_within_its_rounding():
    """The fused form (one addcmul writing bf16) equals rotating in fp32, then casting, within one bf16 step."""
    g = torch.Generator().manual_seed(6)
    R, L, H, c = 2, 9, 3, 16
    qk_RL2Hc = torch.randn(R, L, 2, H, c, generator=g)
    angles = torch.randn(L, c // 2, generator=g) * 10
    table = torch.stack((angles.cos(), angles.sin()))[:, None, None]
    tables = adjacent_pairing_tables(table)
    fused = rotate_pairs(qk_RL2Hc, tables, halves=False, out_dtype=torch.bfloat16)
    reference = rotate_pairs(qk_RL2Hc, tables, halves=False)
    assert fused.dtype == torch.bfloat16 and fused.shape == reference.shape
    # both round the same fp32 value (up to one fp32 rounding of the product) to bf16: at most one bf16 step apart
    step = reference.abs().clamp_min(1e-30).log2().floor().exp2() * 2.0**-7
    assert bool(((fused.float() - reference).abs() <= step).all())
    assert (fused == reference.bfloat16()).float().mean() > 0.99
    # a cast to the rotation's own dtype is no cast: the reference form, bit for bit
    assert torch.equal(rotate_pairs(qk_RL2Hc, tables, halves=False, out_dtype=torch.float32), reference)


def test_modulated_layer_norm_writes_the_linear_input_dtype():
    from diffusers_var_accel.models.transformer_infinity import modulated_layer_norm

    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 11, 32, generator=g)
    scale_plus_1, shift = 1 + torch.randn(2, 1, 32, generator=g), torch.randn(2, 1, 32, generator=g)
    reference = F.layer_norm(x, (32,), eps=1e-6) * scale_plus_1 + shift
    fp32 = modulated_layer_norm(x, scale_plus_1, shift, 1e-6)
    torch.testing.assert_close(fp32, reference, atol=1e-6, rtol=1e-6)
    half = modulated_layer_norm(x, scale_plus_1, shift, 1e-6, out_dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), reference.bfloat16().float(), atol=1e-2, rtol=1e-2)


def test_a_gated_update_is_added_as_x_plus_value_times_gate():
    from diffusers_var_accel.next_scale.executor import GatedUpdate, run_sublayer

    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 5, 8, generator=g)
    value, gate = torch.randn(2, 5, 8, generator=g).bfloat16(), torch.randn(2, 1, 8, generator=g).bfloat16()
    context = VARForwardContext(kv_cache=None, rope_cos_sin=torch.zeros(2, 1, 1, 5, 2))
    out = run_sublayer(0, "ffn", x, lambda x_sub, ctx: GatedUpdate(value, gate), context)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, x + value.float() * gate.float(), atol=1e-6, rtol=1e-6)
    # materialised (routes, records) it is the product in the update's own dtype, as an ungated update would be
    assert torch.equal(GatedUpdate(value, gate).resolve(), value * gate)


def test_adjacent_pairing_tables_are_cos_cos_and_minus_sin_sin():
    g = torch.Generator().manual_seed(6)
    for rows in (1, 3):
        table = torch.randn(2, rows, 1, 5, 4, generator=g)
        table[..., 0] = 0.0  # signed zeros: -(+0) is -0 in the reference too
        table[1, ..., 1] = -0.0
        cos, sin = table[0, :, 0], table[1, :, 0]
        reference = torch.stack((torch.stack((cos, cos), dim=-1), torch.stack((-sin, sin), dim=-1))).flatten(-2)
        for signs in (None, adjacent_pairing_signs(table)):  # copy and negate, or one multiply by the call's signs
            tables = adjacent_pairing_tables(table, signs)
            assert tables.shape == (2, rows, 5, 1, 1, 8)
            assert torch.equal(tables[:, :, :, 0, 0], reference)
            assert torch.equal(tables.signbit(), reference[:, :, :, None, None].signbit())
            assert torch.equal(table[1, :, 0], sin)  # the input is not written


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_half_pairing_tables_with_signs_are_the_stacked_tables(dtype):
    g = torch.Generator().manual_seed(7)
    table = torch.randn(2, 3, 1, 5, 8, generator=g)
    table[1, ..., 0] = 0.0
    table[1, ..., 5] = -0.0
    reference = half_pairing_tables(table, dtype)
    with_signs = half_pairing_tables(table, dtype, half_pairing_signs(table))
    assert with_signs.dtype == reference.dtype and with_signs.shape == reference.shape
    assert torch.equal(with_signs, reference) and torch.equal(with_signs.signbit(), reference.signbit())


def test_infinity_schedule_rope_is_per_scale_tables_and_shared_through_the_pipelines_tables():
    from diffusers_var_accel.next_scale import ScheduleTables
    from diffusers_var_accel.pipelines.infinity.pipeline_infinity import InfinityScaleFamily

    pipe = build_tiny_infinity_pipeline(seed=0, depth=1, with_text_encoder=False)
    transformer, vae = pipe.transformer, pipe.vae
    schedule, grid = pipe.scale_schedule_for(256, 256)
    tables = ScheduleTables(max_entries=3)
    family = InfinityScaleFamily(transformer, vae, schedule, grid, top_k=0, top_p=None, tables=tables)
    for si, s in enumerate(schedule):
        per_scale = transformer.rope_cos_sin(transformer.rope_positions(s[-2], s[-1], grid))
        assert torch.equal(family.rope_cos_sin((si,)), per_scale)
    again = InfinityScaleFamily(
        transformer, vae, [tuple(s) for s in schedule], grid, top_k=0, top_p=None, tables=tables
    )
    assert again._rope is family._rope  # the same schedule, grid, head size and device: built once
    # without the owner's tables nothing outlives the family (a fresh table per call)
    assert InfinityScaleFamily(transformer, vae, schedule, grid, top_k=0, top_p=None)._rope is not family._rope
    other, other_grid = pipe.scale_schedule_for(512, 512)
    assert (
        InfinityScaleFamily(transformer, vae, other, other_grid, top_k=0, top_p=None, tables=tables)._rope
        is not family._rope
    )
    for size in (768, 1024, (256, 320), (320, 256), (192, 336)):  # the owner keeps a few recent tables only
        InfinityScaleFamily(
            transformer,
            vae,
            *pipe.scale_schedule_for(*((size, size) if isinstance(size, int) else size)),
            top_k=0,
            top_p=None,
            tables=tables,
        )
    assert len(tables) == 3
    # the pipeline owns one for its calls
    assert pipe.schedule_tables is pipe.schedule_tables and isinstance(pipe.schedule_tables, ScheduleTables)
    with pytest.raises(ValueError, match="max_entries must be a positive integer, got 0"):
        ScheduleTables(max_entries=0)


# ---------------------------------------------------------------------------------------------------------------------
# grouped passes without host reads
# ---------------------------------------------------------------------------------------------------------------------
HOST_READS = {"_local_scalar_dense", "nonzero", "unique_consecutive", "_unique2", "unique_dim", "masked_select"}


class _HostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in HOST_READS:
            self.seen.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_scale_prefix_calls_equal_the_masked_attention_without_host_reads():
    g = torch.Generator().manual_seed(6)
    lengths, cache, R, H, c = (1, 4, 9), 5, 2, 3, 8
    L = sum(lengths)
    scale_ids = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))
    q = torch.randn(R, L, H, c, generator=g)
    k, v = torch.randn(R, cache + L, H, c, generator=g), torch.randn(R, cache + L, H, c, generator=g)
    reference = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=block_causal_mask(cache, scale_ids),
        scale=0.3,
    ).transpose(1, 2)
    with _HostReads() as reads:
        out = VARAttnProcessor()._attend_scale_prefixes(q, k, v, cache, lengths, 0.3)
        with_empty = VARAttnProcessor()._attend_scale_prefixes(q, k, v, cache, (1, 0, 4, 9), 0.3)
    assert reads.seen == []
    torch.testing.assert_close(out, reference, atol=1e-6, rtol=1e-5)
    assert torch.equal(with_empty, out)


def test_grouped_pass_with_unknown_counts_takes_the_mask_not_host_reads(monkeypatch):
    """CUDA's default (SDPA) attends grouped passes scale by scale; where the tokens per scale are not known
    statically (a selection inside a grouped pass) it keeps the device-built mask instead of reading the ids."""
    processor = VARAttnProcessor()
    monkeypatch.setattr(processor, "uses_per_scale_calls", lambda device=None: True)
    masks = []
    monkeypatch.setattr(processor, "attend", lambda q, k, v, mask, scale: masks.append(mask) or q)
    from diffusers_var_accel.models.transformer_infinity import InfinitySelfAttention

    attn = InfinitySelfAttention(8, 2, 0)
    L = 5
    context = VARForwardContext(
        kv_cache=ScaleKVCache(1),
        rope_cos_sin=torch.zeros(2, 1, 1, L, 2),
        token_scale_ids=torch.tensor([0, 1, 1, 1, 1]),
        scale_hws=((1, 1), (2, 2)),
    )
    with torch.no_grad(), _HostReads() as reads:
        processor(attn, torch.randn(1, L, 8), context)  # counts known: per scale
        routed = context.for_tokens(torch.tensor([[0, 2, 3]]))  # counts unknown
        processor(attn, torch.randn(1, 3, 8), routed)
    assert reads.seen == []
    assert masks[:2] == [None, None] and masks[2] is not None and masks[2].shape == (1, 1, 3, 5 + 3)


def test_context_knows_the_tokens_per_scale_from_shapes():
    context = VARForwardContext(kv_cache=None, rope_cos_sin=torch.zeros(2, 1, 1, 13, 2), scale_hws=((2, 2), (3, 3)))
    assert context.token_scale_lengths(13) == (4, 9)
    assert context.token_scale_lengths(12) is None
    routed = context.for_tokens(torch.tensor([[0, 3, 5, 9]]), (2, 2))
    assert routed.token_scale_lengths(4) == (2, 2) and routed.pass_cache == {}
    assert context.for_tokens(torch.tensor([[0, 3]])).token_scale_lengths(2) is None


# ---------------------------------------------------------------------------------------------------------------------
# whole generations: per-call constants and the preallocated cache change nothing
# ---------------------------------------------------------------------------------------------------------------------
HART_PATCH_NUMS = HART_CONFIGS["hart-0.7b"]["patch_nums"][:10]
INFINITY_SIZE = sorted(hw for hw, (_, budget) in supported_sizes().items() if budget == "0.06M")[0]


def _kept_length(pipe, family, scheduler):
    """Input tokens of every pass that runs but the last one (whose keys no later pass reads)."""
    if family == "infinity":
        schedule = schedule_for_size(*INFINITY_SIZE)[0]
        tokens = [h * w for _, h, w in schedule]
    else:
        schedule = [(1, pn, pn) for pn in HART_PATCH_NUMS]
        tokens = [pipe.transformer.config.context_tokens] + [pn * pn for pn in HART_PATCH_NUMS[1:]]
    plans = [ScalePlan((i,)) for i in range(len(schedule))] if scheduler is None else scheduler.plan_scales(schedule)
    read_later = [plan for plan in plans if not plan.skip][:-1]
    return sum(tokens[i] for plan in read_later for i in plan.scale_indices)


def _generate(pipe, family, acceleration):
    kwargs = {"height": INFINITY_SIZE[0], "width": INFINITY_SIZE[1]} if family == "infinity" else {}
    return pipe(
        "a red fox in the snow",
        generator=torch.Generator().manual_seed(0),
        acceleration=acceleration,
        guidance_scale=3.0,
        output_type="pt",
        **kwargs,
    ).images


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", [None, *METHOD_NAMES])
def test_call_constants_and_preallocated_cache_change_nothing(pipes, family, method, monkeypatch):
    """The loop's preallocated KV cache and per-call constants give the images of a growing cache with every
    constant recomputed at each use (the reference path), bit for bit."""
    pipe = pipes(family)
    make = (lambda: None) if method is None else (lambda: tiny_preset(method, family))
    if method is not None and family not in METHODS[method].presets:
        pytest.skip(f"{method} has no {family} preset")
    caches, lengths = [], []

    def recording_context(*args, **kwargs):
        caches.append(kwargs.get("call_cache"))
        return VARForwardContext(*args, **kwargs)

    def recording_cache(num_layers, max_length=None):
        lengths.append(max_length)
        return ScaleKVCache(num_layers, max_length=max_length)

    monkeypatch.setattr(loop_module, "VARForwardContext", recording_context)
    monkeypatch.setattr(loop_module, "ScaleKVCache", recording_cache)
    out = _generate(pipe, family, make())
    assert lengths == [_kept_length(pipe, family, make())]  # the loop preallocated the cache for what is read later
    call_cache = caches[0]
    assert call_cache is not None and all(c is call_cache for c in caches)  # one dict shared by every pass

    monkeypatch.setattr(
        loop_module, "VARForwardContext", lambda *a, **k: VARForwardContext(*a, **{**k, "call_cache": None})
    )
    monkeypatch.setattr(loop_module, "ScaleKVCache", lambda num_layers, max_length=None: ScaleKVCache(num_layers))
    reference = _generate(pipe, family, make())
    assert torch.equal(out, reference)
    kinds = {key[0] for key in call_cache}
    assert "qkv_bias" in kinds  # the constants were taken from the call's cache
    assert ("cross_kv" in kinds and "ada" in kinds) if family == "infinity" else "rms_weight" in kinds


# ---------------------------------------------------------------------------------------------------------------------
# no host reads or uploads in the models' per-call steps
# ---------------------------------------------------------------------------------------------------------------------
class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_encode_condition_takes_the_padding_from_the_caller_without_a_host_read():
    pipe = build_tiny_infinity_pipeline(seed=0, depth=1, with_text_encoder=False)
    g = torch.Generator().manual_seed(7)
    text = torch.randn(2, 5, 32, generator=g)
    full, padded = torch.ones(2, 5, dtype=torch.bool), torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    with torch.no_grad():
        read = pipe.transformer.encode_condition(text, full)
        with _Ops() as ops:
            told = pipe.transformer.encode_condition(text, full, padded=False)
        assert "_local_scalar_dense" not in ops.names
        assert read.text_mask_R11T is None and told.text_mask_R11T is None and torch.equal(read.cond_RC, told.cond_RC)
        masked = pipe.transformer.encode_condition(text, padded, padded=True)
        assert torch.equal(masked.text_mask_R11T, pipe.transformer.encode_condition(text, padded).text_mask_R11T)


def test_diffusion_head_uploads_its_constants_once():
    from diffusers_var_accel.models.diffusion_head_hart import HARTDiffusionHead

    head = HARTDiffusionHead(token_channels=4, condition_channels=8, width=16, depth=1)
    cond = torch.randn(6, 8, generator=torch.Generator().manual_seed(8))
    first = head.sample(cond, guidance=2.0, generator=torch.Generator().manual_seed(0))
    with _Ops() as ops:
        again = head.sample(cond, guidance=2.0, generator=torch.Generator().manual_seed(0))
    assert "lift_fresh" not in ops.names and "_local_scalar_dense" not in ops.names
    assert torch.equal(first, again)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", [None, *METHOD_NAMES])
def test_kv_cache_bytes_is_what_the_call_allocates(pipes, family, method, monkeypatch):
    """``pipe.kv_cache_bytes`` (counted from the plan) equals the bytes the call's cache buffers take, and a method
    that skips or groups the last scales allocates less than the baseline."""
    pipe = pipes(family)
    if method is not None and family not in METHODS[method].presets:
        pytest.skip(f"{method} has no {family} preset")
    scheduler = None if method is None else tiny_preset(method, family)
    caches = []

    def recording_cache(num_layers, max_length=None):
        caches.append(ScaleKVCache(num_layers, max_length=max_length))
        return caches[-1]

    monkeypatch.setattr(loop_module, "ScaleKVCache", recording_cache)
    _generate(pipe, family, scheduler)
    size = {"height": INFINITY_SIZE[0], "width": INFINITY_SIZE[1]} if family == "infinity" else {}
    counted = pipe.kv_cache_bytes(scheduler, **size)
    assert len(caches) == 1 and caches[0].nbytes == counted > 0
    baseline = pipe.kv_cache_bytes(None, **size)
    assert counted <= baseline
    if method == "lazyvar":  # its group of the last scales is the last pass: none of it is kept
        assert counted < baseline
    wide = pipe.kv_cache_bytes(
        scheduler, kv_channels=4 * pipe.transformer.config.embed_dim, dtype=torch.bfloat16, **size
    )
    assert wide == 2 * counted  # 4x the channels, half the bytes per element
    assert pipe.kv_cache_bytes(scheduler, batch_size=3, cfg=False, **size) == 3 * counted // 2
    with pytest.raises(ValueError, match="batch_size"):
        pipe.kv_cache_bytes(scheduler, batch_size=0, **size)


@pytest.mark.parametrize("masked", [False, True])
def test_attention_key_mean_in_query_blocks_equals_the_full_map(masked):
    """ARVAR's saliency (the attention each key receives, mean over heads and queries) reduced block by block of
    queries equals the full map's mean within fp32 rounding, as does the output; one block is the full computation
    bit for bit."""
    from diffusers_var_accel.models.attention_processor import _explicit_attention, attention_with_key_mean

    g = torch.Generator().manual_seed(0)
    R, H, L, S, c = 2, 3, 37, 50, 8
    q, k, v = (torch.randn(R, H, n, c, generator=g) for n in (L, S, S))
    mask = (torch.rand(L, S, generator=g) > 0.3) | torch.eye(L, S, dtype=torch.bool) if masked else None
    out_full, probs = _explicit_attention(q, k, v, 0.5, mask)
    out, key_mean = attention_with_key_mean(q, k, v, 0.5, mask)
    assert torch.equal(out, out_full) and torch.equal(key_mean, probs.float().mean(dim=(1, 2)))
    for max_elements in (R * H * S * 5, R * H * S, 1):  # 8 blocks, one query per block (twice: below the minimum)
        out_b, key_mean_b = attention_with_key_mean(q, k, v, 0.5, mask, max_elements=max_elements)
        torch.testing.assert_close(out_b, out_full, atol=1e-6, rtol=0)
        torch.testing.assert_close(key_mean_b, key_mean, atol=1e-7, rtol=0)


def test_guided_call_follows_each_familys_no_guidance_value(pipes):
    """Infinity runs no CFG rows at guidance 1 (every scale), HART at weight 0; the default call runs them."""
    infinity, hart = pipes("infinity"), pipes("hart")
    assert infinity.guided_call() and not infinity.guided_call(1.0) and infinity.guided_call(1.0, cfg_list=[1.0, 2.0])
    assert not infinity.guided_call(3.0, cfg_list=[1.0, 1.0])
    assert hart.guided_call() and not hart.guided_call(0.0) and hart.guided_call(1.0)
    assert infinity.call_default("guidance_scale") == 4.0 and hart.call_default("guidance_scale") == 4.5
    with pytest.raises(ValueError, match="no argument 'guidance'"):
        hart.call_default("guidance")
