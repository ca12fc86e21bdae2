"""A synthetic captioned-shapes world: deterministic scenes of 1-3 flat objects, their captions and their meaning.

The world is small enough for a tiny next-scale text-to-image model to learn, and simple enough for a pixel-level
scorer (:mod:`diffusers_var_accel.lab.data.scorer`) to judge a generated image GenEval-style from its prompt alone.

Objects
-------
Every object is a filled, axis-aligned ``circle``, ``square`` or upright isosceles ``triangle`` (apex up, base at the
bottom). Its geometry is resolution independent: ``center_xy`` and ``size`` are fractions of the canvas side (x to
the right, y downwards), and each shape fills a ``size`` x ``size`` box centred on ``center_xy`` (the circle's
diameter, the square's side, the triangle's base and height). Sizes are drawn from a *small* range
(:data:`SMALL_SIZE`, 12-17 px at 64x64) or a *large* one (:data:`LARGE_SIZE`, 19-26 px at 64x64), so an object spans
at least 3 tokens of a 16x16 token map. Objects never overlap: their boxes keep a gap of :data:`MIN_GAP` and a margin
of :data:`MARGIN` from the canvas edges (positions are sampled with rejection). For training a small model,
:func:`sample_scene` can round sizes and box corners to a lattice (``lattice``), replace the size ranges (``sizes``)
and put the objects at fixed places that follow from the caption (``layout="canonical"``); captions never depend on
these options.

Palette
-------
Six saturated object colours (:data:`PALETTE`), chosen far apart both in RGB (the closest pair, orange/yellow, is
90 apart) and in hue (closest pair, orange/yellow, 26 degrees apart), all with chroma ``max - min >= 140``:

======  ===============  =====  ======
name    RGB              hue    chroma
======  ===============  =====  ======
red     (220, 30, 30)    0.0    190
orange  (250, 130, 20)   28.7   230
yellow  (240, 220, 20)   54.5   220
green   (30, 170, 60)    132.9  140
blue    (30, 80, 230)    225.0  200
purple  (150, 40, 210)   278.8  170
======  ===============  =====  ======

Backgrounds are neutral greys only (chroma 0, :data:`NEUTRAL_TONES`: white 255, light_gray 210, dark_gray 70, black
15), so no background can be taken for an object colour: a plain tone (``"white"``) or two tones split into halves
(``"white+dark_gray:v"``: left half white, right half dark gray; ``":h"`` splits into top and bottom halves).
Rendering is 4x supersampled and box-filtered, so object interiors keep their exact palette colour and edge pixels
are mixtures of the object colour with a grey, which keep the object's hue.

Grammar
-------
Captions are lower case, without punctuation; ``<det>`` is ``a`` (``an`` before ``orange``), ``<shape>`` one of
:data:`SHAPES`, ``<color>`` one of :data:`COLORS`, ``<count>`` ``two`` or ``three``::

    single_object  <det> <shape>                                     "a circle"
    colors         <det> <color> <shape>                             "a blue triangle"
    counting       <count> [<color>] <shape>s                        "two red circles", "three squares"
    two_objects    <det> <shape> and <det> <shape>                   "a circle and a square"
    color_attr     <det> <color> <shape> and <det> <color> <shape>   "a red circle and a green square"
    position       <np> <relation> <np>                              "a blue square to the left of a yellow triangle"
                   where <np> is <det> [<color>] <shape> (both with a colour or both without) and <relation> is
                   "to the left of" | "to the right of" | "above" | "below"

**The enlarged grammar** (:data:`GRAMMARS` ``["enlarged"]``) adds the shape ``diamond`` (a square standing on a
corner, filling its box), the colours ``pink`` and ``cyan`` (:data:`EXTRA_PALETTE`) and the count ``four``. The
200 held-out prompts use the original words only, and nearly all strings of ``single_object`` (3), ``two_objects``
(6) and ``colors`` (18) occur among them; the enlarged grammar has prompts of every category outside that set, for
calibrating a model trained on it. :func:`parse_prompt` reads every word of both; :func:`sample_scene`,
:func:`make_dataset` and :func:`heldout_prompts` draw from the original grammar unless given ``grammar``.

A colour on a lone object makes the caption a ``colors`` caption, so every caption has exactly one category (a
coloured single object reads as GenEval's ``colors`` task). Two-object captions never name the same object twice
(:func:`parse_prompt` also accepts the same shape in two different colours, which the sampler does not produce).

Every scene shows exactly what its caption says and nothing else: one object for ``single_object`` and ``colors``
(any colour for the former), exactly N objects of the shape for ``counting`` (all of the named colour, or each of a
random colour), two objects of different shapes for ``two_objects`` (random colours), ``color_attr`` (two different
named colours) and ``position``. For ``position`` the first object's box centre is at least a quarter of the canvas
away from the second's along the relation's axis, in the relation's direction, and at most 0.4 times that distance
away along the other axis.

Meaning
-------
:func:`parse_prompt` maps a caption to its structured meaning, which is also a scene's ``metadata``::

    {"category": "position",
     "objects": [{"shape": "square", "color": "blue", "count": 1},
                 {"shape": "triangle", "color": "yellow", "count": 1}],
     "relation": "left of"}          # GenEval's names: "left of", "right of", "above", "below"; None unless position

``color`` is ``None`` where the caption names none; ``count`` is 1 except for ``counting``.

Determinism
-----------
:func:`sample_scene` draws everything from the numpy ``Generator`` it is given; :func:`make_dataset` gives sample
``i`` of seed ``s`` its own generator ``default_rng([s, i])``, so a sample does not depend on ``n``.
:func:`heldout_prompts` draws a fixed, category-balanced evaluation set from :data:`HELDOUT_SEED`.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image, ImageDraw

__all__ = [
    "ALL_PALETTE",
    "ALL_SHAPES",
    "BACKGROUNDS",
    "CANONICAL_CENTERS",
    "CATEGORIES",
    "COLORS",
    "COUNT_WORDS",
    "EXTRA_COUNT_WORDS",
    "EXTRA_PALETTE",
    "EXTRA_SHAPES",
    "GRAMMARS",
    "Grammar",
    "HELDOUT_SEED",
    "LARGE_SIZE",
    "MARGIN",
    "MIN_GAP",
    "NEUTRAL_TONES",
    "PALETTE",
    "PALETTE_HUE",
    "RELATIONS",
    "SHAPES",
    "SMALL_SIZE",
    "ShapeObject",
    "ShapeScene",
    "caption_from_metadata",
    "get_grammar",
    "grammar_of",
    "heldout_prompts",
    "make_dataset_captions",
    "make_dataset",
    "parse_prompt",
    "render_scene",
    "sample_scene",
    "vocabulary",
]

RGB = Tuple[int, int, int]

SHAPES: Tuple[str, ...] = ("circle", "square", "triangle")

#: Object colours (see the module docstring for their hues and chromas).
PALETTE: Dict[str, RGB] = {
    "red": (220, 30, 30),
    "orange": (250, 130, 20),
    "yellow": (240, 220, 20),
    "green": (30, 170, 60),
    "blue": (30, 80, 230),
    "purple": (150, 40, 210),
}
COLORS: Tuple[str, ...] = tuple(PALETTE)
#: Hue of each palette colour in degrees [0, 360).


def _hue(rgb: RGB) -> float:
    return 360.0 * colorsys.rgb_to_hsv(*(v / 255.0 for v in rgb))[0]


PALETTE_HUE: Dict[str, float] = {c: _hue(rgb) for c, rgb in PALETTE.items()}

#: Neutral background tones (grey levels); never confusable with a palette colour (chroma 0 against >= 140).
NEUTRAL_TONES: Dict[str, int] = {"white": 255, "light_gray": 210, "dark_gray": 70, "black": 15}
_TONE_PAIRS: Tuple[Tuple[str, str], ...] = (
    ("white", "light_gray"),
    ("white", "dark_gray"),
    ("light_gray", "dark_gray"),
    ("light_gray", "black"),
    ("dark_gray", "black"),
)
#: Every background a scene can have: plain tones, then two-tone splits ``"<a>+<b>:v"`` (left a, right b) and
#: ``"<a>+<b>:h"`` (top a, bottom b), in both orders.
BACKGROUNDS: Tuple[str, ...] = tuple(NEUTRAL_TONES) + tuple(
    f"{a}+{b}:{split}" for x, y in _TONE_PAIRS for a, b in ((x, y), (y, x)) for split in ("v", "h")
)

CATEGORIES: Tuple[str, ...] = ("single_object", "two_objects", "counting", "colors", "position", "color_attr")
COUNT_WORDS: Dict[int, str] = {2: "two", 3: "three"}
#: GenEval relation name -> caption phrase.
RELATIONS: Dict[str, str] = {
    "left of": "to the left of",
    "right of": "to the right of",
    "above": "above",
    "below": "below",
}

#: The words of the enlarged grammar beyond the original one: a fourth shape (a square standing on a corner, filling
#: its box), two colours hue-separated from the six (pink 326 degrees: 34 from red, 47 from purple; cyan 186: 53 from
#: green, 39 from blue; chroma 175 and 190) and a fourth count (four objects: a 2 x 2 grid in the canonical layout).
EXTRA_SHAPES: Tuple[str, ...] = ("diamond",)
EXTRA_PALETTE: Dict[str, RGB] = {"pink": (235, 60, 160), "cyan": (20, 190, 210)}
EXTRA_COUNT_WORDS: Dict[int, str] = {4: "four"}
#: Every colour a scene can be drawn in (the renderer's and the parser's palette).
ALL_PALETTE: Dict[str, RGB] = {**PALETTE, **EXTRA_PALETTE}
ALL_PALETTE_HUE: Dict[str, float] = {c: _hue(rgb) for c, rgb in ALL_PALETTE.items()}
#: Every shape a scene can hold, and the plural of each.
ALL_SHAPES: Tuple[str, ...] = SHAPES + EXTRA_SHAPES
PLURALS: Dict[str, str] = {s: s + "s" for s in ALL_SHAPES}
#: Every count word of every grammar.
ALL_COUNT_WORDS: Dict[int, str] = {**COUNT_WORDS, **EXTRA_COUNT_WORDS}


@dataclass(frozen=True)
class Grammar:
    """The words a caption may use: shapes, colours, counts and relations (the categories are the same for all).

    ``"original"`` is the world of the 200 held-out prompts (3 shapes, 6 colours, counts two and three); its strings
    of ``single_object`` (3), ``two_objects`` (6) and ``colors`` (18) all but fill the held-out set. ``"enlarged"``
    adds :data:`EXTRA_SHAPES`, :data:`EXTRA_PALETTE` and :data:`EXTRA_COUNT_WORDS`, so that prompts of every category
    exist whose strings are not held out. A grammar's sampler draws exactly as the original one did when given the
    original words, so :func:`heldout_prompts` is unchanged.
    """

    name: str
    shapes: Tuple[str, ...]
    colors: Tuple[str, ...]
    count_words: Tuple[Tuple[int, str], ...]

    @property
    def counts(self) -> Dict[int, str]:
        return dict(self.count_words)

    def words(self) -> List[str]:
        """Every word a caption of this grammar can contain, sorted (for a word-level tokenizer)."""
        words = {"a", "an", "and"} | set(self.shapes) | {PLURALS[s] for s in self.shapes} | set(self.colors)
        words |= set(self.counts.values())
        for phrase in RELATIONS.values():
            words |= set(phrase.split())
        return sorted(words)


GRAMMARS: Dict[str, Grammar] = {
    "original": Grammar("original", SHAPES, tuple(PALETTE), tuple(COUNT_WORDS.items())),
    "enlarged": Grammar("enlarged", ALL_SHAPES, tuple(ALL_PALETTE), tuple(ALL_COUNT_WORDS.items())),
}


def get_grammar(grammar: Union[str, Grammar]) -> Grammar:
    """A :class:`Grammar` by name (``"original"`` or ``"enlarged"``), or the one given."""
    if isinstance(grammar, Grammar):
        return grammar
    if grammar not in GRAMMARS:
        raise ValueError(f"unknown grammar {grammar!r}; expected one of {sorted(GRAMMARS)}")
    return GRAMMARS[grammar]


def grammar_of(meaning: Dict[str, Any]) -> Grammar:
    """The smallest grammar whose words say ``meaning`` (a caption's metadata): the original one unless the caption
    uses a word of the enlarged one. The scorer reads colours and shapes within it, so that its verdicts on prompts
    of the original grammar stay what they were before the grammar grew."""
    original = GRAMMARS["original"]
    for o in meaning["objects"]:
        if o["shape"] not in original.shapes or (o["color"] and o["color"] not in original.colors):
            return GRAMMARS["enlarged"]
        if o["count"] != 1 and o["count"] not in original.counts:
            return GRAMMARS["enlarged"]
    return original


#: Object size ranges, as fractions of the canvas side (12-17 px and 19-26 px at 64x64).
SMALL_SIZE: Tuple[float, float] = (0.19, 0.27)
LARGE_SIZE: Tuple[float, float] = (0.30, 0.40)
#: Smallest gap between two objects' boxes, and between a box and the canvas edge (fractions of the side).
MIN_GAP: float = 0.06
MARGIN: float = 0.04
#: Position scenes: offset along the relation axis >= this, and across it <= _POSITION_CROSS times that offset.
_POSITION_MIN_OFFSET: float = 0.25
_POSITION_CROSS: float = 0.4

#: Seed of :func:`heldout_prompts` (training data should use other seeds).
HELDOUT_SEED: int = 20_240_917

_SUPERSAMPLE = 4


@dataclass
class ShapeObject:
    """One flat object. ``center_xy`` and ``size`` are fractions of the canvas side (x right, y down)."""

    shape: str
    color: str
    center_xy: Tuple[float, float]
    size: float

    def box(self) -> Tuple[float, float, float, float]:
        """The object's ``(x0, y0, x1, y1)`` box, in fractions of the canvas side."""
        h = self.size / 2.0
        x, y = self.center_xy
        return (x - h, y - h, x + h, y + h)


@dataclass
class ShapeScene:
    """A scene: its objects, background (one of :data:`BACKGROUNDS`), caption, category and caption meaning."""

    objects: List[ShapeObject]
    background: str
    caption: str
    category: str
    metadata: Dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------------------------
# Captions
# ----------------------------------------------------------------------------------------------------------------


def _det(next_word: str) -> str:
    return "an" if next_word[0] in "aeiou" else "a"


def _noun_phrase(shape: str, color: Optional[str]) -> str:
    words = ([color] if color else []) + [shape]
    return " ".join([_det(words[0])] + words)


def caption_from_metadata(meta: Dict[str, Any]) -> str:
    """The caption of a structured meaning (the inverse of :func:`parse_prompt`)."""
    cat, objs = meta["category"], meta["objects"]
    if cat in ("single_object", "colors"):
        return _noun_phrase(objs[0]["shape"], objs[0]["color"])
    if cat == "counting":
        o = objs[0]
        words = [ALL_COUNT_WORDS[o["count"]]] + ([o["color"]] if o["color"] else []) + [PLURALS[o["shape"]]]
        return " ".join(words)
    a = _noun_phrase(objs[0]["shape"], objs[0]["color"])
    b = _noun_phrase(objs[1]["shape"], objs[1]["color"])
    if cat in ("two_objects", "color_attr"):
        return f"{a} and {b}"
    if cat == "position":
        return f"{a} {RELATIONS[meta['relation']]} {b}"
    raise ValueError(f"unknown category {cat!r}")


def _obj(shape: str, color: Optional[str], count: int = 1) -> Dict[str, Any]:
    return {"shape": shape, "color": color, "count": count}


def _meaning(category: str, objects: List[Dict[str, Any]], relation: Optional[str] = None) -> Dict[str, Any]:
    return {"category": category, "objects": objects, "relation": relation}


def parse_prompt(prompt: str) -> Dict[str, Any]:
    """The structured meaning of a caption of the grammar (see the module docstring).

    Case, surrounding blanks, repeated blanks and one final ``.`` are ignored; either article is accepted before any
    word. Every word of the enlarged grammar is read (:data:`GRAMMARS`; :func:`grammar_of` tells which grammar a
    meaning needs). Raises ``ValueError`` naming the prompt for any text outside the grammar.
    """
    if not isinstance(prompt, str):
        raise ValueError(f"prompt {prompt!r} is not a string")
    text = prompt.strip().lower()
    if text.endswith("."):
        text = text[:-1]
    toks = text.split()

    def fail(why: str) -> ValueError:
        return ValueError(f"prompt {prompt!r} is outside the shapes grammar: {why}")

    def noun_phrase(i: int) -> Tuple[Dict[str, Any], int]:
        if i >= len(toks) or toks[i] not in ("a", "an"):
            raise fail(f"expected 'a' or 'an' at word {i + 1}")
        i += 1
        color = None
        if i < len(toks) and toks[i] in ALL_PALETTE:
            color, i = toks[i], i + 1
        if i >= len(toks) or toks[i] not in ALL_SHAPES:
            raise fail(f"expected a shape ({', '.join(ALL_SHAPES)}) at word {i + 1}")
        return _obj(toks[i], color), i + 1

    if not toks:
        raise fail("empty")
    counts = {w: n for n, w in ALL_COUNT_WORDS.items()}
    if toks[0] in counts:
        rest = toks[1:]
        color = None
        if rest and rest[0] in ALL_PALETTE:
            color, rest = rest[0], rest[1:]
        plural_to_shape = {p: s for s, p in PLURALS.items()}
        if len(rest) != 1 or rest[0] not in plural_to_shape:
            raise fail("expected '<count> [<color>] <shapes>'")
        return _meaning("counting", [_obj(plural_to_shape[rest[0]], color, counts[toks[0]])])

    a, i = noun_phrase(0)
    if i == len(toks):
        return _meaning("colors" if a["color"] else "single_object", [a])
    if toks[i] == "and":
        b, j = noun_phrase(i + 1)
        if j != len(toks):
            raise fail("unexpected words after the second object")
        if (a["color"] is None) != (b["color"] is None):
            raise fail("either both objects or neither name a colour")
        if a == b:
            raise fail("the two objects are the same")
        return _meaning("color_attr" if a["color"] else "two_objects", [a, b])
    for rel, phrase in RELATIONS.items():
        words = phrase.split()
        if toks[i : i + len(words)] == words:
            b, j = noun_phrase(i + len(words))
            if j != len(toks):
                raise fail("unexpected words after the second object")
            if (a["color"] is None) != (b["color"] is None):
                raise fail("either both objects or neither name a colour")
            if a == b:
                raise fail("the two objects are the same")
            return _meaning("position", [a, b], rel)
    raise fail(f"expected 'and' or a relation ({', '.join(RELATIONS.values())}) at word {i + 1}")


def vocabulary(grammar: Union[str, "Grammar"] = "original") -> List[str]:
    """Every word a caption of ``grammar`` can contain, sorted (for a word-level tokenizer)."""
    return get_grammar(grammar).words()


# ----------------------------------------------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------------------------------------------


def _as_rng(rng: Union[np.random.Generator, int, None]) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(rng)


def _choice(rng: np.random.Generator, seq: Sequence[Any]) -> Any:
    return seq[int(rng.integers(len(seq)))]


def _sample_meaning(rng: np.random.Generator, category: str, grammar: Grammar) -> Dict[str, Any]:
    """A random meaning of the category (a caption's metadata) in ``grammar`` (the same draws from ``rng`` for any
    grammar, so the original grammar's draws are those it always made)."""
    shapes, colors = grammar.shapes, grammar.colors
    if category == "single_object":
        return _meaning(category, [_obj(_choice(rng, shapes), None)])
    if category == "colors":
        return _meaning(category, [_obj(_choice(rng, shapes), _choice(rng, colors))])
    if category == "counting":
        n = _choice(rng, sorted(grammar.counts))
        color = _choice(rng, colors) if rng.random() < 0.5 else None
        return _meaning(category, [_obj(_choice(rng, shapes), color, n)])
    s1, s2 = (shapes[int(k)] for k in rng.permutation(len(shapes))[:2])
    if category == "two_objects":
        return _meaning(category, [_obj(s1, None), _obj(s2, None)])
    if category == "color_attr":
        c1, c2 = (colors[int(k)] for k in rng.permutation(len(colors))[:2])
        return _meaning(category, [_obj(s1, c1), _obj(s2, c2)])
    if category == "position":
        relation = _choice(rng, tuple(RELATIONS))
        if rng.random() < 0.5:
            c1, c2 = (colors[int(k)] for k in rng.permutation(len(colors))[:2])
        else:
            c1 = c2 = None
        return _meaning(category, [_obj(s1, c1), _obj(s2, c2)], relation)
    raise ValueError(f"unknown category {category!r}; expected one of {CATEGORIES}")


def _position_holds(a: Tuple[float, float], b: Tuple[float, float], relation: str) -> bool:
    """Whether centre ``a`` is clearly ``relation`` centre ``b`` (the sampler's rule, see the module docstring)."""
    dx, dy = a[0] - b[0], a[1] - b[1]
    along, across = {"left of": (-dx, dy), "right of": (dx, dy), "above": (-dy, dx), "below": (dy, dx)}[relation]
    return along >= _POSITION_MIN_OFFSET and abs(across) <= _POSITION_CROSS * along


def _boxes_apart(a: ShapeObject, b: ShapeObject) -> bool:
    ax0, ay0, ax1, ay1 = a.box()
    bx0, by0, bx1, by1 = b.box()
    return ax1 + MIN_GAP <= bx0 or bx1 + MIN_GAP <= ax0 or ay1 + MIN_GAP <= by0 or by1 + MIN_GAP <= ay0


def _inside_margin(objs: List[ShapeObject]) -> bool:
    """Whether every box keeps :data:`MARGIN` from the canvas edges (up to rounding)."""
    return all(MARGIN - 1e-9 <= v <= 1.0 - MARGIN + 1e-9 for o in objs for v in o.box())


def _snap(value: float, lattice: Optional[float]) -> float:
    return value if lattice is None else round(value / lattice) * lattice


def _place(
    rng: np.random.Generator,
    specs: List[Tuple[str, str]],
    relation: Optional[str],
    tries: int = 400,
    lattice: Optional[float] = None,
    sizes: Optional[Tuple[Tuple[float, float], Tuple[float, float]]] = None,
) -> List[ShapeObject]:
    """Objects of the given (shape, colour) with random sizes and non-overlapping positions (rejection sampling).

    Sizes are re-drawn every ``tries`` rejected placements, drifting to the small range if large objects do not fit.
    With ``lattice``, every size and box corner is rounded to a multiple of it (placements that then break the margin
    are rejected). ``sizes`` replaces the ``(small, large)`` size ranges (:data:`SMALL_SIZE`, :data:`LARGE_SIZE`).
    """
    small, large = sizes if sizes is not None else (SMALL_SIZE, LARGE_SIZE)
    for attempt in range(100):
        large_p = 0.5 if attempt < 5 else 0.0
        drawn = [float(rng.uniform(*(large if rng.random() < large_p else small))) for _ in specs]
        drawn = [_snap(s, lattice) for s in drawn]
        for _ in range(tries):
            objs = []
            for (shape, color), s in zip(specs, drawn):
                lo, hi = MARGIN + s / 2, 1.0 - MARGIN - s / 2
                center = [float(rng.uniform(lo, hi)), float(rng.uniform(lo, hi))]
                if lattice is not None:
                    center = [_snap(c - s / 2, lattice) + s / 2 for c in center]
                objs.append(ShapeObject(shape, color, (center[0], center[1]), s))
            if lattice is not None and not _inside_margin(objs):
                continue
            if not all(_boxes_apart(objs[i], objs[j]) for i in range(len(objs)) for j in range(i)):
                continue
            if relation is not None and not _position_holds(objs[0].center_xy, objs[1].center_xy, relation):
                continue
            return objs
    raise RuntimeError(f"could not place {specs}")  # pragma: no cover - the small sizes always fit


#: Fixed object centres of the ``"canonical"`` layout, by number of objects (the first-named object first).
CANONICAL_CENTERS: Dict[str, Tuple[Tuple[float, float], ...]] = {
    "one": ((0.5, 0.5),),
    "row": ((0.28, 0.5), (0.72, 0.5)),
    "column": ((0.5, 0.28), (0.5, 0.72)),
    "three": ((0.28, 0.28), (0.72, 0.28), (0.5, 0.72)),
    "four": ((0.28, 0.28), (0.72, 0.28), (0.28, 0.72), (0.72, 0.72)),
}


def _place_canonical(
    rng: np.random.Generator,
    specs: List[Tuple[str, str]],
    relation: Optional[str],
    lattice: Optional[float],
    sizes: Optional[Tuple[Tuple[float, float], Tuple[float, float]]],
) -> List[ShapeObject]:
    """Objects at the fixed centres of :data:`CANONICAL_CENTERS` (one size per scene): the layout follows from the
    caption (one object in the middle; two side by side in the order named, or one above the other for ``above`` /
    ``below``; three in a triangle; four in a 2 x 2 grid), so only sizes and colours are random."""
    small, large = sizes if sizes is not None else (SMALL_SIZE, LARGE_SIZE)
    size = _snap(float(rng.uniform(*(large if rng.random() < 0.5 and len(specs) < 3 else small))), lattice)
    if len(specs) == 1:
        centers = CANONICAL_CENTERS["one"]
    elif len(specs) == 3:
        centers = CANONICAL_CENTERS["three"]
    elif len(specs) == 4:
        centers = CANONICAL_CENTERS["four"]
    else:
        centers = CANONICAL_CENTERS["column" if relation in ("above", "below") else "row"]
        if relation in ("right of", "below"):
            centers = centers[::-1]
    objs = []
    for (shape, color), (cx, cy) in zip(specs, centers):
        x0, y0 = _snap(cx - size / 2, lattice), _snap(cy - size / 2, lattice)
        objs.append(ShapeObject(shape, color, (x0 + size / 2, y0 + size / 2), size))
    if not _inside_margin(objs) or not all(_boxes_apart(objs[i], objs[j]) for i in range(len(objs)) for j in range(i)):
        raise ValueError(
            f"object size {size:.3f} (sizes={sizes}) does not fit the canonical layout of {len(objs)} "
            f"objects with the margin {MARGIN} and gap {MIN_GAP}; use smaller sizes"
        )
    return objs


def sample_scene(
    rng: Union[np.random.Generator, int, None] = None,
    category: Optional[str] = None,
    lattice: Optional[float] = None,
    sizes: Optional[Tuple[Tuple[float, float], Tuple[float, float]]] = None,
    layout: str = "random",
    unnamed_color: Optional[str] = None,
    background: Optional[str] = None,
    grammar: Union[str, Grammar] = "original",
) -> ShapeScene:
    """A random scene whose caption holds; the category is drawn uniformly from :data:`CATEGORIES` unless given.

    ``rng`` is a numpy ``Generator`` (advanced in place) or an integer seed. ``lattice`` (a fraction of the canvas
    side, e.g. ``1 / 16``: one token of a 16x16 map) rounds every object's size and box corners to multiples of it,
    so that object edges fall on token boundaries (fewer distinct token contents for a small model to learn); the
    caption is drawn before the geometry, so it does not depend on ``lattice``. ``sizes`` replaces the ``(small,
    large)`` object size ranges (fractions of the side; default :data:`SMALL_SIZE`, :data:`LARGE_SIZE`).
    ``layout="canonical"`` puts the objects at fixed places that follow from the caption (see
    :func:`_place_canonical`) on a plain background, instead of random places on a plain or two-tone one.
    ``unnamed_color`` (one of :data:`COLORS`) is the colour of every object whose caption names none, instead of a
    random colour each; ``background`` (one of :data:`BACKGROUNDS`) replaces the random background. With the
    canonical layout and one object size these make a scene a function of its caption (see docs/embedded.md).
    ``grammar`` (a name of :data:`GRAMMARS`): the words its captions use, and the colours of unnamed objects.
    """
    grammar = get_grammar(grammar)
    if layout not in ("random", "canonical"):
        raise ValueError(f"unknown layout {layout!r}; expected 'random' or 'canonical'")
    if unnamed_color is not None and unnamed_color not in grammar.colors:
        raise ValueError(f"unknown unnamed_color {unnamed_color!r}; expected one of {grammar.colors}")
    if background is not None and background not in BACKGROUNDS:
        raise ValueError(f"unknown background {background!r}; expected one of {BACKGROUNDS}")
    rng = _as_rng(rng)
    if category is None:
        category = _choice(rng, CATEGORIES)
    meaning = _sample_meaning(rng, category, grammar)
    # Objects without a named colour get a random one each (or ``unnamed_color``).
    specs = [
        (o["shape"], o["color"] or unnamed_color or _choice(rng, grammar.colors))
        for o in meaning["objects"]
        for _ in range(o["count"])
    ]
    if layout == "canonical":
        objects = _place_canonical(rng, specs, meaning["relation"], lattice, sizes)
    else:
        objects = _place(rng, specs, meaning["relation"], lattice=lattice, sizes=sizes)
    if background is None:
        plain = layout == "canonical" or rng.random() < 0.5
        background = _choice(rng, BACKGROUNDS[: len(NEUTRAL_TONES)] if plain else BACKGROUNDS[len(NEUTRAL_TONES) :])
    return ShapeScene(objects, background, caption_from_metadata(meaning), category, meaning)


# ----------------------------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------------------------


def _parse_background(background: str) -> Tuple[List[int], Optional[str]]:
    """``(grey levels, split)`` of a background name; split is None, ``"v"`` or ``"h"``."""
    try:
        if "+" not in background:
            return [NEUTRAL_TONES[background]], None
        tones, split = background.split(":")
        a, b = tones.split("+")
        if split not in ("v", "h"):
            raise KeyError(split)
        return [NEUTRAL_TONES[a], NEUTRAL_TONES[b]], split
    except (KeyError, ValueError):
        raise ValueError(f"unknown background {background!r}; expected one of {BACKGROUNDS}") from None


def render_scene(scene: ShapeScene, size: int = 64, antialias: bool = True) -> Image.Image:
    """The scene as a ``size`` x ``size`` RGB image (4x supersampled and box-filtered when ``antialias``)."""
    ss = _SUPERSAMPLE if antialias else 1
    side = size * ss
    levels, split = _parse_background(scene.background)
    canvas = Image.new("RGB", (side, side), (levels[0],) * 3)
    draw = ImageDraw.Draw(canvas)
    if split == "v":
        draw.rectangle([side // 2, 0, side, side], fill=(levels[1],) * 3)
    elif split == "h":
        draw.rectangle([0, side // 2, side, side], fill=(levels[1],) * 3)
    for obj in scene.objects:
        if obj.color not in ALL_PALETTE or obj.shape not in ALL_SHAPES:
            raise ValueError(f"unknown object {obj}")
        fill = ALL_PALETTE[obj.color]
        x0, y0, x1, y1 = (v * side for v in obj.box())
        # PIL fills pixel (i, j) when its centre (i + 0.5, j + 0.5) is inside the shape, boundaries included.
        if obj.shape == "circle":
            draw.ellipse([x0, y0, x1 - 1, y1 - 1], fill=fill)
        elif obj.shape == "square":
            draw.rectangle([round(x0), round(y0), round(x1) - 1, round(y1) - 1], fill=fill)
        elif obj.shape == "diamond":
            cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
            draw.polygon([(cx, y0), (x1, cy), (cx, y1), (x0, cy)], fill=fill)
        else:
            draw.polygon([((x0 + x1) / 2, y0), (x1, y1), (x0, y1)], fill=fill)
    return canvas.reduce(ss) if ss > 1 else canvas


# ----------------------------------------------------------------------------------------------------------------
# Data sets
# ----------------------------------------------------------------------------------------------------------------


def _category_probabilities(category_weights: Optional[Dict[str, float]]) -> Optional[np.ndarray]:
    """``make_dataset``'s category probabilities (``None``: uniform, drawn by ``sample_scene``)."""
    if category_weights is None:
        return None
    unknown = sorted(set(category_weights) - set(CATEGORIES))
    if unknown:
        raise ValueError(f"unknown categories {unknown} in category_weights; expected some of {CATEGORIES}")
    w = np.array([float(category_weights.get(c, 0.0)) for c in CATEGORIES])
    if (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
        raise ValueError(f"category_weights {category_weights}: expected finite weights >= 0 with a positive sum")
    return w / w.sum()


def make_dataset_captions(
    n: int,
    seed: int = 0,
    category_weights: Optional[Dict[str, float]] = None,
    grammar: Union[str, Grammar] = "original",
) -> List[str]:
    """The captions of ``make_dataset(n, seed, category_weights=..., grammar=...)``, without rendering: a caption is
    drawn before the scene's geometry, so it does not depend on the other options (a test compares the two)."""
    grammar = get_grammar(grammar)
    p = _category_probabilities(category_weights)
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        if p is None:
            category = _choice(rng, CATEGORIES)
        else:
            category = CATEGORIES[int(rng.choice(len(CATEGORIES), p=p))]
        out.append(caption_from_metadata(_sample_meaning(rng, category, grammar)))
    return out


def make_dataset(
    n: int,
    seed: int = 0,
    size: int = 64,
    lattice: Optional[float] = None,
    sizes: Optional[Tuple[Tuple[float, float], Tuple[float, float]]] = None,
    layout: str = "random",
    unnamed_color: Optional[str] = None,
    background: Optional[str] = None,
    category_weights: Optional[Dict[str, float]] = None,
    grammar: Union[str, Grammar] = "original",
) -> List[Tuple[Image.Image, str, ShapeScene]]:
    """``n`` samples ``(image, caption, scene)``; sample ``i`` is drawn from ``default_rng([seed, i])`` (``lattice``,
    ``sizes``, ``layout``, ``unnamed_color``, ``background``, ``grammar``: see :func:`sample_scene`).

    ``category_weights`` (category -> relative weight; missing categories weigh 0) draws each sample's category with
    these weights instead of uniformly: a training set can give more of its images to the categories with many
    distinct captions (``position`` has about a thousand, ``single_object`` three).
    """
    p = _category_probabilities(category_weights)
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        category = None if p is None else CATEGORIES[int(rng.choice(len(CATEGORIES), p=p))]
        scene = sample_scene(
            rng,
            category=category,
            lattice=lattice,
            sizes=sizes,
            layout=layout,
            unnamed_color=unnamed_color,
            background=background,
            grammar=grammar,
        )
        out.append((render_scene(scene, size), scene.caption, scene))
    return out


def heldout_prompts(
    n: int = 200, seed: int = HELDOUT_SEED, grammar: Union[str, Grammar] = "original"
) -> List[Dict[str, Any]]:
    """A fixed evaluation set of ``n`` prompts, balanced over :data:`CATEGORIES` (round robin), of the original
    grammar (the 200 held-out prompts) or of another (``grammar``: other sets of prompts with the same sampler).

    Each entry is ``{"prompt", "category", "metadata", "seed"}``; ``seed`` is a per-prompt integer a benchmark may use
    to seed the generation of that prompt's image. Some categories have few distinct prompts (``single_object`` has
    3), so prompts repeat, as in GenEval; the set is held out in its draws, not in its prompt strings.
    """
    grammar = get_grammar(grammar)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        category = CATEGORIES[i % len(CATEGORIES)]
        meaning = _sample_meaning(rng, category, grammar)
        out.append(
            {
                "prompt": caption_from_metadata(meaning),
                "category": category,
                "metadata": meaning,
                "seed": int(rng.integers(2**31 - 1)),
            }
        )
    return out
