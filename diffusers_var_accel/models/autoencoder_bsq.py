"""The BSQ VAE of Infinity: a convolutional autoencoder with a binary spherical quantiser (BSQ), and its f_hat update.

Infinity (https://arxiv.org/abs/2412.04431) generates an image as bits: at every scale each token carries ``d`` bits, a
bit is a code of ``+-1/sqrt(d)`` on one latent channel, and the codes of all scales are summed, at the final latent size,
into ``f_hat``, the decoder input. BSQ itself is from https://arxiv.org/abs/2406.07548.

As VAR's quantiser does, this tokeniser owns the ``f_hat`` bookkeeping of the next-scale loop (``bits_to_codes``,
``add_scale_codes``, ``next_scale_input``), so the loop never interpolates. The modules hold weights only: ``f_hat``
lives in the caller.

The module tree mirrors the official ``infinity/models/bsq_vae/flux_vqgan.py`` (FoundationVision/Infinity) for the
configuration the released models use (2D convolutions, GroupNorm, no attention blocks), without the official
``Conv`` / ``Normalize`` wrapper level: our ``decoder.conv_in.weight`` is the official ``decoder.conv_in.conv.weight``
and our ``decoder.mid.block_1.norm1.weight`` the official ``decoder.mid.block_1.norm1.norm.weight``.
``from_original_checkpoint`` reads the official files (either naming).

Shape-suffix legend: ``B`` batch, ``C`` feature channels, ``d`` codebook dimension (= latent channels, bits per
token), ``h w`` the token map of one scale, ``H W`` the final latent size (or, in ``image_B3HW``, the image size),
``l = h*w`` tokens of one scale.
"""

from __future__ import annotations

import inspect
import math
import os
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.utils.accelerate_utils import apply_forward_hook
from torch import nn

from .checkpoint_utils import StrictLoadingMixin, build_and_load_strict, load_original_state_dict
from .vae_decoding import SlicedTiledDecodeMixin

__all__ = [
    "INFINITY_VAE_D32_CONFIG",
    "INFINITY_VAE_D56_PATCHIFY_CONFIG",
    "InfinityBSQVAE",
    "convert_infinity_vae_checkpoint",
]

#: Configuration of the released Infinity-2B / 8B VAE (``infinity_vae_d32reg.pth``, ``vae_type=32``).
INFINITY_VAE_D32_CONFIG: Dict[str, Any] = {
    "codebook_dim": 32,
    "base_ch": 128,
    "encoder_ch_mult": [1, 2, 4, 4, 4],
    "decoder_ch_mult": [1, 2, 4, 4, 4],
    "num_res_blocks": 2,
    "patch_size": 16,
    "in_channels": 3,
    "out_channels": 3,
    "encoder_double_z": False,
}

#: Configuration of the released Infinity-8B VAE (``infinity_vae_d56_f8_14_patchify.pth``): the official
#: ``load_visual_tokenizer`` with ``vae_type=14, apply_spatial_patchify=1`` sets codebook_dim 14, patch 8 and a
#: 4-level ch_mult (``vae_model`` fixes base_ch 128 and 2 ResBlocks). The 8B transformer's tokens are 2x2 patches of
#: this latent (56 bits, "d56"); the VAE itself knows nothing of the patchify.
INFINITY_VAE_D56_PATCHIFY_CONFIG: Dict[str, Any] = {
    "codebook_dim": 14,
    "base_ch": 128,
    "encoder_ch_mult": [1, 2, 4, 4],
    "decoder_ch_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "patch_size": 8,
    "in_channels": 3,
    "out_channels": 3,
    "encoder_double_z": False,
}

#: Quantiser buffers of the official checkpoint (bit weights 2^(d-1) ... 1, registered twice); they carry no weights.
_ORIGINAL_MASK_KEYS = ("quantizer.lfq.mask", "quantize.lfq.mask")

#: The official wrapper level: ``X.conv.weight`` (``Conv``) and ``X.norm.weight`` (``Normalize``) are our ``X.weight``.
_WRAPPED_SUFFIX = re.compile(r"\.(conv|norm)\.(weight|bias)$")

ScaleSize = Union[Tuple[int, int], Tuple[int, int, int], Sequence[int]]


def _swish(x: torch.Tensor) -> torch.Tensor:
    # Written as the official ``x * sigmoid(x)`` rather than F.silu, to keep the arithmetic of the reference.
    return x * torch.sigmoid(x)


def _group_norm(num_channels: int) -> nn.GroupNorm:
    """GroupNorm as in the official ``Normalize``: 32 groups when they divide the channels, else 24; eps 1e-6."""
    if num_channels % 32 == 0:
        num_groups = 32
    elif num_channels % 24 == 0:
        num_groups = 24
    else:
        raise ValueError(f"GroupNorm needs a channel count divisible by 32 or 24, got {num_channels} channels")
    return nn.GroupNorm(num_groups=num_groups, num_channels=num_channels, eps=1e-6, affine=True)


