"""PSNR and SSIM on inputs with known answers."""

import math

import numpy as np
import pytest
import torch

from diffusers_var_accel.lab.metrics import psnr, ssim


def test_identical_images():
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    assert torch.isinf(psnr(x, x)).all()
    torch.testing.assert_close(ssim(x, x), torch.ones(2, dtype=torch.float64))


def test_known_shift_gives_known_psnr():
    x = torch.full((1, 3, 16, 16), 0.5, dtype=torch.float64)
    assert psnr(x + 0.1, x).item() == pytest.approx(20.0, abs=1e-6)  # MSE 0.01 -> 20 dB
    assert psnr(x + 0.01, x).item() == pytest.approx(40.0, abs=1e-5)


def test_uint8_pil_like_arrays_and_shape_errors():
    a = np.zeros((16, 16, 3), dtype=np.uint8)
    b = a.copy()
    b[...] = 255
    assert psnr(a, b).item() == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="shape"):
        psnr(torch.zeros(1, 3, 8, 8), torch.zeros(1, 3, 8, 9))


def test_ssim_decreases_with_noise_and_ignores_a_constant_offset_less_than_structure():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(1, 3, 32, 32, generator=g)
    mild = (x + 0.02 * torch.randn(x.shape, generator=g)).clamp(0, 1)
    strong = (x + 0.3 * torch.randn(x.shape, generator=g)).clamp(0, 1)
    assert 1 > ssim(mild, x).item() > ssim(strong, x).item()
    assert math.isfinite(ssim(strong, x).item())
