"""Shared helpers of the tests driven by the official golden fixtures (tests/fixtures/*)."""

from __future__ import annotations

import torch


def padded_text(inputs, name: str = "text"):
    """A fixture's varlen T5 features (``<name>.kv_compact``, ``.lens``, ``.cu_seqlens_k``) as padded embeds + mask."""
    kv, lens, cu = inputs[f"{name}.kv_compact"], inputs[f"{name}.lens"].tolist(), inputs[f"{name}.cu_seqlens_k"].tolist()
    embeds = torch.zeros(len(lens), max(lens), kv.shape[1])
    mask = torch.zeros(len(lens), max(lens), dtype=torch.bool)
    for b, n in enumerate(lens):
        embeds[b, :n] = kv[cu[b]:cu[b + 1]]
        mask[b, :n] = True
    return embeds, mask


def official_call_kwargs(manifest, call, embeds, mask):
    """``InfinityPipeline`` arguments that replay one official ``autoregressive_infer_cfg`` call of a manifest."""
    num_scales = len(manifest["scale_schedule"])
    height, width = manifest["image_hw"]
    return dict(
        prompt_embeds=embeds,
        prompt_attention_mask=mask,
        height=height,
        width=width,
        cfg_list=call["cfg_list"][:num_scales],
        tau_list=call["tau_list"][:num_scales],
        top_k=call["top_k"],
        top_p=call["top_p"] if call["top_p"] > 0 else None,  # the official code treats 0 as "off"
        generator=torch.Generator("cpu").manual_seed(call["g_seed"]),
    )
