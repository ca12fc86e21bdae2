"""The hybrid tokenizer of HART: a VAR-style multi-scale VQ autoencoder whose last scale is completed by a continuous
residual, and its f_hat bookkeeping for next-scale generation.

HART (https://arxiv.org/abs/2410.10812) generates an image as discrete tokens on a sequence of square scales (as VAR,
https://arxiv.org/abs/2404.02905) plus, at the last scale, a continuous residual sampled by a small diffusion MLP
(see ``diffusion_head_hart.py``). The decoder input ``f_hat`` (B, Cv, P, P) is the sum of

* for every scale but the last: the scale's codebook vectors, bicubically up-sampled to P x P and passed through one
  of four shared "Phi" convolutions (``Phi(h) = (1 - r) h + r conv3x3(h)``, r = ``quant_resi``);
* for the last scale: its codebook vectors plus the continuous residual, added as they are (no Phi, no interpolation).

As in VAR, the tokenizer owns that bookkeeping (``indices_to_codes``, ``add_scale_codes``, ``next_scale_input``), so
the next-scale loop never interpolates itself; ``f_hat`` lives in the caller.

The module tree mirrors the official ``HARTAutoEncoder`` (mit-han-lab/hart, ``hart/modules/models/autoencoder`` and
``hart/modules/networks/basic_vae.py``; itself VAR's VQVAE): our parameter names are the official checkpoint keys
without their ``vae.`` prefix. The official training-only buffer ``quantize.ema_vocab_hit_SV`` and the discriminator
``disc.*`` are dropped by the loader.

Shape-suffix legend: ``B`` batch, ``Cv`` latent channels (``z_channels``), ``C`` feature channels, ``h w`` the token map
of one scale, ``H W`` the final latent size (or, in ``image_B3HW``, the image size), ``L = h*w`` tokens of one scale,
``V`` codebook size.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.utils.accelerate_utils import apply_forward_hook
from torch import nn

from .checkpoint_utils import StrictLoadingMixin, build_and_load_strict, load_original_state_dict
from .vae_decoding import SlicedTiledDecodeMixin

__all__ = [
    "HARTHybridTokenizer",
    "hart_tokenizer_config_from_original",
    "hart_tokenizer_state_dict_from_original",
]

#: Prefix of the autoencoder's keys in the official ``HARTAutoEncoderWithDisc`` checkpoint.
_VAE_PREFIX = "vae."
#: Prefix of the (unused) PatchGAN discriminator's keys in that checkpoint.
_DISC_PREFIX = "disc."
#: Training-only codebook-usage statistics of the official quantiser; no inference path reads it.
_UNUSED_VAE_KEYS = ("quantize.ema_vocab_hit_SV",)

#: ``model_type`` values of the official tokenizer configs.
_ORIGINAL_MODEL_TYPES = ("hart_autoencoder_with_disc", "hart_autoencoder")

PatchNum = Union[int, Tuple[int, int], Sequence[int]]


def _hw(size: PatchNum, name: str) -> Tuple[int, int]:
    """``(h, w)`` of a scale given as an int (square) or a pair."""
    if isinstance(size, (int, np.integer)):
        size = (int(size), int(size))
    size = tuple(int(s) for s in size)
    if len(size) != 2 or size[0] < 1 or size[1] < 1:
        raise ValueError(f"{name} must be a positive int or a pair (h, w) of positive ints, got {size}")
    return size


def _group_norm(num_channels: int) -> nn.GroupNorm:
    """GroupNorm of the official ``Normalize``: always 32 groups, eps 1e-6, affine."""
    if num_channels % 32 != 0:
        raise ValueError(
            f"the HART tokenizer's GroupNorm uses 32 groups; {num_channels} channels are not divisible by 32"
        )
    return nn.GroupNorm(num_groups=32, num_channels=num_channels, eps=1e-6, affine=True)


# ---------------------------------------------------------------------------------------------------- conv network


class HARTResnetBlock(nn.Module):
    """GroupNorm -> SiLU -> 3x3 conv -> GroupNorm -> SiLU -> (dropout) -> 3x3 conv, plus the input (through a 1x1
    ``nin_shortcut`` when the channel count changes)."""

    def __init__(self, in_channels: int, out_channels: int, dropout: float = 0.0):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.norm1 = _group_norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=1, padding=1)
        self.norm2 = _group_norm(out_channels)
        # The official block builds nn.Dropout only above 1e-6; it has no weights and is inactive in eval mode.
        self.dropout = nn.Dropout(dropout) if dropout > 1e-6 else nn.Identity()
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, stride=1, padding=1)
        if in_channels != out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=1, padding=0)

    def forward(self, x_BChw: torch.Tensor) -> torch.Tensor:
        h_BChw = self.conv1(F.silu(self.norm1(x_BChw)))
        h_BChw = self.conv2(self.dropout(F.silu(self.norm2(h_BChw))))
        if self.in_channels != self.out_channels:
            x_BChw = self.nin_shortcut(x_BChw)
        return x_BChw + h_BChw


class HARTAttnBlock(nn.Module):
    """Single-head self-attention over all h*w positions: GroupNorm, a 1x1 conv to q|k|v, softmax(q k^T / sqrt(C)),
    a 1x1 ``proj_out``, residual."""

    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels
        self.norm = _group_norm(channels)
        self.qkv = nn.Conv2d(channels, 3 * channels, kernel_size=1, stride=1, padding=0)
        self.proj_out = nn.Conv2d(channels, channels, kernel_size=1, stride=1, padding=0)

    def forward(self, x_BChw: torch.Tensor) -> torch.Tensor:
        B, C, h, w = x_BChw.shape
        # The 3C output channels are [q | k | v], each C wide.
        q_BCl, k_BCl, v_BCl = self.qkv(self.norm(x_BChw)).reshape(B, 3, C, h * w).unbind(1)
        # Scores are scaled after the matmul, as the official block does, then normalised over the keys.
        scores_Bll = torch.bmm(q_BCl.transpose(1, 2), k_BCl) * (C**-0.5)
        weights_Bll = torch.softmax(scores_Bll, dim=2)
        out_BCl = torch.bmm(v_BCl, weights_Bll.transpose(1, 2))
        return x_BChw + self.proj_out(out_BCl.reshape(B, C, h, w))


# Copied from diffusers_var_accel.models.autoencoder_bsq.BSQDownsample with BSQ->HART
class HARTDownsample(nn.Module):
    """Halves h and w: zero-pad one row at the bottom and one column at the right, then a 3x3 stride-2 conv."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, stride=2, padding=0)

    def forward(self, x_BChw: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x_BChw, (0, 1, 0, 1), mode="constant", value=0.0))


