"""HART's real structure at a tiny width, for the launch counter (``var-accel launches``,
:mod:`diffusers_var_accel.lab.bench.launches`; registered as the family's ``launch_structures``).

Everything but the widths is the real configuration (depth, heads' layout, the 300 context tokens, vocabulary,
diffusion head depth and steps, the tokenizer's levels): the counted kernels and syncs are those of the real model.
``--hart-scales N`` counts its first ``N`` scales only (a quicker run for CI).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

import torch

from diffusers_var_accel.models.autoencoder_hart import HARTHybridTokenizer
from diffusers_var_accel.models.transformer_hart import HART_CONFIGS, HARTTransformer
from diffusers_var_accel.lab.user_errors import positive_int_argument as _positive

#: HART-0.7B's tokenizer (the official ``hart-0.7b-1024px/tokenizer``) but for its width ``ch`` (160).
HART_LAUNCH_TOKENIZER = dict(vocab_size=4096, z_channels=32, ch_mult=(1, 1, 2, 2, 4))


class HARTLaunchStructures:
    """HART-0.7B at the launch counter's width; ``config.hart_scales``: its first scales only."""

    models: Tuple[str, ...] = ("hart-0.7b",)
    default_models: Tuple[str, ...] = ("hart-0.7b",)

    def add_arguments(self, parser) -> None:
        """``--hart-scales``: HART's first N scales."""
        parser.add_argument(
            "--hart-scales", type=_positive, default=None, help="HART: its first N scales (default: all 14, 1024x1024)"
        )

    def config_options(self, args) -> Dict[str, Any]:
        return {"hart_scales": args.hart_scales}

    def check_config(self, config) -> None:
        """``hart_scales``: ``None`` (all) or 2 up to the real number of scales."""
        most = len(HART_CONFIGS["hart-0.7b"]["patch_nums"])
        scales = config.hart_scales
        if scales is not None and not (isinstance(scales, int) and 2 <= scales <= most):
            raise ValueError(f"hart_scales must be an integer in [2, {most}] or None (all {most}), got {scales!r}")

    def build(self, model: str, config) -> Tuple[torch.nn.Module, torch.nn.Module]:
        """``(transformer, vae)`` of ``model`` at ``config``'s width (random initial weights)."""
        tconf = {
            **HART_CONFIGS[model],
            "embed_dim": config.width,
            "num_heads": config.heads,
            "context_dim": config.text_channels,
            "diffusion_width": config.width,
        }
        if config.depth is not None:
            tconf["depth"] = config.depth
        if config.hart_scales is not None:
            tconf["patch_nums"] = tuple(tconf["patch_nums"][: config.hart_scales])
        transformer = HARTTransformer(**tconf)
        vae = HARTHybridTokenizer(**HART_LAUNCH_TOKENIZER, ch=config.vae_channels, v_patch_nums=tconf["patch_nums"])
        return transformer, vae

    def real_config(self, model: str) -> Mapping[str, Any]:
        """The real transformer configuration (``embed_dim``, ``depth``) of ``model``."""
        return HART_CONFIGS[model]

    def size_options(self, config) -> Dict[str, Any]:
        """None: HART makes its one size."""
        return {}

    def call_options(self, pipe, config, generator: torch.Generator) -> Dict[str, Any]:
        """Random Qwen2-like context features (the model's ``context_tokens``)."""
        tconf = pipe.transformer.config
        embeds = torch.randn(config.batch_size, tconf.context_tokens, tconf.context_dim, generator=generator)
        return {"prompt_embeds": embeds}


LAUNCH_STRUCTURES = HARTLaunchStructures()