def _scale_hw(size: ScaleSize, name: str) -> Tuple[int, int]:
    """``(h, w)`` of a scale given as ``(h, w)`` or ``(1, h, w)`` (the official schedules carry a time axis of 1)."""
    size = tuple(int(s) for s in size)
    if len(size) == 3:
        if size[0] != 1:
            raise ValueError(f"{name} {size} has a time size of {size[0]}; only images (t = 1) are supported")
        size = size[1:]
    if len(size) != 2 or size[0] < 1 or size[1] < 1:
        raise ValueError(f"{name} must be (h, w) or (1, h, w) with positive h and w, got {size}")
    return size


class BSQResnetBlock(nn.Module):
    """GroupNorm -> swish -> 3x3 conv, twice, plus a residual (a 1x1 ``nin_shortcut`` when the channels change)."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.norm1 = _group_norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=1, padding=1)
        self.norm2 = _group_norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, stride=1, padding=1)
        if in_channels != out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=1, padding=0)

    def forward(self, x_BChw: torch.Tensor) -> torch.Tensor:
        h_BChw = self.conv1(_swish(self.norm1(x_BChw)))
        h_BChw = self.conv2(_swish(self.norm2(h_BChw)))
        if self.in_channels != self.out_channels:
            x_BChw = self.nin_shortcut(x_BChw)
        return x_BChw + h_BChw

    def extra_repr(self) -> str:
        return f"in_channels={self.in_channels}, out_channels={self.out_channels}"


class BSQDownsample(nn.Module):
    """Halves h and w: zero-pad one row at the bottom and one column at the right, then a 3x3 stride-2 conv."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, stride=2, padding=0)

    def forward(self, x_BChw: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x_BChw, (0, 1, 0, 1), mode="constant", value=0.0))


