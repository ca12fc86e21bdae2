"""Scorer accuracy of a pipeline on the shapes world's fixed held-out prompts (GenEval-style categories)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import torch


def evaluate_shapes(
    pipe,
    prompts: Optional[Sequence[Dict[str, Any]]] = None,
    acceleration=None,
    batch_size: int = 8,
    sampling: Optional[Dict[str, Any]] = None,
    progress: bool = True,
    keep_images: bool = False,
) -> Dict[str, Any]:
    """Generate every held-out prompt with its own seed and score it.

    Args:
        pipe: an :class:`~diffusers_var_accel.InfinityPipeline` (e.g. the embedded model).
        prompts: entries ``{"prompt", "seed", ...}`` (default: :func:`~diffusers_var_accel.lab.data.shapes.heldout_prompts`,
            200 prompts).
        acceleration: a scheduler for every call (``None``: the baseline).
        batch_size: prompts per call; each image has its own generator, so results do not depend on it.
        sampling: call arguments (default: ``EMBEDDED_SAMPLING``).
        keep_images: also return the images (``"images"``, float arrays in [0, 1], in the prompts' order).

    Returns:
        ``score_batch``'s report (``per_category``, ``overall``, ``overall_images``, ``n``, ...) plus ``results``
        (prompt, category, seed, correct per prompt).
    """
    from tqdm.auto import tqdm

    from diffusers_var_accel.lab.data.scorer import score, score_batch
    from diffusers_var_accel.lab.data.shapes import heldout_prompts
    from diffusers_var_accel.embedded import EMBEDDED_SAMPLING

    entries = list(prompts) if prompts is not None else heldout_prompts()
    kwargs = dict(EMBEDDED_SAMPLING if sampling is None else sampling)
    pipe.set_progress_bar_config(disable=True)
    texts, images = [], []
    for start in tqdm(range(0, len(entries), batch_size), desc="evaluate", disable=not progress):
        chunk = entries[start : start + batch_size]
        generators = [torch.Generator().manual_seed(int(e["seed"])) for e in chunk]
        out = pipe(
            [e["prompt"] for e in chunk], generator=generators, output_type="np", acceleration=acceleration, **kwargs
        ).images
        texts += [e["prompt"] for e in chunk]
        images += list(out)
    report = score_batch(texts, images)
    report["results"] = [
        dict(
            prompt=e["prompt"],
            category=e.get("category"),
            seed=int(e["seed"]),
            correct=bool(score(e["prompt"], img)["correct"]),
        )
        for e, img in zip(entries, images)
    ]
    if keep_images:
        report["images"] = images
    return report
