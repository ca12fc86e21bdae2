"""Device sampling (exponential race) against ``torch.multinomial``: same tokens, same generator state, on the CPU."""

import pytest
import torch

from diffusers_var_accel.pipelines.pipeline_common import mask_top_k_top_p, sample_categorical


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
        return [torch.Generator().manual_seed(100 + seed + b) for b in range(B)] if per_image else torch.Generator().manual_seed(seed)

    g_official, g_device = gens(), gens()
    official = sample_categorical(masked, g_official, "official")
    device = sample_categorical(masked, g_device, "device")
    assert device.dtype == official.dtype == torch.int64 and device.shape == official.shape == shape[:2]
    assert torch.equal(device, official)
    assert not torch.isinf(masked.gather(-1, device.unsqueeze(-1))).any()  # a masked class is never drawn
    for a, b in zip(*(map(lambda s: s if isinstance(s, list) else [s], (_state(g_official), _state(g_device))))):
        assert torch.equal(a, b)  # the generators are left in the same state
    # and the next draws of both generators agree
    assert torch.equal(torch.rand(3, generator=g_device if not per_image else g_device[0]),
                       torch.rand(3, generator=g_official if not per_image else g_official[0]))


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
    logits = torch.cat((torch.randn(3, 4000, 2, generator=g) * 8,                       # some minority bits vanish
                        torch.randn(3, 64, 2, generator=g).round(),                     # ties
                        torch.tensor([[[0.0, 40.0], [-200.0, 3.0], [5.0, 5.0], [1e-7, 0.0]]]).expand(3, -1, -1)), dim=1)
    fast, reference = mask_top_k_top_p(logits, top_k, top_p), _reference_mask(logits, top_k, top_p)
    assert torch.equal(fast, reference)
    if top_p == 0.9:
        assert torch.isinf(fast).any() and not torch.isinf(fast).all(-1).any()


@pytest.mark.parametrize("top_k,top_p", [(0, None), (5, None), (64, 0.9), (600, 0.8), (1, 0.5)])
def test_many_class_mask_unchanged(top_k, top_p):
    logits = torch.randn(2, 30, 64, generator=torch.Generator().manual_seed(3))
    assert torch.equal(mask_top_k_top_p(logits, top_k, top_p), _reference_mask(logits, top_k, top_p))
