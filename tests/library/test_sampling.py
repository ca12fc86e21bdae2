"""Device sampling (exponential race) against ``torch.multinomial``: same tokens, same generator state, on the CPU."""

import pytest
import torch

from diffusers_var_accel.pipelines.sampling import mask_top_k_top_p, sample_categorical


def _logits(shape, seed, kind):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, generator=g) * 3
    if kind == "ties":  # repeated values and exact ties between the two bits
        logits = logits.round()
    return logits


def _state(generator):
    return generator.get_state() if isinstance(generator, torch.Generator) else [g.get_state() for g in generator]


@pytest.mark.parametrize("shape", [(1, 1, 2), (2, 37, 2), (3, 256, 2), (2, 5, 64), (1, 9, 4096), (4, 3, 1000)])
@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize("mask", [(0, None), (1, None), (600, None), (0, 0.9), (0, 0.3), (5, 0.8), (2, 0.95)])
@pytest.mark.parametrize("per_image", [False, True])
def test_device_sampling_is_multinomial(shape, seed, mask, per_image):
    B = shape[0]
    masked = mask_top_k_top_p(_logits(shape, seed, "ties" if seed == 7 else "plain"), *mask)
    if shape[-1] > 2 and (0 < mask[0] < shape[-1] or mask[1] is not None):
        assert torch.isinf(masked).any()  # zeros in the distributions the race must never pick

    def gens():
        return (
            [torch.Generator().manual_seed(100 + seed + b) for b in range(B)]
            if per_image
            else torch.Generator().manual_seed(seed)
        )

    g_official, g_device = gens(), gens()
    official = sample_categorical(masked, g_official, "official")
    device = sample_categorical(masked, g_device, "device")
    assert device.dtype == official.dtype == torch.int64 and device.shape == official.shape == shape[:2]
    assert torch.equal(device, official)
    assert not torch.isinf(masked.gather(-1, device.unsqueeze(-1))).any()  # a masked class is never drawn
    for a, b in zip(*(map(lambda s: s if isinstance(s, list) else [s], (_state(g_official), _state(g_device))))):
        assert torch.equal(a, b)  # the generators are left in the same state
    # and the next draws of both generators agree
    assert torch.equal(
        torch.rand(3, generator=g_device if not per_image else g_device[0]),
        torch.rand(3, generator=g_official if not per_image else g_official[0]),
    )


def test_sampling_mode_is_checked():
    with pytest.raises(ValueError, match="'gpu'.*device.*official|sampling must be one of"):
        sample_categorical(torch.zeros(1, 1, 2), None, "gpu")


def _reference_mask(logits_BNV, top_k, top_p):
    """The general top-k / top-p (sort, cumsum, scatter), for any V."""
    logits = logits_BNV.float().clone()
    V = logits.shape[-1]
    if top_k and top_k > 0:
        kth = logits.topk(min(int(top_k), V), dim=-1, largest=True, sorted=False)[0].amin(dim=-1, keepdim=True)
        logits.masked_fill_(logits < kth, float("-inf"))
    if top_p is not None and top_p > 0:
        sorted_logits, sorted_idx = logits.sort(dim=-1, descending=False)
        remove_sorted = sorted_logits.softmax(dim=-1).cumsum_(dim=-1) <= (1 - top_p)
        remove_sorted[..., -1:] = False
        logits.masked_fill_(remove_sorted.scatter(-1, sorted_idx, remove_sorted), float("-inf"))
    return logits


@pytest.mark.parametrize("top_k", [0, 1, 2, 3, 900])
@pytest.mark.parametrize("top_p", [None, 0.0, 0.51, 0.9, 0.97, 0.999999, 1.0, 1.5])
def test_two_class_mask_equals_the_general_one(top_k, top_p):
    g = torch.Generator().manual_seed(top_k)
    logits = torch.cat(
        (
            torch.randn(3, 4000, 2, generator=g) * 8,  # some minority bits vanish
            torch.randn(3, 64, 2, generator=g).round(),  # ties
            torch.tensor([[[0.0, 40.0], [-200.0, 3.0], [5.0, 5.0], [1e-7, 0.0]]]).expand(3, -1, -1),
        ),
        dim=1,
    )
    fast, reference = mask_top_k_top_p(logits, top_k, top_p), _reference_mask(logits, top_k, top_p)
    assert torch.equal(fast, reference)
    if top_p == 0.9:
        assert torch.isinf(fast).any() and not torch.isinf(fast).all(-1).any()


