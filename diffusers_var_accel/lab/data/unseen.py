"""The string-disjoint test set: shapes prompts whose strings the packaged embedded model never saw.

The 200 held-out prompts (:func:`~diffusers_var_accel.lab.data.shapes.heldout_prompts`) are held out *by seed*: their
strings also occur among the training captions, the validation prompts that chose the sampling settings and the
scenes of earlier decisions; only their seeds are new. This module builds a set held out *by string*.

**The rule.** Every list of prompts the packaged model met before evaluation -- its training captions (every stage
of ``scripts/train_embedded.py``), the validation prompts (``heldout_prompts(120, seed=1)``), the held-out set, the
calibration prompts (``calibration_prompts(n)``) and the sampling check's prompts -- is drawn by one sampler,
``shapes._sample_meaning``. That sampler draws the two objects of a ``color_attr`` or ``position`` prompt with two
*different* shapes and, when it names colours, two *different* colours. The grammar (``shapes.parse_prompt``) also
accepts two objects of one shape in two colours ("a red circle and a blue circle") and of one colour in two shapes
("a red circle to the left of a red square"). No draw of the sampler can be such a string, whatever its seed or
count, so no training, validation or calibration list can hold one; ``tests/test_unseen_prompts.py`` checks that
against every list. The set takes :data:`PER_CATEGORY` of them per category, in an order fixed by :data:`UNSEEN_SEED`.

**What it cannot cover.** ``single_object`` (3 strings), ``two_objects`` (6), ``colors`` (18) and ``counting`` (42)
have no strings the sampler cannot draw, and the packaged model's 20 000-scene training sets hold every one of them
(:func:`category_coverage` counts it); the enlarged grammar's new words (diamond, pink, cyan, four) are not in the
packaged model's vocabulary. So the set measures ``color_attr`` and ``position`` only.

**Nothing is chosen on it.** Calibration (``lab/calibration.py``), the sampling check
(``scripts/embedded_sampling_check.py``) and training (``scripts/train_embedded.py``) never import this module (a test
reads their sources), and :func:`unseen_prompts` raises inside ``lab.selection.decides`` / ``selecting``, which they hold
while they decide.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from diffusers_var_accel.lab.selection import current_decision
from diffusers_var_accel.lab.data.shapes import (
    CATEGORIES,
    GRAMMARS,
    RELATIONS,
    caption_from_metadata,
    make_dataset_captions,
)

__all__ = [
    "PACKAGED_TRAINING_SETS",
    "PER_CATEGORY",
    "UNSEEN_CATEGORIES",
    "UNSEEN_SEED",
    "category_coverage",
    "grammar_strings",
    "packaged_training_captions",
    "sampler_can_draw",
    "unseen_prompts",
]

#: The seed that orders the set and draws its per-prompt generation seeds.
UNSEEN_SEED = 20261206
#: Prompts per category (``color_attr`` has 126 such strings, ``position`` 504).
PER_CATEGORY = 100
#: The categories that have strings the sampler never draws.
UNSEEN_CATEGORIES: Tuple[str, ...] = ("color_attr", "position")

#: The training sets of the packaged embedded model, ``(num_images, seed, category_weights)`` of each stage of
#: ``scripts/train_embedded.py`` (docs/embedded.md: the tokenizer and stage 2 uniform; the sixth and seventh rounds
#: position=2; the eighth and ninth position=3; the unshipped fifth-round variant with colour attribution 3).
PACKAGED_TRAINING_SETS: Tuple[Tuple[int, int, Optional[Dict[str, float]]], ...] = (
    (20000, 0, None),
    (
        20000,
        0,
        dict(single_object=0.5, colors=0.5, counting=1, two_objects=1.5, position=2, color_attr=2),
    ),
    (
        20000,
        0,
        dict(single_object=0.5, colors=0.5, counting=1, two_objects=1.5, position=3, color_attr=2),
    ),
    (
        20000,
        0,
        dict(single_object=0.5, two_objects=1, counting=1, colors=0.5, position=3, color_attr=3),
    ),
)


def grammar_strings(category: str) -> List[Dict[str, Any]]:
    """Every meaning of ``category`` that the original grammar can say (``shapes.parse_prompt`` accepts its
    caption), sorted by caption."""
    g = GRAMMARS["original"]
    shapes, colors = g.shapes, g.colors
    out: List[Dict[str, Any]] = []

    def obj(shape, color, count=1):
        return {"shape": shape, "color": color, "count": count}

    def meaning(objects, relation=None):
        return {"category": category, "objects": objects, "relation": relation}

    if category == "single_object":
        out = [meaning([obj(s, None)]) for s in shapes]
    elif category == "colors":
        out = [meaning([obj(s, c)]) for s in shapes for c in colors]
    elif category == "counting":
        out = [meaning([obj(s, c, n)]) for n in sorted(g.counts) for s in shapes for c in (None,) + tuple(colors)]
    elif category == "two_objects":
        out = [meaning([obj(a, None), obj(b, None)]) for a, b in itertools.permutations(shapes, 2)]
    elif category in ("color_attr", "position"):
        relations = tuple(RELATIONS) if category == "position" else (None,)
        pairs = [(obj(a, ca), obj(b, cb)) for a in shapes for b in shapes for ca in colors for cb in colors]
        if category == "position":
            pairs += [(obj(a, None), obj(b, None)) for a in shapes for b in shapes]
        out = [meaning([x, y], r) for r in relations for x, y in pairs if x != y]
    else:
        raise ValueError(f"unknown category {category!r}; expected one of {CATEGORIES}")
    return sorted(out, key=caption_from_metadata)


def sampler_can_draw(meaning: Dict[str, Any]) -> bool:
    """Whether ``shapes._sample_meaning`` can draw this meaning: two objects must differ in shape and, if coloured,
    in colour."""
    objects = meaning["objects"]
    if len(objects) < 2:
        return True
    a, b = objects
    return a["shape"] != b["shape"] and (a["color"] is None or a["color"] != b["color"])


@functools.lru_cache(maxsize=1)
def packaged_training_captions() -> frozenset:
    """Every caption of the packaged model's training sets (:data:`PACKAGED_TRAINING_SETS`; drawn without rendering,
    a few seconds)."""
    seen = set()
    for n, seed, weights in PACKAGED_TRAINING_SETS:
        seen.update(make_dataset_captions(n, seed=seed, category_weights=weights))
    return frozenset(seen)


def category_coverage() -> Dict[str, Tuple[int, int, int]]:
    """Per category: ``(strings of the grammar, those the sampler can draw, those in the packaged model's training
    captions)``."""
    seen = packaged_training_captions()
    out = {}
    for category in CATEGORIES:
        meanings = grammar_strings(category)
        drawable = [m for m in meanings if sampler_can_draw(m)]
        out[category] = (len(meanings), len(drawable), sum(caption_from_metadata(m) in seen for m in meanings))
    return out


def unseen_prompts(
    per_category: int = PER_CATEGORY, categories: Sequence[str] = UNSEEN_CATEGORIES
) -> List[Dict[str, Any]]:
    """The string-disjoint test set: ``per_category`` prompts of each category whose strings no sampler draw can be,
    categories interleaved, each ``{"prompt", "category", "metadata", "seed"}`` like ``heldout_prompts``.

    Raises ``RuntimeError`` while a decision runs (``lab/selection.py``: nothing is chosen on this set)."""
    decision = current_decision()
    if decision is not None:
        raise RuntimeError(
            f"the string-disjoint test set was read while {decision} was deciding; nothing may be chosen on it"
        )
    unknown = [c for c in categories if c not in UNSEEN_CATEGORIES]
    if unknown:
        raise ValueError(
            f"categories {unknown} have no strings outside the sampler's draws; expected some of {UNSEEN_CATEGORIES}"
        )
    rng = np.random.default_rng(UNSEEN_SEED)
    columns = []
    for category in UNSEEN_CATEGORIES:
        pool = [m for m in grammar_strings(category) if not sampler_can_draw(m)]
        if isinstance(per_category, bool) or not isinstance(per_category, int) or not 1 <= per_category <= len(pool):
            raise ValueError(
                f"per_category must be an integer in [1, {len(pool)}] for {category}, got {per_category!r}"
            )
        order = rng.permutation(len(pool))
        seeds = rng.integers(2**31 - 1, size=len(pool))
        if category in categories:
            columns.append(
                [
                    {
                        "prompt": caption_from_metadata(pool[int(k)]),
                        "category": category,
                        "metadata": pool[int(k)],
                        "seed": int(s),
                    }
                    for k, s in zip(order[:per_category], seeds[:per_category])
                ]
            )
    return [entry for row in zip(*columns) for entry in row]
