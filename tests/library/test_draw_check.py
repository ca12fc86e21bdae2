"""Device sampling raises like ``torch.multinomial`` on a row of NaN or zero mass: one check per call, after the loop,
naming the scale (``DrawCheck``); official sampling raises at the draw, as ``multinomial`` does."""

import pytest
import torch

from diffusers_var_accel.pipelines.hart.pipeline_hart import HARTScaleFamily
from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline
from diffusers_var_accel.pipelines.infinity.pipeline_infinity import InfinityScaleFamily
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline
from diffusers_var_accel.pipelines.sampling import DrawCheck, _exponential_race, _multinomial, sample_categorical

MULTINOMIAL_SAYS = r"probability tensor contains either `inf`, `nan` or element < 0|invalid multinomial distribution"


def _logits_with_a_bad_row(bad: float) -> torch.Tensor:
    logits = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0))
    logits[1, 3] = bad  # NaN: a NaN row; -inf everywhere: softmax gives NaN too (0 / 0)
    return logits


@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
@pytest.mark.parametrize("per_image", [False, True])
def test_a_bad_row_raises_in_both_modes(bad, per_image):
    def gen():
        return [torch.Generator().manual_seed(b) for b in range(2)] if per_image else torch.Generator().manual_seed(0)

    with pytest.raises(RuntimeError, match=MULTINOMIAL_SAYS):
        sample_categorical(_logits_with_a_bad_row(bad), gen(), "official")
    check = DrawCheck()
    sample_categorical(_logits_with_a_bad_row(bad), gen(), "device", check, scale_index=4)  # no sync, no raise yet
    assert len(check.minima) == (2 if per_image else 1) and check.scale_indices == [4] * len(check.minima)
    with pytest.raises(RuntimeError, match=r"invalid multinomial distribution at scale 4: .*contains `nan`"):
        check.raise_if_invalid()


def test_a_zero_mass_row_raises_in_both_modes():
    probs = torch.full((3, 4), 0.25)
    probs[2] = 0.0
    with pytest.raises(RuntimeError, match=MULTINOMIAL_SAYS):
        _multinomial(probs, torch.Generator().manual_seed(0))
    check = DrawCheck()
    _, winners = _exponential_race(probs, torch.Generator().manual_seed(0))
    check.record(winners, 7)
    with pytest.raises(RuntimeError, match=r"at scale 7: .*zero mass"):
        check.raise_if_invalid()


def test_clean_draws_pass_the_check_and_keep_multinomials_tokens():
    logits = torch.randn(3, 11, 5, generator=torch.Generator().manual_seed(3))
    check = DrawCheck()
    device = sample_categorical(logits, torch.Generator().manual_seed(1), "device", check, scale_index=0)
    assert torch.equal(device, sample_categorical(logits, torch.Generator().manual_seed(1), "official"))
    check.raise_if_invalid()  # nothing to say
    assert check.minima == [] and check.scale_indices == []  # read once, then empty


def _poison_scale(monkeypatch, family_class, poisoned_scale):
    original = family_class.guided_logits

    def guided_logits(self, hidden_RLC, condition, scale_index, *args, **kwargs):
        logits, raw = original(self, hidden_RLC, condition, scale_index, *args, **kwargs)
        if scale_index == poisoned_scale:
            logits = logits.clone()
            logits[0, 0] = float("nan")  # one token of the first image
        return logits, raw

    monkeypatch.setattr(family_class, "guided_logits", guided_logits)


@pytest.fixture(scope="module")
def pipes():
    from conftest import tiny_hart_patch_nums

    infinity = build_tiny_infinity_pipeline(seed=0, depth=2)
    hart = build_tiny_hart_pipeline(seed=0, depth=2, embed_dim=32, patch_nums=tiny_hart_patch_nums()[:6])
    for pipe in (infinity, hart):
        pipe.set_progress_bar_config(disable=True)
    return {
        "infinity": (infinity, InfinityScaleFamily, dict(height=256, width=256)),
        "hart": (hart, HARTScaleFamily, {}),
    }


@pytest.mark.parametrize("family", ["infinity", "hart"])
@pytest.mark.parametrize("output_type", ["pt", "latent"])
def test_a_nan_scale_raises_end_to_end_naming_it(pipes, family, output_type, monkeypatch):
    pipe, family_class, size = pipes[family]

    def call():
        return pipe("a red fox", generator=torch.Generator().manual_seed(0), output_type=output_type, **size)

    clean = call().images  # a clean call does not raise
    _poison_scale(monkeypatch, family_class, 2)
    with pytest.raises(RuntimeError, match=r"invalid multinomial distribution at scale 2: .*contains `nan`"):
        call()
    pipe.set_sampling("official")
    try:
        with pytest.raises(RuntimeError, match=MULTINOMIAL_SAYS):
            call()
    finally:
        pipe.set_sampling("device")
    monkeypatch.undo()
    assert torch.equal(call().images, clean)  # the check changes no token
