"""Infinity's part of the memory meter (:mod:`diffusers_var_accel.lab.bench.memory`): the models it counts, their
real structures on the meta device with the flan-t5-xl encoder, how a generation is driven, which components the
pipeline's model offload keeps on the device per phase, and the low-memory recipes."""

from __future__ import annotations

from typing import Any, Dict

import torch

MODELS = ("infinity-2b", "infinity-8b")

#: Each model's low-memory recipe (``MemorySettings`` fields): 2B within 8 GB, 8B within 16 GB (docs/memory.md).
BUDGET_RECIPES: Dict[str, Dict[str, Any]] = {
    "infinity-2b": dict(accel="lazyvar", offload="model", tiling=True),
    "infinity-8b": dict(accel="lazyvar", weights="int8", offload="model", tiling=True),
}


def memory_parts(model: str):
    from transformers import T5Config, T5EncoderModel

    from diffusers_var_accel.lab.bench.flop_meter import build_on_meta
    from diffusers_var_accel.lab.bench.memory import MemorySettings, _Components
    from diffusers_var_accel.lab.bench.infinity_flops import (
        DEFAULT_TEXT_TOKENS,
        FLAN_T5_XL_ENCODER_CONFIG,
        MODEL_SPECS,
        infinity_generation,
    )
    from diffusers_var_accel.models.autoencoder_bsq import InfinityBSQVAE
    from diffusers_var_accel.models.infinity_resolutions import rope_grid_hw, schedule_for_size
    from diffusers_var_accel.models.transformer_infinity import InfinityTransformer

    spec = MODEL_SPECS[model]
    with torch.device("meta"):
        text_encoder = T5EncoderModel(T5Config(**FLAN_T5_XL_ENCODER_CONFIG)).eval()

    def run(transformer, vae, s: MemorySettings, scheduler):
        schedule, template = schedule_for_size(s.height, s.width)
        return infinity_generation(
            transformer,
            vae,
            schedule,
            rope_grid_hw(template),
            cfg=s.cfg,
            batch_size=s.batch_size,
            text_tokens=s.text_tokens or DEFAULT_TEXT_TOKENS,
            spatial_patchify=spec.spatial_patchify,
            scheduler=scheduler,
            kv_cache_dtype=s.kv_cache_dtype,
        )

    return _Components(
        text_encoder,
        lambda tokens, batch: {"input_ids": torch.zeros(batch, tokens, dtype=torch.long, device="meta")},
        build_on_meta(InfinityTransformer, **spec.transformer),
        build_on_meta(InfinityBSQVAE, **spec.vae),
        run,
        DEFAULT_TEXT_TOKENS,
        # text_encoder->transformer->vae: each moves in when called, the previous one out
        {"text_encoding": ("text_encoder",), "next_scale_loop": ("transformer",), "decode": ("vae",)},
    )
