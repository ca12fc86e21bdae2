"""Infinity's real structures at a tiny width, for the launch counter (``var-accel launches``,
:mod:`diffusers_var_accel.lab.bench.launches`; registered as the family's ``launch_structures``).

Everything but the widths is the real configuration (depth, heads' layout, MLP ratio, scale schedule, codebook, text
length; the VAE's levels): the counted kernels and syncs are those of the real model.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

import torch

from diffusers_var_accel.models.autoencoder_bsq import (
    INFINITY_VAE_D32_CONFIG,
    INFINITY_VAE_D56_PATCHIFY_CONFIG,
    InfinityBSQVAE,
)
from diffusers_var_accel.models.transformer_infinity import INFINITY_CONFIGS, InfinityTransformer


class InfinityLaunchStructures:
    """Infinity-2B and Infinity-8B (its patch-8 VAE with spatial patchify) at the launch counter's width."""

    #: The models the counter builds, and those ``--models`` counts by default.
    models: Tuple[str, ...] = ("infinity-2b", "infinity-8b")
    default_models: Tuple[str, ...] = ("infinity-2b",)

    def add_arguments(self, parser) -> None:
        """Infinity's own launch options: none (``--size``, the image side, is the counter's)."""

    def config_options(self, args) -> Dict[str, Any]:
        return {}

    def check_config(self, config) -> None:
        """Nothing of the counter's config is Infinity's own."""

    def build(self, model: str, config) -> Tuple[torch.nn.Module, torch.nn.Module]:
        """``(transformer, vae)`` of ``model`` at ``config``'s width (random initial weights)."""
        tconf = {
            **INFINITY_CONFIGS[model],
            "embed_dim": config.width,
            "num_heads": config.heads,
            "text_channels": config.text_channels,
        }
        if config.depth is not None:
            tconf["depth"] = config.depth
        vconf = dict(INFINITY_VAE_D56_PATCHIFY_CONFIG if model == "infinity-8b" else INFINITY_VAE_D32_CONFIG)
        vconf["base_ch"] = config.vae_channels
        return InfinityTransformer(**tconf), InfinityBSQVAE(**vconf)

    def real_config(self, model: str) -> Mapping[str, Any]:
        """The real transformer configuration (``embed_dim``, ``depth``) of ``model``."""
        return INFINITY_CONFIGS[model]

    def size_options(self, config) -> Dict[str, Any]:
        """The counted call's size: ``config.size`` square."""
        return {"height": config.size, "width": config.size}

    def call_options(self, pipe, config, generator: torch.Generator) -> Dict[str, Any]:
        """Random T5-like text features (``config.text_tokens`` tokens) and the counted size."""
        tconf = pipe.transformer.config
        embeds = torch.randn(config.batch_size, config.text_tokens, tconf.text_channels, generator=generator)
        return {"prompt_embeds": embeds, **self.size_options(config)}


LAUNCH_STRUCTURES = InfinityLaunchStructures()
