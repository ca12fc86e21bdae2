"""Synthetic data: the captioned-shapes world (:mod:`.shapes`) and its GenEval-style pixel scorer (:mod:`.scorer`)."""

from diffusers_var_accel.lab.data.scorer import detect_objects, score, score_batch
from diffusers_var_accel.lab.data.shapes import (
    BACKGROUNDS,
    CATEGORIES,
    COLORS,
    HELDOUT_SEED,
    PALETTE,
    SHAPES,
    ShapeObject,
    ShapeScene,
    caption_from_metadata,
    heldout_prompts,
    make_dataset,
    parse_prompt,
    render_scene,
    sample_scene,
    vocabulary,
)

__all__ = [
    "BACKGROUNDS",
    "CATEGORIES",
    "COLORS",
    "HELDOUT_SEED",
    "PALETTE",
    "SHAPES",
    "ShapeObject",
    "ShapeScene",
    "caption_from_metadata",
    "detect_objects",
    "heldout_prompts",
    "make_dataset",
    "parse_prompt",
    "render_scene",
    "sample_scene",
    "score",
    "score_batch",
    "vocabulary",
]