# Copied from diffusers_var_accel.models.autoencoder_bsq.BSQUpsample with BSQ->HART
class HARTUpsample(nn.Module):
    """Doubles h and w: nearest-neighbour x2, then a 3x3 conv."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, stride=1, padding=1)

    def forward(self, x_BChw: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x_BChw, scale_factor=2.0, mode="nearest"))


class HARTEncoder(nn.Module):
    """Image -> latent: ``conv_in``; per level ``down.{i}``: ``num_res_blocks`` ResBlocks (each followed by an
    attention block at the coarsest level only), then a downsample except at the coarsest level; ``mid.block_1``,
    ``mid.attn_1``, ``mid.block_2``; ``norm_out``, SiLU, ``conv_out``."""

    def __init__(
        self, in_channels: int, ch: int, ch_mult: Tuple[int, ...], num_res_blocks: int, dropout: float, z_channels: int
    ):
        super().__init__()
        self.conv_in = nn.Conv2d(in_channels, ch, kernel_size=3, stride=1, padding=1)
        self.down = nn.ModuleList()
        block_in = ch
        last = len(ch_mult) - 1
        for i_level, mult in enumerate(ch_mult):
            level = nn.Module()
            level.block = nn.ModuleList()
            level.attn = nn.ModuleList()
            block_out = ch * mult
            for _ in range(num_res_blocks):
                level.block.append(HARTResnetBlock(block_in, block_out, dropout))
                block_in = block_out
                if i_level == last:
                    level.attn.append(HARTAttnBlock(block_in))
            if i_level != last:
                level.downsample = HARTDownsample(block_in)
            self.down.append(level)
        self.mid = nn.Module()
        self.mid.block_1 = HARTResnetBlock(block_in, block_in, dropout)
        self.mid.attn_1 = HARTAttnBlock(block_in)
        self.mid.block_2 = HARTResnetBlock(block_in, block_in, dropout)
        self.norm_out = _group_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, z_channels, kernel_size=3, stride=1, padding=1)

    def forward(self, image_B3HW: torch.Tensor) -> torch.Tensor:
        h_BChw = self.conv_in(image_B3HW)
        for level in self.down:
            for j, block in enumerate(level.block):
                h_BChw = block(h_BChw)
                if len(level.attn) > 0:
                    h_BChw = level.attn[j](h_BChw)
            if hasattr(level, "downsample"):
                h_BChw = level.downsample(h_BChw)
        h_BChw = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h_BChw)))
        return self.conv_out(F.silu(self.norm_out(h_BChw)))


class HARTDecoder(nn.Module):
    """Latent -> image: ``conv_in``; ``mid.block_1``, ``mid.attn_1``, ``mid.block_2``; levels ``up.{i}`` from the
    coarsest to the finest: ``num_res_blocks + 1`` ResBlocks (each followed by an attention block at the coarsest level
    only), then a nearest-x2 upsample + conv except at level 0; ``norm_out``, SiLU, ``conv_out``."""

    def __init__(
        self,
        z_channels: int,
        ch: int,
        ch_mult: Tuple[int, ...],
        num_res_blocks: int,
        dropout: float,
        out_channels: int,
    ):
        super().__init__()
        last = len(ch_mult) - 1
        block_in = ch * ch_mult[last]
        self.conv_in = nn.Conv2d(z_channels, block_in, kernel_size=3, stride=1, padding=1)
        self.mid = nn.Module()
        self.mid.block_1 = HARTResnetBlock(block_in, block_in, dropout)
        self.mid.attn_1 = HARTAttnBlock(block_in)
        self.mid.block_2 = HARTResnetBlock(block_in, block_in, dropout)
        levels: List[nn.Module] = []
        for i_level in reversed(range(len(ch_mult))):
            level = nn.Module()
            level.block = nn.ModuleList()
            level.attn = nn.ModuleList()
            block_out = ch * ch_mult[i_level]
            for _ in range(num_res_blocks + 1):
                level.block.append(HARTResnetBlock(block_in, block_out, dropout))
                block_in = block_out
                if i_level == last:
                    level.attn.append(HARTAttnBlock(block_in))
            if i_level != 0:
                level.upsample = HARTUpsample(block_in)
            levels.insert(0, level)
        self.up = nn.ModuleList(levels)  # index = level (0 = finest), as in the official tree
        self.norm_out = _group_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, out_channels, kernel_size=3, stride=1, padding=1)

    def forward(self, z_BCvhw: torch.Tensor) -> torch.Tensor:
        h_BChw = self.mid.block_2(self.mid.attn_1(self.mid.block_1(self.conv_in(z_BCvhw))))
        for level in reversed(self.up):
            for j, block in enumerate(level.block):
                h_BChw = block(h_BChw)
                if len(level.attn) > 0:
                    h_BChw = level.attn[j](h_BChw)
            if hasattr(level, "upsample"):
                h_BChw = level.upsample(h_BChw)
        return self.conv_out(F.silu(self.norm_out(h_BChw)))


# ---------------------------------------------------------------------------------------------------- quantiser


class HARTPhi(nn.Conv2d):
    """One shared "Phi" refinement: ``(1 - r) * h + r * conv3x3(h)`` with ``r = |quant_resi|``."""

    def __init__(self, channels: int, ratio: float):
        super().__init__(channels, channels, kernel_size=3, stride=1, padding=1)
        self.ratio = abs(float(ratio))

    def forward(self, h_BCvHW: torch.Tensor) -> torch.Tensor:
        # Same operation order as the official Phi: h * (1 - r) + conv(h) * r.
        return h_BCvHW.mul(1.0 - self.ratio) + super().forward(h_BCvHW).mul(self.ratio)


class HARTPhiSet(nn.Module):
    """The K partially shared Phi convolutions (``qresi_ls``) and the rule picking one for a scale."""

    def __init__(self, channels: int, ratio: float, count: int):
        super().__init__()
        self.qresi_ls = nn.ModuleList([HARTPhi(channels, ratio) for _ in range(count)])
        # Each Phi owns a "tick" on [0, 1]; a scale uses the Phi whose tick is nearest to its position si / (SN - 1).
        # The expressions (and numpy's linspace) are those of the official code, so ties break the same way.
        if count == 4:
            self.ticks = np.linspace(1 / 3 / count, 1 - 1 / 3 / count, count)
        else:
            self.ticks = np.linspace(1 / 2 / count, 1 - 1 / 2 / count, count)

    def index_for(self, position: float) -> int:
        """Index of the Phi used at ``position`` in [0, 1] (first index on ties, as ``np.argmin``)."""
        return int(np.argmin(np.abs(self.ticks - position)).item())

    def extra_repr(self) -> str:
        return f"ticks={self.ticks.tolist()}"


class HARTQuantizer(nn.Module):
    """Weight container of the official quantiser: ``embedding`` (the V x Cv codebook) and ``quant_resi`` (Phi)."""

    def __init__(self, vocab_size: int, z_channels: int, quant_resi: float, share_quant_resi: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, z_channels)
        self.quant_resi = HARTPhiSet(z_channels, quant_resi, share_quant_resi)


# ---------------------------------------------------------------------------------------------------- model


class HARTHybridTokenizer(StrictLoadingMixin, ModelMixin, ConfigMixin, SlicedTiledDecodeMixin):
    r"""The hybrid tokenizer of HART (https://arxiv.org/abs/2410.10812): conv encoder / decoder, a multi-scale VQ
    codebook with shared Phi convolutions, and the ``f_hat`` helpers of next-scale generation.

    Generation needs [`~HARTHybridTokenizer.indices_to_codes`], [`~HARTHybridTokenizer.add_scale_codes`],
    [`~HARTHybridTokenizer.next_scale_input`] and [`~HARTHybridTokenizer.decode`]. The encoder and
    [`~HARTHybridTokenizer.encode_to_indices`] turn an image into tokens (plus the continuous residual).

    The constructor arguments are the official ``HARTAutoEncoderConfig`` fields that matter (same names);
    [`hart_tokenizer_config_from_original`] maps an official ``config.json``.

    Args:
        vocab_size (`int`, *optional*, defaults to 4096): codebook size V.
        z_channels (`int`, *optional*, defaults to 32): latent channels Cv.
        ch (`int`, *optional*, defaults to 160): channels of the finest encoder / decoder level.
        ch_mult (`tuple[int]`, *optional*, defaults to `(1, 1, 2, 2, 4)`): channel multiplier per level; the
            latent is ``2 ** (len(ch_mult) - 1)`` times smaller than the image.
        num_res_blocks (`int`, *optional*, defaults to 2): ResBlocks per encoder level (decoder: one more). The
            official code hard-codes 2.
        dropout (`float`, *optional*, defaults to 0.0): ResBlock dropout (inactive in eval mode).
        beta (`float`, *optional*, defaults to 0.25): commitment-loss weight (training only; kept for the record).
        using_znorm (`bool`, *optional*, defaults to `False`): nearest-code search by cosine similarity instead of
            L2 distance (only [`~HARTHybridTokenizer.encode_to_indices`] reads it).
        quant_resi (`float`, *optional*, defaults to 0.5): Phi mixing ratio r.
        share_quant_resi (`int`, *optional*, defaults to 4): number K >= 2 of partially shared Phi convolutions.
        v_patch_nums (`tuple[int]`, *optional*, defaults to `(1, 2, 3, 4, 5, 6, 8, 10, 13, 16)`): default scales of
            [`~HARTHybridTokenizer.encode_to_indices`] (generation passes the transformer's own scales).
        quant_conv_ks (`int`, *optional*, defaults to 3): kernel size of ``quant_conv`` / ``post_quant_conv``.
        in_channels (`int`, *optional*, defaults to 3): image channels (read and written).

    Examples:
        ```py
        >>> import torch
        >>> from diffusers_var_accel.models.autoencoder_hart import HARTHybridTokenizer

        >>> tok = HARTHybridTokenizer(vocab_size=64, z_channels=8, ch=32, ch_mult=(1, 1))
        >>> patch_nums, f_hat = (1, 2, 4), None
        >>> for si, pn in enumerate(patch_nums):
        ...     codes = tok.indices_to_codes(torch.randint(0, 64, (1, pn * pn)), pn, pn)
        ...     f_hat = tok.add_scale_codes(f_hat, codes, si, len(patch_nums), (4, 4))
        >>> tok.decode(f_hat).shape
        torch.Size([1, 3, 8, 8])
        ```
    """

    _supports_gradient_checkpointing = False
    _no_split_modules = ["HARTResnetBlock", "HARTAttnBlock"]
    # group offloading (models/group_offload.py): nothing is streamed; the codebook is read by the loop and the decoder's
    # up-blocks through their children, never their own ``forward``, so the whole tokenizer stays on the device for
    # the call (one group)
    _group_offload_streamed_modules = ()

    @register_to_config
    def __init__(
        self,
        vocab_size: int = 4096,
        z_channels: int = 32,
        ch: int = 160,
        ch_mult: Sequence[int] = (1, 1, 2, 2, 4),
        num_res_blocks: int = 2,
        dropout: float = 0.0,
        beta: float = 0.25,
        using_znorm: bool = False,
        quant_resi: float = 0.5,
        share_quant_resi: int = 4,
        v_patch_nums: Sequence[int] = (1, 2, 3, 4, 5, 6, 8, 10, 13, 16),
        quant_conv_ks: int = 3,
        in_channels: int = 3,
    ):
        super().__init__()
        # 1. Check the architecture numbers (config JSON gives lists; tuples and lists are both accepted)
        ch_mult = tuple(int(m) for m in ch_mult)
        if len(ch_mult) == 0 or min(ch_mult) < 1:
            raise ValueError(f"ch_mult must be a non-empty list of positive integers, got {list(ch_mult)}")
        for name, value in (
            ("vocab_size", vocab_size),
            ("z_channels", z_channels),
            ("ch", ch),
            ("num_res_blocks", num_res_blocks),
            ("in_channels", in_channels),
        ):
            if int(value) < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if int(quant_conv_ks) < 1 or int(quant_conv_ks) % 2 == 0:
            raise ValueError(f"quant_conv_ks must be a positive odd integer, got {quant_conv_ks!r}")
        if int(share_quant_resi) < 2:
            raise ValueError(
                f"share_quant_resi={share_quant_resi} selects a non-shared (0) or fully shared (1) Phi with a different "
                "checkpoint layout; only partially shared Phi (share_quant_resi >= 2, HART uses 4) is supported"
            )
        if abs(float(quant_resi)) <= 1e-6:
            raise ValueError(f"quant_resi={quant_resi} makes Phi an identity without weights; this is not supported")

        # 2. Conv network (image <-> latent), the 1x1-ish convs around the quantiser, and the quantiser weights
        self.encoder = HARTEncoder(in_channels, ch, ch_mult, num_res_blocks, dropout, z_channels)
        self.quant_conv = nn.Conv2d(z_channels, z_channels, quant_conv_ks, stride=1, padding=quant_conv_ks // 2)
        self.quantize = HARTQuantizer(vocab_size, z_channels, quant_resi, share_quant_resi)
        self.post_quant_conv = nn.Conv2d(z_channels, z_channels, quant_conv_ks, stride=1, padding=quant_conv_ks // 2)
        self.decoder = HARTDecoder(z_channels, ch, ch_mult, num_res_blocks, dropout, in_channels)

    def extra_repr(self) -> str:
        return f"vocab_size={self.config.vocab_size}, z_channels={self.config.z_channels}"

    @property
    def downsample_factor(self) -> int:
        """Image pixels per latent position along each axis."""
        return 2 ** (len(self.config.ch_mult) - 1)

    # ------------------------------------------------------------------ codes and f_hat (generation)

    def indices_to_codes(self, indices_BL: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Codebook vectors of one scale's tokens as a map.

        Args:
            indices_BL (`torch.Tensor`): token ids, shape (B, height * width), row-major (token ``r * width + c`` is
                at row r, column c).
            height (`int`), width (`int`): the scale's map size.

        Returns:
            `torch.Tensor`: ``codes_BCvhw`` of shape (B, Cv, height, width), in the codebook's dtype.
        """
        if indices_BL.ndim != 2 or indices_BL.shape[1] != height * width:
            raise ValueError(
                f"indices must have shape (B, {height * width}) for a {height}x{width} scale, "
                f"got {tuple(indices_BL.shape)}"
            )
        codes_BLCv = self.quantize.embedding(indices_BL)
        return codes_BLCv.transpose(1, 2).reshape(indices_BL.shape[0], self.config.z_channels, height, width)

    def phi_index(self, scale_index: int, num_scales: int) -> int:
        """Index of the shared Phi convolution used by scale ``scale_index`` of ``num_scales``.

        The scale's position ``si / (SN - 1)`` picks the nearest tick of ``linspace(1/12, 11/12, 4)`` (for K = 4;
        for SN = 14: si 0-2 -> 0, 3-6 -> 1, 7-10 -> 2, 11-13 -> 3). With a single scale (SN = 1) the official
        division is undefined; we use position 0 (that scale is the last one, which takes no Phi anyway).
        """
        if not 0 <= scale_index < num_scales:
            raise ValueError(f"scale_index must be in [0, {num_scales}), got {scale_index}")
        position = scale_index / (num_scales - 1) if num_scales > 1 else 0.0
        return self.quantize.quant_resi.index_for(position)

    def apply_phi(self, h_BCvHW: torch.Tensor, scale_index: int, num_scales: int) -> torch.Tensor:
        """``Phi_k(h)`` with k = [`~HARTHybridTokenizer.phi_index`] of the scale."""
        return self.quantize.quant_resi.qresi_ls[self.phi_index(scale_index, num_scales)](h_BCvHW)

    def add_scale_codes(
        self,
        f_hat_BCvHW: Optional[torch.Tensor],
        codes_BCvhw: torch.Tensor,
        scale_index: int,
        num_scales: int,
        final_hw: PatchNum,
    ) -> torch.Tensor:
        """``f_hat`` after adding one scale's codes (the official ``get_next_autoregressive_input`` update).

        A scale before the last is up-sampled to the final size (bicubic, ``align_corners=False``) and refined by its
        Phi; the last scale (``scale_index == num_scales - 1``; pass its codes plus the diffusion residual) is added as
        is. Returns a new tensor; the caller's ``f_hat`` is not modified.

        Args:
            f_hat_BCvHW (`torch.Tensor` or `None`): the sum so far (B, Cv, H, W); `None` before the first scale
                (then zeros of the codes' dtype).
            codes_BCvhw (`torch.Tensor`): this scale's codes (B, Cv, h, w), e.g. from
                [`~HARTHybridTokenizer.indices_to_codes`]; at the last scale (B, Cv, H, W).
            scale_index (`int`), num_scales (`int`): position of the scale in the schedule.
            final_hw (`int` or `tuple[int, int]`): (H, W), the last scale's size.

        Returns:
            `torch.Tensor`: the new ``f_hat_BCvHW``.
        """
        H, W = _hw(final_hw, "final_hw")
        Cv = self.config.z_channels
        if codes_BCvhw.ndim != 4 or codes_BCvhw.shape[1] != Cv:
            raise ValueError(f"codes must have shape (B, {Cv}, h, w), got {tuple(codes_BCvhw.shape)}")
        if not 0 <= scale_index < num_scales:
            raise ValueError(f"scale_index must be in [0, {num_scales}), got {scale_index}")
        if f_hat_BCvHW is None:
            f_hat_BCvHW = codes_BCvhw.new_zeros(codes_BCvhw.shape[0], Cv, H, W)
        elif tuple(f_hat_BCvHW.shape) != (codes_BCvhw.shape[0], Cv, H, W):
            raise ValueError(
                f"f_hat has shape {tuple(f_hat_BCvHW.shape)}, expected {(codes_BCvhw.shape[0], Cv, H, W)}"
            )
        if scale_index == num_scales - 1:
            if tuple(codes_BCvhw.shape[-2:]) != (H, W):
                raise ValueError(
                    f"the last scale's codes must have the final size {(H, W)}, got {tuple(codes_BCvhw.shape[-2:])}"
                )
            return f_hat_BCvHW + codes_BCvhw
        up_BCvHW = F.interpolate(codes_BCvhw, size=(H, W), mode="bicubic", align_corners=False)
        return f_hat_BCvHW + self.apply_phi(up_BCvHW, scale_index, num_scales)

    def next_scale_input(self, f_hat_BCvHW: torch.Tensor, hw: PatchNum) -> torch.Tensor:
        """Transformer input of the next scale: ``f_hat`` area-down-sampled to (h, w), one row per token.

        Args:
            f_hat_BCvHW (`torch.Tensor`): summed codes so far, (B, Cv, H, W).
            hw (`int` or `tuple[int, int]`): the next scale's size.

        Returns:
            `torch.Tensor`: ``x_BLCv`` of shape (B, h * w, Cv), row-major tokens (a transposed view).
        """
        h, w = _hw(hw, "hw")
        if f_hat_BCvHW.ndim != 4 or f_hat_BCvHW.shape[1] != self.config.z_channels:
            raise ValueError(
                f"f_hat must have shape (B, {self.config.z_channels}, H, W), got {tuple(f_hat_BCvHW.shape)}"
            )
        down_BCvhw = F.interpolate(f_hat_BCvHW, size=(h, w), mode="area")
        return down_BCvhw.reshape(down_BCvhw.shape[0], down_BCvhw.shape[1], h * w).transpose(1, 2)

    # ------------------------------------------------------------------ decoder / encoder

    @apply_forward_hook
    def decode(self, f_hat_BCvHW: torch.Tensor) -> torch.Tensor:
        """Image of a latent, ``clamp(decoder(post_quant_conv(f_hat)), -1, 1)`` (map to [0, 1] with ``* 0.5 + 0.5``).

        Args:
            f_hat_BCvHW (`torch.Tensor`): latent (B, Cv, H, W).

        Returns:
            `torch.Tensor`: ``image_B3HW`` of shape (B, in_channels, H * f, W * f) in [-1, 1], f =
            [`~HARTHybridTokenizer.downsample_factor`].
        """
        if f_hat_BCvHW.ndim != 4 or f_hat_BCvHW.shape[1] != self.config.z_channels:
            raise ValueError(
                f"decode expects a latent of shape (B, {self.config.z_channels}, H, W), got {tuple(f_hat_BCvHW.shape)}"
            )
        return self._decode_sliced_tiled(
            lambda f: self.decoder(self.post_quant_conv(f)).clamp(min=-1.0, max=1.0), f_hat_BCvHW.contiguous()
        )

    def forward(self, f_hat_BCvHW: torch.Tensor) -> torch.Tensor:
        """Same as [`~HARTHybridTokenizer.decode`] (generation only needs the decoder)."""
        return self.decode(f_hat_BCvHW)

    @apply_forward_hook
    def encode(self, image_B3HW: torch.Tensor) -> torch.Tensor:
        """Continuous latent ``quant_conv(encoder(image))`` of images in [-1, 1], shape (B, Cv, H / f, W / f)."""
        if image_B3HW.ndim != 4 or image_B3HW.shape[1] != self.config.in_channels:
            raise ValueError(
                f"encode expects images of shape (B, {self.config.in_channels}, H, W), got {tuple(image_B3HW.shape)}"
            )
        return self.quant_conv(self.encoder(image_B3HW))

    @torch.no_grad()
    def quantize_latent(
        self,
        f_BCvHW: torch.Tensor,
        patch_nums: Optional[Sequence[PatchNum]] = None,
        return_residual: bool = False,
    ) -> Union[List[torch.Tensor], Tuple[List[torch.Tensor], torch.Tensor]]:
        """Hybrid multi-scale residual quantisation of a latent (the official ``f_to_idxBl_and_frest``).

        For each scale: the remaining residual (initially ``f``) is area-down-sampled to the scale (the last scale,
        at full size, is taken as is), each position takes its nearest codebook vector (L2; cosine with
        ``using_znorm``), and the scale's contribution -- exactly what
        [`~HARTHybridTokenizer.add_scale_codes`] adds -- is subtracted from the residual. So
        ``f == f_hat(indices) + residual`` up to rounding.

        Args:
            f_BCvHW (`torch.Tensor`): latent (B, Cv, H, W), e.g. from [`~HARTHybridTokenizer.encode`].
            patch_nums (`list`, *optional*): scales (int or (h, w)), coarse to fine; the last must be (H, W).
                Defaults to ``config.v_patch_nums``.
            return_residual (`bool`, *optional*, defaults to `False`): also return the continuous residual left after
                the last discrete scale (the diffusion head's target, before its 1 / 0.6 training scale).

        Returns:
            `list[torch.Tensor]` of per-scale indices (B, h * w) int64, and with ``return_residual`` the residual
            (B, Cv, H, W) as a second element.
        """
        Cv = self.config.z_channels
        if f_BCvHW.ndim != 4 or f_BCvHW.shape[1] != Cv:
            raise ValueError(f"the latent must have shape (B, {Cv}, H, W), got {tuple(f_BCvHW.shape)}")
        sizes = [_hw(pn, f"patch_nums[{i}]") for i, pn in enumerate(patch_nums or self.config.v_patch_nums)]
        if not sizes:
            raise ValueError("patch_nums must hold at least one scale")
        B, _, H, W = f_BCvHW.shape
        if sizes[-1] != (H, W):
            raise ValueError(f"the last scale {sizes[-1]} must equal the latent size {(H, W)}")
        codebook_VCv = self.quantize.embedding.weight
        rest_BCvHW = f_BCvHW.clone()
        indices: List[torch.Tensor] = []
        num_scales = len(sizes)
        for si, (h, w) in enumerate(sizes):
            last = si == num_scales - 1
            z_BCvhw = rest_BCvHW if last else F.interpolate(rest_BCvHW, size=(h, w), mode="area")
            z_NCv = z_BCvhw.permute(0, 2, 3, 1).reshape(-1, Cv)
            if self.config.using_znorm:
                idx_N = torch.argmax(F.normalize(z_NCv, dim=-1) @ F.normalize(codebook_VCv, dim=-1).T, dim=1)
            else:
                # |z|^2 + |e|^2 - 2 z.e with one fused addmm, the official expansion (so near-ties break alike).
                dist_NV = torch.addmm(
                    z_NCv.square().sum(dim=1, keepdim=True) + codebook_VCv.square().sum(dim=1),
                    z_NCv,
                    codebook_VCv.T,
                    beta=1,
                    alpha=-2,
                )
                idx_N = torch.argmin(dist_NV, dim=1)
            idx_BL = idx_N.reshape(B, h * w)
            indices.append(idx_BL)
            contribution = self.add_scale_codes(None, self.indices_to_codes(idx_BL, h, w), si, num_scales, (H, W))
            rest_BCvHW = rest_BCvHW - contribution
        if return_residual:
            return indices, rest_BCvHW
        return indices

    @torch.no_grad()
    def encode_to_indices(
        self,
        image_B3HW: torch.Tensor,
        patch_nums: Optional[Sequence[PatchNum]] = None,
        return_residual: bool = False,
    ) -> Union[List[torch.Tensor], Tuple[List[torch.Tensor], torch.Tensor]]:
        """Tokens of images in [-1, 1]: [`~HARTHybridTokenizer.quantize_latent`] of
        [`~HARTHybridTokenizer.encode`] (see there for ``patch_nums`` and ``return_residual``)."""
        return self.quantize_latent(self.encode(image_B3HW), patch_nums, return_residual)

    # ------------------------------------------------------------------ official checkpoints

    @classmethod
    def from_original_state_dict(
        cls,
        state_dict: Union[str, os.PathLike, Mapping[str, torch.Tensor]],
        original_config: Mapping[str, Any],
        torch_dtype: Optional[torch.dtype] = None,
    ) -> "HARTHybridTokenizer":
        """Build the tokenizer from an official state dict (or weights file) and official config, strictly.

        See [`hart_tokenizer_state_dict_from_original`] for the key handling; any other missing, unexpected or
        mis-shaped key raises one `ValueError` listing all of them.

        Args:
            state_dict (`dict` or path): official ``HARTAutoEncoderWithDisc`` weights (``vae.*`` keys; ``disc.*``
                allowed), or an un-prefixed ``HARTAutoEncoder`` state dict when ``original_config['model_type']`` is
                ``"hart_autoencoder"``. Not modified.
            original_config (`dict`): the official ``config.json`` contents.
            torch_dtype (`torch.dtype`, *optional*): dtype of the returned model; float32 when omitted.
        """
        config = hart_tokenizer_config_from_original(original_config)
        prefixed = original_config.get("model_type", "hart_autoencoder_with_disc") != "hart_autoencoder"
        weights = hart_tokenizer_state_dict_from_original(
            load_original_state_dict(state_dict if isinstance(state_dict, (str, os.PathLike)) else dict(state_dict)),
            prefixed=prefixed,
        )
        return build_and_load_strict(cls, config, weights, "HART tokenizer checkpoint", torch_dtype)

    @classmethod
    def from_original_folder(
        cls, tokenizer_dir: Union[str, os.PathLike], torch_dtype: Optional[torch.dtype] = None
    ) -> "HARTHybridTokenizer":
        """Build the tokenizer from the official ``tokenizer/`` folder (``config.json`` + ``model.safetensors``, or
        ``pytorch_model.bin`` read with ``weights_only=True``, or their sharded ``*.index.json`` forms), strictly.

        Raises `ValueError` for an unsupported official config (quantizer type other than ``"var_hybrid"``,
        ``double_decoder``, non-shared Phi, ...) and for any key mismatch (all listed at once).

        Examples:
            ```py
            >>> from diffusers_var_accel.models.autoencoder_hart import HARTHybridTokenizer

            >>> tok = HARTHybridTokenizer.from_original_folder("hart-0.7b-1024px/tokenizer")
            ```
        """
        folder = os.fspath(tokenizer_dir)
        config_path = os.path.join(folder, "config.json")
        if not os.path.isfile(config_path):
            raise FileNotFoundError(f"no config.json in the HART tokenizer folder {folder}")
        with open(config_path, encoding="utf-8") as f:
            original_config = json.load(f)
        return cls.from_original_state_dict(_read_weights_folder(folder), original_config, torch_dtype)


def _read_weights_folder(folder: str) -> Dict[str, torch.Tensor]:
    """All tensors of an HF model folder: a single safetensors / pickle file or its sharded index form."""
    for single, index in (
        ("model.safetensors", "model.safetensors.index.json"),
        ("pytorch_model.bin", "pytorch_model.bin.index.json"),
    ):
        if os.path.isfile(os.path.join(folder, single)):
            return load_original_state_dict(os.path.join(folder, single))
        if os.path.isfile(os.path.join(folder, index)):
            with open(os.path.join(folder, index), encoding="utf-8") as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            state_dict: Dict[str, torch.Tensor] = {}
            for shard in shards:
                part = load_original_state_dict(os.path.join(folder, shard))
                clash = sorted(set(part) & set(state_dict))
                if clash:
                    raise ValueError(f"shard {shard} repeats keys {clash[:10]}")
                state_dict.update(part)
            return state_dict
    raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin (nor a sharded index) in {folder}")


def hart_tokenizer_state_dict_from_original(
    state_dict: Mapping[str, torch.Tensor], prefixed: bool = True
) -> Dict[str, torch.Tensor]:
    """[`HARTHybridTokenizer`] weights from an official tokenizer state dict (a new dict; tensors shared).

    With ``prefixed`` (the ``HARTAutoEncoderWithDisc`` layout): ``vae.X`` becomes ``X``, ``disc.*`` (the unused
    discriminator) is dropped, and any other key is kept unchanged so that the strict load reports it. Then the unused
    training statistics ``quantize.ema_vocab_hit_SV`` are dropped. Nothing else is renamed.
    """
    weights: Dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if prefixed:
            if key.startswith(_DISC_PREFIX):
                continue
            if key.startswith(_VAE_PREFIX):
                key = key[len(_VAE_PREFIX) :]
            else:
                # Mark a key outside the autoencoder so that it cannot be mistaken for one of ours.
                key = f"<outside vae.>{key}"
        if key in _UNUSED_VAE_KEYS:
            continue
        weights[key] = value
    return weights


def hart_tokenizer_config_from_original(cfg_dict: Mapping[str, Any]) -> Dict[str, Any]:
    """[`HARTHybridTokenizer`] constructor arguments from an official ``HARTAutoEncoder(WithDisc)Config`` dict.

    Missing fields take the official defaults. Raises `ValueError` for settings this port does not implement:
    ``quantizer_type`` other than ``"var_hybrid"``, ``double_decoder=True``, ``share_quant_resi`` below 2,
    ``quant_resi`` of 0, or an unknown ``model_type``.
    """
    model_type = cfg_dict.get("model_type")
    if model_type is not None and model_type not in _ORIGINAL_MODEL_TYPES:
        raise ValueError(
            f"not a HART tokenizer config: model_type={model_type!r} (expected one of {_ORIGINAL_MODEL_TYPES})"
        )
    quantizer_type = cfg_dict.get("quantizer_type", "var")
    if quantizer_type != "var_hybrid":
        raise ValueError(
            f"quantizer_type={quantizer_type!r} is not supported: HART's hybrid tokenizer needs 'var_hybrid' "
            "(the plain 'var' quantiser adds Phi at the last scale and has no continuous residual)"
        )
    if cfg_dict.get("double_decoder", False):
        raise ValueError("double_decoder=True is not supported (a second decoder for discrete-only reconstruction)")
    share = int(cfg_dict.get("share_quant_resi", 4))
    if share < 2:
        raise ValueError(f"share_quant_resi={share} (non-shared or fully shared Phi) is not supported; HART uses 4")
    quant_resi = float(cfg_dict.get("quant_resi", 0.5))
    if abs(quant_resi) <= 1e-6:
        raise ValueError(f"quant_resi={quant_resi} (Phi as identity, no weights) is not supported")
    v_patch_nums = cfg_dict.get("v_patch_nums", (1, 2, 3, 4, 5, 6, 8, 10, 13, 16))
    return {
        "vocab_size": int(cfg_dict.get("vocab_size", 4096)),
        "z_channels": int(cfg_dict.get("z_channels", 32)),
        "ch": int(cfg_dict.get("ch", 160)),
        "ch_mult": [int(m) for m in cfg_dict.get("ch_mult", (1, 1, 2, 2, 4))],
        "num_res_blocks": 2,  # hard-coded in the official HARTAutoEncoder (not a config field)
        "dropout": float(cfg_dict.get("dropout", 0.0)),
        "beta": float(cfg_dict.get("beta", 0.25)),
        "using_znorm": bool(cfg_dict.get("using_znorm", False)),
        "quant_resi": quant_resi,
        "share_quant_resi": share,
        "v_patch_nums": [p if isinstance(p, int) else list(p) for p in v_patch_nums],
        "quant_conv_ks": int(cfg_dict.get("quant_conv_ks", 3)),
        "in_channels": 3,  # hard-coded in the official HARTAutoEncoder
    }