class BSQUpsample(nn.Module):
    """Doubles h and w: nearest-neighbour x2, then a 3x3 conv."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, stride=1, padding=1)

    def forward(self, x_BChw: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x_BChw, scale_factor=2.0, mode="nearest"))


class BSQEncoder(nn.Module):
    """Image -> continuous latent: ``conv_in``, levels ``down.{i}`` (ResBlocks, then a downsample while the spatial
    factor is below ``patch_size``), ``mid.block_1/2``, ``norm_out``, swish, ``conv_out``."""

    def __init__(
        self,
        in_channels: int,
        base_ch: int,
        ch_mult: Tuple[int, ...],
        num_res_blocks: int,
        num_downsamples: int,
        out_channels: int,
    ):
        super().__init__()
        self.conv_in = nn.Conv2d(in_channels, base_ch, kernel_size=3, stride=1, padding=1)
        self.down = nn.ModuleList()
        block_in = base_ch
        for i_level, mult in enumerate(ch_mult):
            level = nn.Module()
            level.block = nn.ModuleList()
            block_out = base_ch * mult
            for _ in range(num_res_blocks):
                level.block.append(BSQResnetBlock(block_in, block_out))
                block_in = block_out
            if i_level < num_downsamples:
                level.downsample = BSQDownsample(block_in)
            self.down.append(level)
        self.mid = nn.Module()
        self.mid.block_1 = BSQResnetBlock(block_in, block_in)
        self.mid.block_2 = BSQResnetBlock(block_in, block_in)
        self.norm_out = _group_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, out_channels, kernel_size=3, stride=1, padding=1)

    def forward(self, image_B3HW: torch.Tensor) -> torch.Tensor:
        h_BChw = self.conv_in(image_B3HW)
        for level in self.down:
            for block in level.block:
                h_BChw = block(h_BChw)
            if hasattr(level, "downsample"):
                h_BChw = level.downsample(h_BChw)
        h_BChw = self.mid.block_2(self.mid.block_1(h_BChw))
        return self.conv_out(_swish(self.norm_out(h_BChw)))


class BSQDecoder(nn.Module):
    """Latent -> image: ``conv_in``, ``mid.block_1/2``, levels ``up.{i}`` processed from the last to the first
    (``num_res_blocks + 1`` ResBlocks, then an upsample for levels 1 .. log2(patch_size)), ``norm_out``, swish,
    ``conv_out``."""

    def __init__(
        self,
        latent_channels: int,
        base_ch: int,
        ch_mult: Tuple[int, ...],
        num_res_blocks: int,
        num_upsamples: int,
        out_channels: int,
    ):
        super().__init__()
        block_in = base_ch * ch_mult[-1]
        self.conv_in = nn.Conv2d(latent_channels, block_in, kernel_size=3, stride=1, padding=1)
        self.mid = nn.Module()
        self.mid.block_1 = BSQResnetBlock(block_in, block_in)
        self.mid.block_2 = BSQResnetBlock(block_in, block_in)
        levels: List[nn.Module] = []
        for i_level in reversed(range(len(ch_mult))):
            level = nn.Module()
            level.block = nn.ModuleList()
            block_out = base_ch * ch_mult[i_level]
            for _ in range(num_res_blocks + 1):
                level.block.append(BSQResnetBlock(block_in, block_out))
                block_in = block_out
            if 1 <= i_level <= num_upsamples:
                level.upsample = BSQUpsample(block_in)
            levels.insert(0, level)
        self.up = nn.ModuleList(levels)  # index = level, as in the official tree
        self.norm_out = _group_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, out_channels, kernel_size=3, stride=1, padding=1)

    def forward(self, z_Bdhw: torch.Tensor) -> torch.Tensor:
        h_BChw = self.conv_in(z_Bdhw)
        h_BChw = self.mid.block_2(self.mid.block_1(h_BChw))
        for level in reversed(self.up):
            for block in level.block:
                h_BChw = block(h_BChw)
            if hasattr(level, "upsample"):
                h_BChw = level.upsample(h_BChw)
        return self.conv_out(_swish(self.norm_out(h_BChw)))


class InfinityBSQVAE(StrictLoadingMixin, ModelMixin, ConfigMixin, SlicedTiledDecodeMixin):
    r"""The BSQ VAE of Infinity (https://arxiv.org/abs/2412.04431): decoder, encoder and the multi-scale bit helpers.

    Generation needs only [`~InfinityBSQVAE.bits_to_codes`], [`~InfinityBSQVAE.add_scale_codes`],
    [`~InfinityBSQVAE.next_scale_input`] and [`~InfinityBSQVAE.decode`]. The encoder and
    [`~InfinityBSQVAE.quantize_multiscale`] turn an image into bits (for teacher forcing or reconstruction).

    Args:
        codebook_dim (`int`, *optional*, defaults to 32):
            Latent channels ``d`` = bits per token (the codebook has ``2**d`` entries).
        base_ch (`int`, *optional*, defaults to 128):
            Channels of the first encoder level and of the last decoder level.
        encoder_ch_mult (`tuple[int]`, *optional*, defaults to `(1, 2, 4, 4, 4)`):
            Channel multiplier of each encoder level.
        decoder_ch_mult (`tuple[int]`, *optional*, defaults to `(1, 2, 4, 4, 4)`):
            Channel multiplier of each decoder level (level 0 is the full-resolution one).
        num_res_blocks (`int`, *optional*, defaults to 2):
            ResBlocks per encoder level; decoder levels have one more.
        patch_size (`int`, *optional*, defaults to 16):
            Image pixels per latent position along each axis; a power of 2.
        in_channels (`int`, *optional*, defaults to 3):
            Image channels read by the encoder.
        out_channels (`int`, *optional*, defaults to 3):
            Image channels written by the decoder.
        encoder_double_z (`bool`, *optional*, defaults to `False`):
            Whether the encoder's ``conv_out`` writes ``2 * codebook_dim`` channels (the official ``use_vae=True``
            layout). The released Infinity VAE writes ``codebook_dim`` channels.

    Examples:
        ```py
        >>> import torch
        >>> from diffusers_var_accel.models.autoencoder_bsq import InfinityBSQVAE

        >>> vae = InfinityBSQVAE(codebook_dim=8, base_ch=32, encoder_ch_mult=(1, 1), decoder_ch_mult=(1, 1), patch_size=2)
        >>> f_hat = None
        >>> schedule = [(1, 1, 1), (1, 2, 2), (1, 4, 4)]
        >>> for si, (_, h, w) in enumerate(schedule):
        ...     bits = torch.randint(0, 2, (1, 1, h, w, 8), dtype=torch.uint8)
        ...     codes = vae.bits_to_codes(bits)
        ...     f_hat = vae.add_scale_codes(f_hat, codes, schedule[-1], is_last_scale=si == len(schedule) - 1)
        >>> vae.decode(f_hat).shape
        torch.Size([1, 3, 8, 8])
        ```
    """

    _supports_gradient_checkpointing = False
    _no_split_modules = ["BSQResnetBlock"]
    # group offloading (models/group_offload.py): nothing is streamed; the codebook is read by the loop and the decoder's
    # up-blocks through their children, never their own ``forward``, so the whole tokenizer stays on the device for
    # the call (one group)
    _group_offload_streamed_modules = ()

    @register_to_config
    def __init__(
        self,
        codebook_dim: int = 32,
        base_ch: int = 128,
        encoder_ch_mult: Sequence[int] = (1, 2, 4, 4, 4),
        decoder_ch_mult: Sequence[int] = (1, 2, 4, 4, 4),
        num_res_blocks: int = 2,
        patch_size: int = 16,
        in_channels: int = 3,
        out_channels: int = 3,
        encoder_double_z: bool = False,
    ):
        super().__init__()
        # 1. Check the architecture numbers (the config JSON gives lists; tuples and lists are both accepted)
        encoder_ch_mult = tuple(int(m) for m in encoder_ch_mult)
        decoder_ch_mult = tuple(int(m) for m in decoder_ch_mult)
        for name, mults in (("encoder_ch_mult", encoder_ch_mult), ("decoder_ch_mult", decoder_ch_mult)):
            if len(mults) == 0 or min(mults) < 1:
                raise ValueError(f"{name} must be a non-empty list of positive integers, got {list(mults)}")
        for name, value in (
            ("codebook_dim", codebook_dim),
            ("base_ch", base_ch),
            ("num_res_blocks", num_res_blocks),
            ("in_channels", in_channels),
            ("out_channels", out_channels),
        ):
            if int(value) < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if int(patch_size) != patch_size or patch_size < 1 or int(patch_size) & (int(patch_size) - 1) != 0:
            raise ValueError(f"patch_size must be a power of 2, got {patch_size!r}")
        num_resamples = int(math.log2(patch_size))
        if num_resamples > len(decoder_ch_mult) - 1 or num_resamples > len(encoder_ch_mult):
            raise ValueError(
                f"patch_size={patch_size} needs log2(patch_size)={num_resamples} resampling levels: at least "
                f"{num_resamples + 1} decoder levels and {num_resamples} encoder levels, got decoder_ch_mult="
                f"{list(decoder_ch_mult)} and encoder_ch_mult={list(encoder_ch_mult)}"
            )

        # 2. Encoder (image -> continuous latent) and decoder (latent -> image)
        self.encoder = BSQEncoder(
            in_channels,
            base_ch,
            encoder_ch_mult,
            num_res_blocks,
            num_resamples,
            (2 if encoder_double_z else 1) * codebook_dim,
        )
        self.decoder = BSQDecoder(codebook_dim, base_ch, decoder_ch_mult, num_res_blocks, num_resamples, out_channels)

    def extra_repr(self) -> str:
        return f"codebook_dim={self.config.codebook_dim}, patch_size={self.config.patch_size}"

    # ------------------------------------------------------------------ encoder / decoder

    @apply_forward_hook
    def encode(self, image_B3HW: torch.Tensor) -> torch.Tensor:
        """Continuous (unquantised) latent of an image.

        Args:
            image_B3HW (`torch.Tensor`): images in [-1, 1], shape (B, in_channels, H, W). H and W should be multiples
                of ``patch_size``; otherwise the right/bottom padding of each downsample rounds the size up.

        Returns:
            `torch.Tensor`: ``z_Bdhw`` of shape (B, codebook_dim, ceil(H / patch_size), ceil(W / patch_size)). With
            ``encoder_double_z`` the encoder writes 2 * codebook_dim channels and the first codebook_dim (the mean of
            a diagonal-Gaussian posterior) are returned.
        """
        if image_B3HW.ndim != 4 or image_B3HW.shape[1] != self.config.in_channels:
            raise ValueError(
                f"encode expects images of shape (B, {self.config.in_channels}, H, W), got {tuple(image_B3HW.shape)}"
            )
        z_BChw = self.encoder(image_B3HW)
        return z_BChw[:, : self.config.codebook_dim]

    @apply_forward_hook
    def decode(self, z_Bdhw: torch.Tensor) -> torch.Tensor:
        """Image of a latent (for generation: the summed codes ``f_hat``), clamped to [-1, 1].

        Args:
            z_Bdhw (`torch.Tensor`): latent of shape (B, codebook_dim, h, w).

        Returns:
            `torch.Tensor`: ``image_B3HW`` of shape (B, out_channels, h * patch_size, w * patch_size), in [-1, 1]
            (channels-last in memory, like the official output).
        """
        if z_Bdhw.ndim != 4 or z_Bdhw.shape[1] != self.config.codebook_dim:
            raise ValueError(
                f"decode expects a latent of shape (B, {self.config.codebook_dim}, h, w), got {tuple(z_Bdhw.shape)}"
            )
        # The official loop hands the decoder a channels-last tensor (a permuted view). On CPU that oneDNN path is
        # inaccurate for some configurations (up to 1e-2 from float64, thread-count dependent); the contiguous path
        # stays within ~1e-5 of float64, so we decode a contiguous tensor (within FIXTURE.md's 1e-3 of the official).
        z_Bdhw = z_Bdhw.contiguous()
        return self._decode_sliced_tiled(lambda z: self.decoder(z).clamp(min=-1.0, max=1.0), z_Bdhw)

    def forward(self, z_Bdhw: torch.Tensor) -> torch.Tensor:
        """Same as [`~InfinityBSQVAE.decode`] (generation only needs the decoder)."""
        return self.decode(z_Bdhw)

    # ------------------------------------------------------------------ bits, codes and f_hat

    def bit_code_values(
        self, dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None
    ) -> torch.Tensor:
        """``(2,)``: the code of a bit 0 and of a bit 1 before the normalisation (``-1/sqrt(d)``, ``+1/sqrt(d)``), in
        ``dtype`` on ``device``, computed on the device by the same element-wise ops as :meth:`bits_to_codes` (so the
        same values). A caller that turns bits into codes at every scale of a call computes it once and passes it to
        :meth:`bits_to_codes`."""
        scale = 1.0 / math.sqrt(self.config.codebook_dim)
        return torch.arange(2, device=device).to(dtype) * (2.0 * scale) - scale

    def bits_to_codes(
        self, bits: torch.Tensor, dtype: torch.dtype = torch.float32, bit_code_values: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """BSQ codes of bits: bit 1 -> +1/sqrt(d), bit 0 -> -1/sqrt(d), then L2-normalised over d.

        The normalisation changes the codes only by rounding; it is kept because the official path does it.

        Args:
            bits (`torch.Tensor`): shape (B, 1, h, w, d) (the official layout) or (B, h, w, d); integer, bool or
                float values 0 / 1 (not checked, to avoid a device sync).
            dtype (`torch.dtype`, *optional*, defaults to `torch.float32`): dtype of the codes.
            bit_code_values (`torch.Tensor`, *optional*): :meth:`bit_code_values` for ``dtype``, kept by the caller.
                With contiguous int64 / int32 bits the un-normalised codes are then one lookup instead of a cast, a
                multiply and a subtraction (the same values); values other than 0 / 1 then raise an index
                error instead of giving meaningless codes.

        Returns:
            `torch.Tensor`: ``codes_Bdhw`` of shape (B, d, h, w).
        """
        d = self.config.codebook_dim
        if bits.ndim == 5:
            if bits.shape[1] != 1:
                raise ValueError(f"bits of shape (B, 1, h, w, d) must have a time size of 1, got {tuple(bits.shape)}")
            bits = bits.squeeze(1)
        if bits.ndim != 4 or bits.shape[-1] != d:
            raise ValueError(f"bits must have shape (B, 1, h, w, {d}) or (B, h, w, {d}), got {tuple(bits.shape)}")
        if bit_code_values is not None and bits.dtype in (torch.int64, torch.int32) and bits.is_contiguous():
            if bit_code_values.shape != (2,) or bit_code_values.dtype != dtype:
                raise ValueError(
                    f"bit_code_values must be bit_code_values({dtype}), shape (2,); got "
                    f"{tuple(bit_code_values.shape)} {bit_code_values.dtype}"
                )
            codes_Bhwd = bit_code_values[bits]  # contiguous, as the cast of contiguous bits: the same norm kernel
            # Every code is +-1/sqrt(d), so the norm is ~1 and F.normalize's clamp to >= 1e-12 never acts.
            return (codes_Bhwd / codes_Bhwd.norm(2, -1, keepdim=True)).permute(0, 3, 1, 2)
        scale = 1.0 / math.sqrt(d)
        codes_Bhwd = bits.to(dtype) * (2.0 * scale) - scale
        codes_Bhwd = F.normalize(codes_Bhwd, dim=-1)
        return codes_Bhwd.permute(0, 3, 1, 2)

    def add_scale_codes(
        self,
        f_hat_Bdhw: Optional[torch.Tensor],
        codes_Bdhw: torch.Tensor,
        final_hw: ScaleSize,
        is_last_scale: bool,
    ) -> torch.Tensor:
        """``f_hat`` after adding one scale's codes (the official ``summed_codes`` update); returns a new tensor.

        A scale other than the last is up-sampled to the final latent size with 5-D trilinear interpolation
        (``align_corners=False``, time size 1, i.e. bilinear without anti-aliasing); the last scale is added as is.

        Args:
            f_hat_Bdhw (`torch.Tensor` or `None`): the sum so far, shape (B, d, H, W); `None` before the first scale.
            codes_Bdhw (`torch.Tensor`): codes of this scale, shape (B, d, h, w), from [`~InfinityBSQVAE.bits_to_codes`].
            final_hw (`tuple[int]`): (H, W) or (1, H, W), the last scale of the schedule.
            is_last_scale (`bool`): whether this is the last scale (then (h, w) must equal (H, W)).

        Returns:
            `torch.Tensor`: the new ``f_hat_Bdhw``, shape (B, d, H, W).
        """
        H, W = _scale_hw(final_hw, "final_hw")
        if codes_Bdhw.ndim != 4 or codes_Bdhw.shape[1] != self.config.codebook_dim:
            raise ValueError(
                f"codes must have shape (B, {self.config.codebook_dim}, h, w), got {tuple(codes_Bdhw.shape)}"
            )
        if is_last_scale:
            if tuple(codes_Bdhw.shape[-2:]) != (H, W):
                raise ValueError(
                    f"the last scale's codes must have the final size {(H, W)}, got {tuple(codes_Bdhw.shape[-2:])}"
                )
            up_BdHW = codes_Bdhw
        else:
            up_BdHW = F.interpolate(codes_Bdhw.unsqueeze(2), size=(1, H, W), mode="trilinear").squeeze(2)
        if f_hat_Bdhw is None:
            return up_BdHW.clone() if up_BdHW is codes_Bdhw else up_BdHW
        if f_hat_Bdhw.shape != up_BdHW.shape:
            raise ValueError(f"f_hat has shape {tuple(f_hat_Bdhw.shape)}, expected {tuple(up_BdHW.shape)}")
        return f_hat_Bdhw + up_BdHW

    def next_scale_input(self, f_hat_Bdhw: torch.Tensor, hw: ScaleSize) -> torch.Tensor:
        """Transformer input of the next scale: ``f_hat`` down-sampled to (h, w), one row per token.

        5-D trilinear interpolation to (1, h, w) with ``align_corners=False`` (bilinear without anti-aliasing, not
        'area'), as the official loop does; 4-D bilinear agrees only to ~2e-7.

        Args:
            f_hat_Bdhw (`torch.Tensor`): summed codes so far, shape (B, d, H, W).
            hw (`tuple[int]`): (h, w) or (1, h, w) of the next scale.

        Returns:
            `torch.Tensor`: ``x_Bld`` of shape (B, h * w, d), tokens in row-major order (a transposed view).
        """
        h, w = _scale_hw(hw, "hw")
        if f_hat_Bdhw.ndim != 4 or f_hat_Bdhw.shape[1] != self.config.codebook_dim:
            raise ValueError(
                f"f_hat must have shape (B, {self.config.codebook_dim}, H, W), got {tuple(f_hat_Bdhw.shape)}"
            )
        x_Bd1hw = F.interpolate(f_hat_Bdhw.unsqueeze(2), size=(1, h, w), mode="trilinear")
        return x_Bd1hw.reshape(x_Bd1hw.shape[0], x_Bd1hw.shape[1], h * w).permute(0, 2, 1)

    @torch.no_grad()
    def quantize_multiscale(self, z_Bdhw: torch.Tensor, scale_schedule: Sequence[ScaleSize]) -> List[torch.Tensor]:
        """Multi-scale residual BSQ quantisation of a continuous latent (the encoder side of the official
        ``MultiScaleBSQ.forward``, ``z_interplote_down='area'``, ``z_interplote_up='trilinear'``).

        For each scale: the residual (initially ``z``) is area-down-sampled to (h, w) unless (h, w) is the full
        size; the bits are its signs (bit 1 where > 0; the official L2 normalisation before the sign does not change
        it); the scale's codes are up-sampled (5-D trilinear) to the full size unless already there, and subtracted
        from the residual. The official subtracts ``z + (zhat - z)`` (straight-through estimator) where we subtract
        the codes of [`~InfinityBSQVAE.bits_to_codes`]; the two agree up to rounding.

        Args:
            z_Bdhw (`torch.Tensor`): latent of shape (B, d, H, W), e.g. from [`~InfinityBSQVAE.encode`].
            scale_schedule (`list[tuple[int]]`): (h, w) or (1, h, w) of each scale, coarse to fine.

        Returns:
            `list[torch.Tensor]`: per scale, bits of shape (B, 1, h, w, d), dtype uint8.
        """
        if z_Bdhw.ndim != 4 or z_Bdhw.shape[1] != self.config.codebook_dim:
            raise ValueError(f"z must have shape (B, {self.config.codebook_dim}, H, W), got {tuple(z_Bdhw.shape)}")
        if len(scale_schedule) == 0:
            raise ValueError("scale_schedule must hold at least one scale")
        sizes = [_scale_hw(size, f"scale_schedule[{si}]") for si, size in enumerate(scale_schedule)]
        H, W = z_Bdhw.shape[-2:]
        residual_Bd1HW = z_Bdhw.float().unsqueeze(2)
        bits_list: List[torch.Tensor] = []
        for h, w in sizes:
            is_full = (h, w) == (H, W)
            if is_full:
                r_Bd1hw = residual_Bd1HW
            else:
                r_Bd1hw = F.interpolate(residual_Bd1HW, size=(1, h, w), mode="area")
            bits_B1hwd = (r_Bd1hw > 0).permute(0, 2, 3, 4, 1).to(torch.uint8)
            bits_list.append(bits_B1hwd)
            codes_Bd1hw = self.bits_to_codes(bits_B1hwd).unsqueeze(2)
            if not is_full:
                codes_Bd1hw = F.interpolate(codes_Bd1hw, size=(1, H, W), mode="trilinear")
            residual_Bd1HW = residual_Bd1HW - codes_Bd1hw
        return bits_list

    # ------------------------------------------------------------------ official checkpoints

    @classmethod
    def from_original_checkpoint(
        cls,
        path_or_state_dict: Union[str, os.PathLike, Mapping[str, torch.Tensor]],
        config: Optional[Dict[str, Any]] = None,
        torch_dtype: Optional[torch.dtype] = None,
    ) -> "InfinityBSQVAE":
        """Build the VAE from an official Infinity VAE checkpoint, strictly.

        A ``.safetensors`` file is read with ``safetensors.torch.load_file``; any other file with
        ``torch.load(map_location='cpu', weights_only=True)``, taking its ``'vae'`` entry when it has one (the
        layout of ``infinity_vae_d32reg.pth``). Both the official wrapped names (``*.conv.weight``,
        ``*.norm.weight``) and plain names are accepted; the quantiser's ``lfq.mask`` buffers are checked and dropped.
        Missing keys, unexpected keys and shape mismatches raise one `ValueError` listing all of them.

        Args:
            path_or_state_dict (`str`, `os.PathLike` or `dict`): checkpoint file, or an already loaded state dict
                (not modified).
            config (`dict`, *optional*): constructor arguments, e.g. [`INFINITY_VAE_D32_CONFIG`] or another model's
                ``config`` (keys starting with ``_`` are ignored); inferred from the tensor shapes when omitted.
            torch_dtype (`torch.dtype`, *optional*): dtype of the returned model; float32 when omitted.

        Returns:
            [`InfinityBSQVAE`]: the model, in eval mode.

        Examples:
            ```py
            >>> from diffusers_var_accel.models.autoencoder_bsq import INFINITY_VAE_D32_CONFIG, InfinityBSQVAE

            >>> vae = InfinityBSQVAE.from_original_checkpoint("weights/infinity_vae_d32reg.pth", INFINITY_VAE_D32_CONFIG)
            ```
        """
        state_dict = load_original_state_dict(path_or_state_dict, entry="vae")
        if config is None:
            config = infer_infinity_vae_config(state_dict)
        else:
            # Private entries ("_class_name", "_diffusers_version", ...) are config metadata, as in from_config.
            config = {k: v for k, v in config.items() if not k.startswith("_")}
            allowed = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
            unknown = sorted(set(config) - set(allowed))
            if unknown:
                raise ValueError(f"config has unknown keys {unknown}; allowed keys are {allowed}")
        codebook_dim = int(config.get("codebook_dim", 32))
        return build_and_load_strict(
            cls,
            config,
            state_dict,
            "Infinity BSQ VAE checkpoint",
            torch_dtype,
            convert=lambda sd, expected: convert_infinity_vae_checkpoint(sd, expected, codebook_dim=codebook_dim),
        )


def convert_infinity_vae_checkpoint(
    state_dict: Mapping[str, torch.Tensor],
    model_keys: Iterable[str],
    codebook_dim: Optional[int] = None,
) -> Dict[str, torch.Tensor]:
    """Rename an official Infinity VAE state dict to [`InfinityBSQVAE`] names; a new dict, the input is not modified.

    A key that is already a model key is kept. Otherwise the official wrapper level is removed
    (``X.conv.weight`` / ``X.norm.weight`` -> ``X.weight``, same for ``bias``) when that gives a model key. The
    quantiser buffers ``quantizer.lfq.mask`` / ``quantize.lfq.mask`` are dropped (with ``codebook_dim`` given, their
    shape must be (codebook_dim,)). Keys that match nothing are kept unchanged so that a strict load reports them.

    Args:
        state_dict (`dict[str, torch.Tensor]`): the official state dict (the ``'vae'`` entry of the ``.pth`` file).
        model_keys (`Iterable[str]`): the state-dict keys of the target model (a dict keyed by name also works).
        codebook_dim (`int`, *optional*): when given, the mask buffers must have shape (codebook_dim,).

    Returns:
        `dict[str, torch.Tensor]`: the renamed state dict (tensors are shared, not copied).
    """
    model_keys = set(model_keys)
    converted: Dict[str, torch.Tensor] = {}
    source_of: Dict[str, str] = {}
    for key, value in state_dict.items():
        if key in _ORIGINAL_MASK_KEYS:
            if codebook_dim is not None and tuple(value.shape) != (codebook_dim,):
                raise ValueError(
                    f"{key} has shape {tuple(value.shape)}, expected ({codebook_dim},) for codebook_dim={codebook_dim}"
                )
            continue
        new_key = key
        if key not in model_keys:
            plain = _WRAPPED_SUFFIX.sub(r".\2", key)
            if plain in model_keys:
                new_key = plain
        if new_key in converted:
            raise ValueError(f"checkpoint keys {source_of[new_key]!r} and {key!r} both map to {new_key!r}")
        converted[new_key] = value
        source_of[new_key] = key
    return converted


def infer_infinity_vae_config(state_dict: Mapping[str, torch.Tensor]) -> Dict[str, Any]:
    """[`InfinityBSQVAE`] constructor arguments read off an official (wrapped or plain) VAE state dict's shapes.

    ``codebook_dim`` comes from ``decoder.conv_in``, ``base_ch`` from the output channels of ``encoder.conv_in``,
    each side's channel multipliers from the width of its own levels' first ResBlocks (the decoder's may differ from
    the encoder's), ``num_res_blocks`` from the number of
    decoder blocks per level minus 1, ``patch_size`` from the number of decoder upsample levels and
    ``encoder_double_z`` from ``encoder.conv_out``.
    """

    def weight(name: str) -> torch.Tensor:
        for key in (f"{name}.weight", f"{name}.conv.weight"):
            if key in state_dict:
                return state_dict[key]
        raise ValueError(f"cannot infer the VAE config: the checkpoint has no {name}.weight (nor {name}.conv.weight)")

    def level_widths(prefix: str, base_ch: int) -> List[int]:
        levels = sorted({int(m.group(1)) for k in state_dict if (m := re.match(rf"{prefix}\.(\d+)\.block\.", k))})
        if levels != list(range(len(levels))) or not levels:
            raise ValueError(f"cannot infer the VAE config: {prefix} levels are {levels}, expected 0, 1, 2, ...")
        mults = []
        for i in levels:
            width = weight(f"{prefix}.{i}.block.0.conv1").shape[0]
            if width % base_ch != 0:
                raise ValueError(
                    f"cannot infer the VAE config: {prefix}.{i} has {width} channels, not a multiple of base_ch={base_ch}"
                )
            mults.append(width // base_ch)
        return mults

    conv_in = weight("decoder.conv_in")
    conv_out = weight("decoder.conv_out")
    # One base width (the official ``ch``) for both sides: the encoder's conv_in writes it. Each side's level widths
    # are read from that side's own tensors: the decoder's first level may be wider than the encoder's
    # (``decoder_ch_mult`` [2, 1, 1, 1, 1] against ``encoder_ch_mult`` [1, 1, 1, 1, 1]), so decoder.conv_out does not
    # give the base width.
    codebook_dim, base_ch = int(conv_in.shape[1]), int(weight("encoder.conv_in").shape[0])
    encoder_ch_mult = level_widths("encoder.down", base_ch)
    decoder_ch_mult = level_widths("decoder.up", base_ch)
    if int(conv_out.shape[1]) != base_ch * decoder_ch_mult[0]:
        raise ValueError(
            f"cannot infer the VAE config: decoder.conv_out reads {int(conv_out.shape[1])} channels, but decoder level 0 "
            f"writes {base_ch * decoder_ch_mult[0]}"
        )
    decoder_blocks = {int(m.group(1)) for k in state_dict if (m := re.match(r"decoder\.up\.0\.block\.(\d+)\.", k))}
    encoder_blocks = {int(m.group(1)) for k in state_dict if (m := re.match(r"encoder\.down\.0\.block\.(\d+)\.", k))}
    num_upsamples = len({m.group(1) for k in state_dict if (m := re.match(r"decoder\.up\.(\d+)\.upsample\.", k))})
    num_downsamples = len(
        {m.group(1) for k in state_dict if (m := re.match(r"encoder\.down\.(\d+)\.downsample\.", k))}
    )
    if len(encoder_blocks) != len(decoder_blocks) - 1 or num_downsamples != num_upsamples:
        raise ValueError(
            f"cannot infer the VAE config: the encoder has {len(encoder_blocks)} ResBlocks per level and "
            f"{num_downsamples} downsamples, the decoder {len(decoder_blocks)} (expected one more) and {num_upsamples} upsamples"
        )
    encoder_out = int(weight("encoder.conv_out").shape[0])
    if encoder_out not in (codebook_dim, 2 * codebook_dim):
        raise ValueError(
            f"cannot infer the VAE config: encoder.conv_out writes {encoder_out} channels, expected {codebook_dim} "
            f"or {2 * codebook_dim} (codebook_dim={codebook_dim})"
        )
    return {
        "codebook_dim": codebook_dim,
        "base_ch": base_ch,
        "encoder_ch_mult": encoder_ch_mult,
        "decoder_ch_mult": decoder_ch_mult,
        "num_res_blocks": len(decoder_blocks) - 1,
        "patch_size": 2**num_upsamples,
        "in_channels": int(weight("encoder.conv_in").shape[1]),
        "out_channels": int(conv_out.shape[0]),
        "encoder_double_z": encoder_out == 2 * codebook_dim,
    }
