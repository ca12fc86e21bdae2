"""Image fidelity metrics against a reference image (the unaccelerated image of the same prompt and seed).

Images are ``(B, C, H, W)`` float tensors in [0, 1] (or PIL images / uint8 arrays, converted). PSNR and SSIM are
computed in plain torch. The metrics that need a network:

* :func:`frechet_distance` and :func:`fid_star`: FID* is the Fréchet distance between the features of a method's
  images and those of the baseline's images (same prompts, same seeds), not against real photographs. The feature
  extractor is injectable; the default is the standard FID Inception network (``pytorch_fid``'s ``InceptionV3``,
  2048-d pool features, weights ``pt_inception-2015-12-05-6726825d.pth``), used **only** when that package and that
  weights file are already on this machine (the torch hub cache). Otherwise :class:`MetricUnavailable` says why.
  No other network is ever used under the name FID.
* :func:`load_lpips`: LPIPS (Zhang et al. 2018, AlexNet variant, the ``lpips`` package) under the same rule: its
  AlexNet ImageNet weights (``alexnet-owt-7be5be79.pth``) must already be in the torch hub cache.

Nothing here downloads anything. Images are ``(B, 3, H, W)`` float tensors in [0, 1].
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

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


# ---------------------------------------------------------------------------------------------------------------------
# metrics that need a network (never downloaded)
# ---------------------------------------------------------------------------------------------------------------------


#: File name of the standard FID Inception weights (TF Inception of 2015-12-05 ported by ``pytorch_fid``).
FID_INCEPTION_WEIGHTS = "pt_inception-2015-12-05-6726825d.pth"

#: File name of torchvision's AlexNet ImageNet weights, the backbone of LPIPS (alex).
LPIPS_ALEXNET_WEIGHTS = "alexnet-owt-7be5be79.pth"

FeatureExtractor = Callable[[torch.Tensor], torch.Tensor]
LPIPSFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class MetricUnavailable(RuntimeError):
    """A metric cannot be computed on this machine; the message says why (shown in the results)."""


def image_sha256(image_HWC: np.ndarray) -> str:
    """SHA-256 of a uint8 image's pixels and shape: equal hashes mean bit-identical images."""
    array = np.ascontiguousarray(image_HWC, dtype=np.uint8)
    digest = hashlib.sha256(str(array.shape).encode())
    digest.update(array.tobytes())
    return digest.hexdigest()


def _as_features(feats: Union[torch.Tensor, np.ndarray, Sequence]) -> torch.Tensor:
    x = torch.as_tensor(np.asarray(feats, dtype=np.float64) if not isinstance(feats, torch.Tensor) else feats)
    x = x.detach().to("cpu", torch.float64)
    if x.ndim != 2:
        raise ValueError(f"features must be (N, D), got shape {tuple(x.shape)}")
    if x.shape[0] < 2:
        raise ValueError(f"a Fréchet distance needs at least 2 feature vectors per set, got {x.shape[0]}")
    return x


def _psd_sqrt(matrix: torch.Tensor) -> torch.Tensor:
    """Square root of a symmetric positive semi-definite matrix (negative eigenvalues from round-off clipped)."""
    values, vectors = torch.linalg.eigh(matrix)
    return (vectors * values.clamp(min=0).sqrt()) @ vectors.T


def frechet_distance(feats_a, feats_b) -> float:
    """Fréchet distance between Gaussians fitted to two feature sets ``(N, D)`` and ``(M, D)``.

    ``|mu_a - mu_b|^2 + tr(S_a) + tr(S_b) - 2 tr((S_a S_b)^(1/2))`` with unbiased covariances, in float64. The trace
    of the matrix square root is computed without ``scipy`` from the symmetric form ``S_a^(1/2) S_b S_a^(1/2)``, which
    has the same eigenvalues as ``S_a S_b`` (two eigendecompositions). A set against itself gives 0 up to round-off.
    """
    a, b = _as_features(feats_a), _as_features(feats_b)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"feature sizes differ: {a.shape[1]} and {b.shape[1]}")
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = torch.cov(a.T).reshape(a.shape[1], -1), torch.cov(b.T).reshape(b.shape[1], -1)
    root_a = _psd_sqrt(cov_a)
    middle = root_a @ cov_b @ root_a
    trace_sqrt = torch.linalg.eigvalsh((middle + middle.T) / 2).clamp(min=0).sqrt().sum()
    value = (mu_a - mu_b).pow(2).sum() + cov_a.trace() + cov_b.trace() - 2 * trace_sqrt
    return max(float(value), 0.0)


def torch_hub_checkpoint(name: str) -> Path:
    """Where ``torch.hub.load_state_dict_from_url`` keeps (or would download) a weights file called ``name``."""
    return Path(torch.hub.get_dir()) / "checkpoints" / name


