"""HART's part of the memory meter (:mod:`diffusers_var_accel.lab.bench.memory`): the model it counts, its real
structure on the meta device with the Qwen2-1.5B encoder, how a generation is driven, which components the
pipeline's model offload keeps on the device per phase, and the low-memory recipe."""

from __future__ import annotations

from typing import Any, Dict

import torch

MODELS = ("hart-0.7b",)

#: The low-memory recipe (``MemorySettings`` fields): within 6 GB (docs/memory.md).
BUDGET_RECIPES: Dict[str, Dict[str, Any]] = {"hart-0.7b": dict(accel="lazyvar", offload="model", tiling=True)}


def memory_parts(model: str):
    from transformers import Qwen2Config, Qwen2Model

    from diffusers_var_accel.lab.bench.memory import MemorySettings, _Components
    from diffusers_var_accel.lab.bench.hart_flops import QWEN2_1_5B_CONFIG, build_hart_on_meta, hart_generation

    with torch.device("meta"):
        text_encoder = Qwen2Model(Qwen2Config(**QWEN2_1_5B_CONFIG)).eval()
    transformer, vae = build_hart_on_meta(model)

    def run(transformer, vae, s: MemorySettings, scheduler):
        if (s.height, s.width) != (1024, 1024):
            raise ValueError(f"HART generates 1024x1024 images only, got {s.height}x{s.width}")
        return hart_generation(
            transformer, vae, cfg=s.cfg, batch_size=s.batch_size, scheduler=scheduler, kv_cache_dtype=s.kv_cache_dtype
        )

    # the official prompt encoding: system instruction + the prompt padded to 300 tokens (~450 tokens)
    return _Components(
        text_encoder,
        lambda tokens, batch: {"input_ids": torch.zeros(batch, tokens, dtype=torch.long, device="meta")},
        transformer,
        vae,
        run,
        450,
        # text_encoder->transformer with the tokenizer excluded (the loop calls it at every scale); the transformer,
        # last of the sequence, stays on the device until the call ends
        {
            "text_encoding": ("text_encoder", "vae"),
            "next_scale_loop": ("transformer", "vae"),
            "decode": ("transformer", "vae"),
        },
    )
