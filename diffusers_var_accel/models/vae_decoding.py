"""Sliced and tiled decoding for the tokenizers' decoders (diffusers' ``enable_slicing`` / ``enable_tiling``).

Slicing decodes one image of the batch at a time (same images, peak memory of one). Tiling decodes overlapping
latent tiles and blends them with weights that ramp linearly across the overlap (a weighted average, so a pixel
covered by one tile is exactly that tile's output). The decoders are convolutional except for their GroupNorms (and
HART's mid-block attention), whose statistics are computed per tile: tiled images are close to, not equal to, the
untiled ones (docs/next_scale_loop.md, "diffusers' memory options", gives the measured gap).
"""

from __future__ import annotations

from typing import Callable, List, Optional

import torch


def _tile_starts(size: int, tile: int, stride: int) -> List[int]:
    """Starts of tiles of ``tile`` covering ``[0, size)`` every ``stride``, the last one flush with the end."""
    if size <= tile:
        return [0]
    starts = list(range(0, size - tile, stride))
    starts.append(size - tile)
    return starts


def _ramp(length: int, overlap: int, device, dtype) -> torch.Tensor:
    """1D blending weight of one tile: rises over ``overlap`` pixels at both ends, 1 in between (never 0)."""
    x = torch.arange(length, device=device, dtype=dtype) + 0.5
    return torch.minimum(x, length - x).div(max(overlap, 1)).clamp(max=1.0)


def decode_tiled(
    decode: Callable[[torch.Tensor], torch.Tensor], z_BChw: torch.Tensor, tile: int, overlap: int
) -> torch.Tensor:
    """``decode`` over overlapping ``tile x tile`` latent tiles (``overlap`` latent pixels shared), blended."""
    B, _, h, w = z_BChw.shape
    stride = tile - overlap
    rows, cols = _tile_starts(h, tile, stride), _tile_starts(w, tile, stride)
    out = weight = None
    for r in rows:
        for c in cols:
            pixels = decode(z_BChw[:, :, r : r + tile, c : c + tile])
            if out is None:
                factor = pixels.shape[-1] // min(tile, w)
                out = pixels.new_zeros(B, pixels.shape[1], h * factor, w * factor)
                weight = pixels.new_zeros(1, 1, h * factor, w * factor)
            th, tw = pixels.shape[-2:]
            wmap = (
                _ramp(th, overlap * factor, pixels.device, pixels.dtype)[:, None]
                * _ramp(tw, overlap * factor, pixels.device, pixels.dtype)[None]
            )
            out[:, :, r * factor : r * factor + th, c * factor : c * factor + tw] += pixels * wmap
            weight[:, :, r * factor : r * factor + th, c * factor : c * factor + tw] += wmap
    return out / weight


class SlicedTiledDecodeMixin:
    """``enable_slicing`` / ``disable_slicing`` / ``enable_tiling`` / ``disable_tiling`` for a tokenizer whose
    ``decode`` routes its batch through :meth:`_decode_sliced_tiled`. Off by default (one batched call)."""

    use_slicing: bool = False
    use_tiling: bool = False
    tile_latent_size: int = 48
    tile_latent_overlap: int = 16

    def enable_slicing(self) -> None:
        """Decode the images of a batch one at a time (bit-identical images, the peak memory of one)."""
        self.use_slicing = True

    def disable_slicing(self) -> None:
        self.use_slicing = False

    def enable_tiling(self, tile_latent_size: Optional[int] = None, tile_latent_overlap: Optional[int] = None) -> None:
        """Decode latents larger than ``tile_latent_size`` in overlapping tiles, blended (for 2K images).

        Args:
            tile_latent_size (`int`, *optional*, defaults to 48): tile side in latent pixels (x the downsampling in
                image pixels).
            tile_latent_overlap (`int`, *optional*, defaults to 16): latent pixels shared by neighbouring tiles;
                must be >= 0 and smaller than the tile.
        """
        size = self.tile_latent_size if tile_latent_size is None else tile_latent_size
        overlap = self.tile_latent_overlap if tile_latent_overlap is None else tile_latent_overlap
        for name, value in (("tile_latent_size", size), ("tile_latent_overlap", overlap)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")
        if size < 1 or not 0 <= overlap < size:
            raise ValueError(
                f"need tile_latent_size >= 1 and 0 <= tile_latent_overlap < tile_latent_size; got {size} and {overlap}"
            )
        self.use_tiling, self.tile_latent_size, self.tile_latent_overlap = True, size, overlap

    def disable_tiling(self) -> None:
        self.use_tiling = False

    def _decode_sliced_tiled(
        self, decode: Callable[[torch.Tensor], torch.Tensor], z_BChw: torch.Tensor
    ) -> torch.Tensor:
        def one(z):
            if self.use_tiling and max(z.shape[-2:]) > self.tile_latent_size:
                return decode_tiled(decode, z, self.tile_latent_size, self.tile_latent_overlap)
            return decode(z)

        if self.use_slicing and z_BChw.shape[0] > 1:
            return torch.cat([one(z_BChw[b : b + 1]) for b in range(z_BChw.shape[0])])
        return one(z_BChw)