def load_fid_extractor(device: Union[str, torch.device] = "cpu") -> FeatureExtractor:
    """The standard FID feature extractor (2048-d Inception pool features), from local files only.

    Raises:
        MetricUnavailable: ``pytorch_fid`` is not installed, or its weights file is not in the torch hub cache.
    """
    if importlib.util.find_spec("pytorch_fid") is None:
        raise MetricUnavailable(
            "FID needs the standard FID Inception network: the pytorch_fid package is not installed "
            f"(pip install pytorch-fid, then put {FID_INCEPTION_WEIGHTS} in the torch hub cache)"
        )
    weights = torch_hub_checkpoint(FID_INCEPTION_WEIGHTS)
    if not weights.is_file():
        raise MetricUnavailable(
            f"FID Inception weights {FID_INCEPTION_WEIGHTS} are not in the torch hub cache ({weights.parent}); "
            "they are not downloaded at run time"
        )
    from pytorch_fid.inception import InceptionV3

    model = InceptionV3([InceptionV3.BLOCK_INDEX_BY_DIM[2048]]).eval().to(device)

    @torch.no_grad()
    def extract(images_BCHW: torch.Tensor) -> torch.Tensor:
        pooled = model(images_BCHW.to(device, torch.float32))[0]  # resized to 299 and normalised inside
        return pooled.flatten(1).cpu()

    return extract


def load_lpips(device: Union[str, torch.device] = "cpu") -> LPIPSFunction:
    """LPIPS (AlexNet, v0.1 linear layers of the ``lpips`` package) from local files only.

    Returns a function ``(images, references) -> (B,)`` distances for ``(B, 3, H, W)`` tensors in [0, 1].

    Raises:
        MetricUnavailable: ``lpips`` is not installed, or the AlexNet weights are not in the torch hub cache.
    """
    spec = importlib.util.find_spec("lpips")
    if spec is None:
        raise MetricUnavailable(
            "LPIPS needs the lpips package (pip install lpips) and the AlexNet ImageNet weights "
            f"{LPIPS_ALEXNET_WEIGHTS} in the torch hub cache"
        )
    backbone = torch_hub_checkpoint(LPIPS_ALEXNET_WEIGHTS)
    if not backbone.is_file():
        raise MetricUnavailable(
            f"LPIPS AlexNet weights {LPIPS_ALEXNET_WEIGHTS} are not in the torch hub cache "
            f"({backbone.parent}); they are not downloaded at run time"
        )
    linear = Path(spec.origin).parent / "weights" / "v0.1" / "alex.pth"
    if not linear.is_file():
        raise MetricUnavailable(f"the lpips package has no linear-layer weights at {linear}")
    import lpips

    model = lpips.LPIPS(net="alex", verbose=False).eval().to(device)

    @torch.no_grad()
    def distance(images: torch.Tensor, references: torch.Tensor) -> torch.Tensor:
        out = model(images.to(device, torch.float32), references.to(device, torch.float32), normalize=True)
        return out.flatten().cpu()

    return distance


def fid_star(
    images, reference_images, feature_extractor: Optional[FeatureExtractor] = None, batch_size: int = 32
) -> float:
    """FID*: the Fréchet distance between the features of ``images`` and of ``reference_images`` (e.g. the baseline's).

    Args:
        images (`Sequence` or `torch.Tensor`): a sequence of images (tensors ``(3, H, W)`` or ``(1, 3, H, W)`` in
            [0, 1], uint8 arrays or PIL images), or an ``(N, 3, H, W)`` tensor.
        reference_images (`Sequence` or `torch.Tensor`): the reference images, in the same forms.
        feature_extractor: ``(B, 3, H, W)`` float in [0, 1] -> ``(B, D)`` features. ``None``: the standard FID
            Inception network if it is available locally (:func:`load_fid_extractor`), else
            :class:`MetricUnavailable` is raised.
        batch_size: images per extractor call.

    With fewer images than feature dimensions (2048 for Inception) the covariances are singular and the value is a
    rough indication only: FID is meant for thousands of images.
    """
    extractor = feature_extractor if feature_extractor is not None else load_fid_extractor()
    return frechet_distance(
        extract_features(images, extractor, batch_size), extract_features(reference_images, extractor, batch_size)
    )


def extract_features(images, extractor: FeatureExtractor, batch_size: int = 32) -> torch.Tensor:
    """``(N, D)`` features of a sequence of images (see :func:`fid_star`)."""

    if isinstance(images, torch.Tensor) and images.ndim == 4:
        stack = images.to(torch.float32)
    else:
        stack = torch.cat([to_tensor(im) for im in images]).to(torch.float32)
    return torch.cat(
        [
            extractor(stack[i : i + batch_size]).detach().to("cpu", torch.float64).flatten(1)
            for i in range(0, stack.shape[0], batch_size)
        ]
    )