@pytest.mark.parametrize("top_k,top_p", [(0, None), (5, None), (64, 0.9), (600, 0.8), (1, 0.5)])
def test_many_class_mask_unchanged(top_k, top_p):
    logits = torch.randn(2, 30, 64, generator=torch.Generator().manual_seed(3))
    assert torch.equal(mask_top_k_top_p(logits, top_k, top_p), _reference_mask(logits, top_k, top_p))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mask_returns_a_new_float_tensor(dtype):
    logits = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(3)).to(dtype)
    before = logits.clone()
    masked = mask_top_k_top_p(logits, 3, 0.9)
    assert masked.dtype == torch.float32 and masked.data_ptr() != logits.data_ptr()
    assert torch.equal(logits, before)  # the caller's logits are never written


def _tiny_family():
    from diffusers_var_accel.pipelines.infinity.pipeline_infinity import InfinityScaleFamily
    from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

    pipe = build_tiny_infinity_pipeline(seed=0, depth=1, with_text_encoder=False)
    schedule, grid = pipe.scale_schedule_for(256, 256)
    return pipe.transformer, InfinityScaleFamily(pipe.transformer, pipe.vae, schedule, grid, top_k=0, top_p=None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_infinity_guided_logits_equal_the_reference_formula(dtype):
    # The head's AdaLN terms are kept per call and a power-of-two 1/tau is folded into the guidance weights: the
    # logits stay those of head(LN(x) * (1 + scale) + shift), times 1/tau, then guided, bit for bit.
    from diffusers_var_accel.models.transformer_infinity import ada_layer_norm

    transformer, family = _tiny_family()
    g = torch.Generator().manual_seed(11)
    B, L, C = 2, 6, transformer.config.embed_dim
    hidden = torch.randn(2 * B, L, C, generator=g)
    cond = torch.randn(2 * B, C, generator=g)
    condition = type("Condition", (), {"cond_RC": cond})()
    autocast = torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32)

    def reference_head(h, c):
        scale, shift = transformer.head_nm.ada_lin(c.float()).view(-1, 1, 2, C).unbind(2)
        return transformer.head(ada_layer_norm(h.float(), scale, shift, transformer.head_nm.norm_eps))

    with autocast:
        for tau in (0.5, 1.0, 0.25, 0.3, 2.0):
            for guidance in (3.0, 1.0):
                logits, raw = family.guided_logits(hidden, condition, 1, guidance, tau, B)
                if guidance != 1:
                    expected_raw = reference_head(hidden, cond)
                    scaled = expected_raw.mul(1 / tau)
                    expected = guidance * scaled[:B] + (1 - guidance) * scaled[B:]
                else:
                    expected_raw = reference_head(hidden[:B], cond[:B])
                    expected = expected_raw.mul(1 / tau)
                assert raw.dtype == expected_raw.dtype and torch.equal(raw, expected_raw), (tau, guidance)
                assert logits.dtype == expected.dtype and torch.equal(logits, expected), (tau, guidance)
    assert len(family._head_modulations) == 2  # all rows and the conditional rows: computed once each


def test_exact_gain_is_a_small_power_of_two():
    from diffusers_var_accel.pipelines.infinity.pipeline_infinity import _is_exact_gain

    assert all(_is_exact_gain(v) for v in (1.0, 2.0, 4.0, 2.0**16))
    assert not any(_is_exact_gain(v) for v in (0.5, 3.0, 1 / 0.3, 2.0**17, 0.0, -2.0, 1.5))
