"""Image fidelity metrics against a reference image (the unaccelerated image of the same prompt and seed).

Images are ``(B, C, H, W)`` float tensors in [0, 1] (or PIL images / uint8 arrays, converted). PSNR and SSIM are
computed here in plain torch; networks (LPIPS, FID features) are not part of this module.
"""

from __future__ import annotations

import math
from typing import Any, Union

import numpy as np
import torch
import torch.nn.functional as F

ImageLike = Union[torch.Tensor, np.ndarray, Any]  # tensors, uint8 arrays or PIL images


def to_tensor(image: ImageLike) -> torch.Tensor:
    """``(B, C, H, W)`` float64 in [0, 1] from a tensor in [0, 1], a uint8 array (HWC) or a PIL image."""
    if isinstance(image, torch.Tensor):
        x = image.detach().to(torch.float64)
        return x if x.ndim == 4 else x.unsqueeze(0)
    array = np.asarray(image)
    if array.dtype == np.uint8:
        array = array.astype(np.float64) / 255.0
    x = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float64))
    if x.ndim == 2:
        x = x.unsqueeze(-1)
    return x.permute(2, 0, 1).unsqueeze(0) if x.ndim == 3 else x.permute(0, 3, 1, 2)


def psnr(image: ImageLike, reference: ImageLike) -> torch.Tensor:
    """Peak signal-to-noise ratio in dB per image, ``10 log10(1 / MSE)``; ``inf`` for identical images."""
    x, y = to_tensor(image), to_tensor(reference)
    if x.shape != y.shape:
        raise ValueError(f"image {tuple(x.shape)} and reference {tuple(y.shape)} differ in shape")
    mse = (x - y).pow(2).flatten(1).mean(dim=1)
    return torch.where(mse == 0, torch.full_like(mse, math.inf), 10 * torch.log10(1.0 / mse))


def ssim(image: ImageLike, reference: ImageLike, window: int = 11, sigma: float = 1.5) -> torch.Tensor:
    """Structural similarity per image (Wang et al. 2004): Gaussian window 11 / sigma 1.5, ``K1 = 0.01``,
    ``K2 = 0.03``, data range 1, averaged over channels and valid positions; 1 for identical images."""
    x, y = to_tensor(image), to_tensor(reference)
    if x.shape != y.shape:
        raise ValueError(f"image {tuple(x.shape)} and reference {tuple(y.shape)} differ in shape")
    window = min(window, x.shape[-1], x.shape[-2])
    coords = torch.arange(window, dtype=torch.float64) - (window - 1) / 2
    g = torch.exp(-coords.pow(2) / (2 * sigma * sigma))
    g = g / g.sum()
    C = x.shape[1]
    kernel = (g[:, None] * g[None, :]).expand(C, 1, window, window)

    def blur(t):
        return F.conv2d(t, kernel, groups=C)

    c1, c2 = 0.01**2, 0.03**2
    mu_x, mu_y = blur(x), blur(y)
    var_x = blur(x * x) - mu_x.pow(2)
    var_y = blur(y * y) - mu_y.pow(2)
    cov = blur(x * y) - mu_x * mu_y
    value = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x.pow(2) + mu_y.pow(2) + c1) * (var_x + var_y + c2))
    return value.flatten(1).mean(dim=1)
