"""Tests of the GenEval-style shapes scorer (``diffusers_var_accel/lab/data/scorer.py``).

Ground truth rendered by the world must be judged correct (clean, at 64 and 128 px, and with mild noise or blur), and
images corrupted so that they contradict their prompt must be judged wrong.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional

import numpy as np
import pytest
from PIL import Image, ImageFilter

from diffusers_var_accel.lab.data.scorer import classify_shape, detect_objects, relations_between, score, score_batch
from diffusers_var_accel.lab.data.shapes import (
    CATEGORIES,
    COLORS,
    PALETTE,
    SHAPES,
    ShapeObject,
    ShapeScene,
    render_scene,
    sample_scene,
)


def _scenes(category: str, n: int, seed: int) -> List[ShapeScene]:
    return [sample_scene(np.random.default_rng([seed, i]), category) for i in range(n)]


def _accuracy(scenes: List[ShapeScene], size: int = 64, corrupt: Optional[Callable[[Image.Image], object]] = None):
    prompts, images = [], []
    for s in scenes:
        img = render_scene(s, size)
        images.append(corrupt(img) if corrupt else img)
        prompts.append(s.caption)
    return score_batch(prompts, images)


def _noisy(seed: int) -> Callable[[Image.Image], np.ndarray]:
    rng = np.random.default_rng(seed)

    def f(img: Image.Image) -> np.ndarray:
        a = np.asarray(img, dtype=np.float32) + rng.normal(0.0, 8.0, (img.height, img.width, 3))
        return np.clip(np.round(a), 0, 255).astype(np.uint8)

    return f


# ---------------------------------------------------------------------------------------------------------------
# Ground truth is correct
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("category", CATEGORIES)
def test_ground_truth_64(category):
    r = _accuracy(_scenes(category, 300, seed=101), 64)
    assert r["n"] == 300 and list(r["per_category"]) == [category]
    assert r["per_category"][category] >= 0.98, r["per_category"]


def test_ground_truth_128():
    scenes = [s for c in CATEGORIES for s in _scenes(c, 50, seed=102)]
    r = _accuracy(scenes, 128)
    assert r["n"] == 300 and set(r["per_category"]) == set(CATEGORIES)
    assert min(r["per_category"].values()) >= 0.98, r["per_category"]
    assert r["overall"] >= 0.98


@pytest.mark.parametrize(
    "name,corrupt",
    [
        ("noise", _noisy(0)),  # Gaussian, sigma = 8/255
        ("box_blur", lambda im: im.filter(ImageFilter.BoxBlur(1))),  # 3x3 box
        ("gaussian_blur", lambda im: im.filter(ImageFilter.GaussianBlur(1))),  # sigma = 1 px
    ],
    ids=["noise", "box_blur", "gaussian_blur"],
)
def test_ground_truth_robust_to_mild_degradation(name, corrupt):
    scenes = [s for c in CATEGORIES for s in _scenes(c, 50, seed=103)]
    r = _accuracy(scenes, 64, corrupt)
    assert min(r["per_category"].values()) >= 0.95, (name, r["per_category"])


def test_input_formats():
    s = sample_scene(np.random.default_rng(5), "position")
    img = render_scene(s)
    arr = np.asarray(img)
    for x in (img, arr, arr.astype(np.float32) / 255.0, np.moveaxis(arr, -1, 0), img.convert("RGBA")):
        assert score(s.caption, x)["correct"]
    r = score(s.caption, img)
    assert r["category"] == "position" and r["details"]["parsed"] == s.metadata
    with pytest.raises(ValueError):
        score("a dog", img)


# ---------------------------------------------------------------------------------------------------------------
# Corrupted images are wrong
# ---------------------------------------------------------------------------------------------------------------


def _all_wrong(scenes: List[ShapeScene], edit: Callable[[ShapeScene], ShapeScene], size: int = 64):
    for s in scenes:
        bad = edit(s)
        r = score(s.caption, render_scene(bad, size))
        assert not r["correct"], (s.caption, bad.objects, r["details"]["reason"])


def _with_objects(s: ShapeScene, objects: List[ShapeObject]) -> ShapeScene:
    return dataclasses.replace(s, objects=objects)


def _other(value: str, choices, k: int) -> str:
    rest = [c for c in choices if c != value]
    return rest[k % len(rest)]


def test_wrong_colour():
    scenes = _scenes("colors", 40, seed=201)
    _all_wrong(
        scenes,
        lambda s: _with_objects(
            s, [dataclasses.replace(o, color=_other(o.color, COLORS, i)) for i, o in enumerate(s.objects)]
        ),
    )
    # color_attr: one object recoloured to a colour the prompt does not give it.
    scenes = _scenes("color_attr", 40, seed=202)
    _all_wrong(
        scenes, lambda s: _with_objects(s, [dataclasses.replace(s.objects[0], color=s.objects[1].color), s.objects[1]])
    )
    # counting with a colour: one of the N objects recoloured.
    scenes = [s for s in _scenes("counting", 80, seed=203) if s.metadata["objects"][0]["color"]]
    _all_wrong(
        scenes,
        lambda s: _with_objects(
            s, [dataclasses.replace(s.objects[0], color=_other(s.objects[0].color, COLORS, 1))] + s.objects[1:]
        ),
    )


@pytest.mark.parametrize("category", ["two_objects", "counting", "color_attr", "position"])
def test_object_removed(category):
    scenes = _scenes(category, 40, seed=301)
    _all_wrong(scenes, lambda s: _with_objects(s, s.objects[1:]))
    _all_wrong(scenes, lambda s: _with_objects(s, s.objects[:-1]))


def test_position_swapped():
    scenes = _scenes("position", 200, seed=401)

    def swap(s: ShapeScene) -> ShapeScene:
        a, b = s.objects
        a2, b2 = dataclasses.replace(a, center_xy=b.center_xy), dataclasses.replace(b, center_xy=a.center_xy)
        return _with_objects(s, [a2, b2])

    _all_wrong(scenes[:80], swap)
    # Mirroring the image along the relation's axis flips the relation too.
    horizontal = [s for s in scenes if s.metadata["relation"] in ("left of", "right of")][:30]
    vertical = [s for s in scenes if s.metadata["relation"] in ("above", "below")][:30]
    for group, flip in ((horizontal, Image.Transpose.FLIP_LEFT_RIGHT), (vertical, Image.Transpose.FLIP_TOP_BOTTOM)):
        assert group
        for s in group:
            assert score(s.caption, render_scene(s))["correct"]
            assert not score(s.caption, render_scene(s).transpose(flip))["correct"], s.caption


@pytest.mark.parametrize("category", ["single_object", "colors", "counting", "two_objects", "position", "color_attr"])
def test_shape_replaced(category):
    scenes = _scenes(category, 40, seed=501)

    def replace(s: ShapeScene) -> ShapeScene:
        objs = list(s.objects)
        # Replace by a shape the prompt does not mention (where there is one), so the edit cannot be neutral.
        named = {o["shape"] for o in s.metadata["objects"]}
        free = [x for x in SHAPES if x not in named] or [x for x in SHAPES if x != objs[0].shape]
        objs[0] = dataclasses.replace(objs[0], shape=free[0])
        return _with_objects(s, objs)

    _all_wrong(scenes, replace)


def test_circle_drawn_as_square_and_back():
    for i in range(30):
        for src, dst in (("circle", "square"), ("square", "circle"), ("triangle", "circle"), ("circle", "triangle")):
            s = sample_scene(np.random.default_rng([601, i]), "colors")
            obj = dataclasses.replace(s.objects[0], shape=src)
            prompt = f"{'an' if obj.color == 'orange' else 'a'} {obj.color} {src}"
            assert score(prompt, render_scene(_with_objects(s, [obj])))["correct"]
            assert not score(prompt, render_scene(_with_objects(s, [dataclasses.replace(obj, shape=dst)])))["correct"]


@pytest.mark.parametrize("size", [64, 128])
def test_blank_image_is_wrong(size):
    scenes = [s for c in CATEGORIES for s in _scenes(c, 10, seed=701)]
    _all_wrong(scenes, lambda s: _with_objects(s, []), size)
    assert detect_objects(np.zeros((size, size, 3), np.uint8)) == []
    noise = np.random.default_rng(0).integers(0, 256, (size, size, 3)).astype(np.uint8)
    assert all(o["shape"] is None or o["area"] < 0.01 * size * size for o in detect_objects(noise))


def test_extra_object_breaks_counting():
    """N + 1 objects of the counted kind are not N (the extra object goes wherever it fits)."""
    tried = 0
    spots = [(x, y) for x in (0.15, 0.5, 0.85) for y in (0.15, 0.5, 0.85)]
    for i in range(30):
        s = sample_scene(np.random.default_rng([801, i]), "counting")
        if len(s.objects) != 2:
            continue
        for spot in spots:
            extra = dataclasses.replace(s.objects[0], center_xy=spot, size=0.19)
            x0, y0, x1, y1 = extra.box()
            if all(
                x1 + 0.03 < b[0] or b[2] + 0.03 < x0 or y1 + 0.03 < b[1] or b[3] + 0.03 < y0
                for b in (o.box() for o in s.objects)
            ):
                break
        else:
            continue
        assert score(s.caption, render_scene(s))["correct"]
        assert not score(s.caption, render_scene(_with_objects(s, s.objects + [extra])))["correct"], s.caption
        tried += 1
    assert tried >= 5


# ---------------------------------------------------------------------------------------------------------------
# Pieces
# ---------------------------------------------------------------------------------------------------------------


def test_detect_objects_reports_colour_shape_and_box():
    obj = ShapeObject("triangle", "purple", (0.3, 0.6), 0.3)
    img = render_scene(ShapeScene([obj], "white+black:v", "a purple triangle", "colors"), 64)
    (det,) = detect_objects(img)
    assert det["shape"] == "triangle" and det["color"] == "purple"
    x0, y0, x1, y1 = det["box"]
    assert abs((x0 + x1) / 2 - 0.3 * 64) <= 1 and abs((y0 + y1) / 2 - 0.6 * 64) <= 1
    assert abs((x1 - x0) - 0.3 * 64) <= 2


def test_classify_shape_on_ideal_masks():
    yy, xx = np.mgrid[0:40, 0:40] + 0.5
    circle = (xx - 20) ** 2 + (yy - 20) ** 2 <= 15**2
    square = np.zeros((40, 40), bool)
    square[5:35, 5:35] = True
    tri = (np.abs(xx - 20) <= 0.5 * (yy - 5)) & (yy <= 35)
    assert classify_shape(circle)[0] == "circle"
    assert classify_shape(square)[0] == "square"
    assert classify_shape(tri)[0] == "triangle"
    assert classify_shape(tri[::-1])[0] == "triangle"  # apex down still counts
    ring = circle & ~((xx - 20) ** 2 + (yy - 20) ** 2 <= 12**2)
    assert classify_shape(ring)[0] is None


def test_relations_follow_geneval():
    a = {"box": (0, 20, 10, 30)}
    b = {"box": (30, 22, 40, 32)}
    assert relations_between(a, b) == {"left of"}
    assert relations_between(b, a) == {"right of"}
    c = {"box": (2, 50, 12, 60)}
    assert relations_between(a, c) == {"above"} and relations_between(c, a) == {"below"}
    assert relations_between(a, {"box": (1, 21, 11, 31)}) == set()


def test_score_batch_aggregates():
    scenes = [sample_scene(np.random.default_rng([901, i]), c) for i, c in enumerate(CATEGORIES)]
    images = [render_scene(s) for s in scenes]
    images[0] = render_scene(_with_objects(scenes[0], []))
    r = score_batch([s.caption for s in scenes], images)
    assert r["n"] == 6 and r["correct"] == [False] + [True] * 5
    assert r["per_category"][CATEGORIES[0]] == 0.0
    assert r["overall"] == pytest.approx(5 / 6) and r["overall_images"] == pytest.approx(5 / 6)
    with pytest.raises(ValueError):
        score_batch(["a circle"], [])
    assert PALETTE  # palette exported for documentation


# ----------------------------------------------------------------------------------------------------------------
# the enlarged grammar (diamond, pink, cyan, four)
# ----------------------------------------------------------------------------------------------------------------
def _enlarged_scenes(category: str, n: int, seed: int) -> List[ShapeScene]:
    return [sample_scene(np.random.default_rng([seed, i]), category, grammar="enlarged") for i in range(n)]


@pytest.mark.parametrize("size", [64, 128])
def test_enlarged_ground_truth_and_degradation(size):
    """Ground truth of the enlarged world is judged correct, clean and with noise or blur, read within that world."""
    scenes = [s for c in CATEGORIES for s in _enlarged_scenes(c, 50, seed=801)]
    assert {o.shape for s in scenes for o in s.objects} >= {"diamond"}
    assert {o.color for s in scenes for o in s.objects} >= {"pink", "cyan"}
    prompts = [s.caption for s in scenes]
    clean = score_batch(prompts, [render_scene(s, size) for s in scenes], grammar="enlarged")
    assert min(clean["per_category"].values()) >= 0.98, clean["per_category"]
    blurred = [render_scene(s, size).filter(ImageFilter.GaussianBlur(size / 64)) for s in scenes]
    r = score_batch(prompts, blurred, grammar="enlarged")
    assert min(r["per_category"].values()) >= 0.95, r["per_category"]


def test_enlarged_words_are_checked():
    """Read within the enlarged world: a diamond is no square or circle and the reverse; pink and cyan are told from
    their neighbours; four means exactly four; a prompt's words must be in the grammar it is read in."""
    base = sample_scene(np.random.default_rng(9), "colors", grammar="enlarged")
    for src, dst in (("diamond", "square"), ("square", "diamond"), ("diamond", "circle"), ("circle", "diamond")):
        for color, other in (("pink", "red"), ("cyan", "blue"), ("red", "pink"), ("blue", "cyan")):
            obj = dataclasses.replace(base.objects[0], shape=src, color=color)
            prompt = f"a {color} {src}"
            assert score(prompt, render_scene(_with_objects(base, [obj])), "enlarged")["correct"], prompt
            wrong_shape = render_scene(_with_objects(base, [dataclasses.replace(obj, shape=dst)]))
            assert not score(prompt, wrong_shape, "enlarged")["correct"], (prompt, dst)
            wrong_colour = render_scene(_with_objects(base, [dataclasses.replace(obj, color=other)]))
            assert not score(prompt, wrong_colour, "enlarged")["correct"], (prompt, other)
    four = [s for s in _enlarged_scenes("counting", 80, seed=802) if s.metadata["objects"][0]["count"] == 4]
    assert four
    for s in four[:10]:
        assert score(s.caption, render_scene(s), grammar="enlarged")["correct"], s.caption
        assert not score(s.caption, render_scene(_with_objects(s, s.objects[:3])), grammar="enlarged")["correct"]
    with pytest.raises(ValueError, match="outside the grammar 'original'"):
        score("a pink circle", render_scene(base), grammar="original")
    with pytest.raises(ValueError, match="outside the grammar 'original'"):  # a count of the enlarged grammar
        score("four circles", render_scene(base), grammar="original")


def test_original_prompts_are_judged_as_before_the_grammar_grew():
    """By default a prompt of the original grammar is read with the six colours and three shapes only, so a pink
    object is no object and a diamond is read as its nearest original shape, or none (as before the enlarged words
    existed)."""
    base = sample_scene(np.random.default_rng(11), "colors")
    pink = render_scene(_with_objects(base, [dataclasses.replace(base.objects[0], color="pink", shape="circle")]))
    assert detect_objects(pink) == [] and detect_objects(pink, "enlarged")[0]["color"] == "pink"
    diamond = render_scene(_with_objects(base, [dataclasses.replace(base.objects[0], shape="diamond")]))
    assert detect_objects(diamond)[0]["shape"] in ("circle", "square", "triangle", None)
    assert detect_objects(diamond, "enlarged")[0]["shape"] == "diamond"
    lenient = detect_objects(render_scene(base), strict=False)[0]["features"]
    assert set(lenient) == {"circle", "square", "triangle", "aspect"}
    strict = detect_objects(render_scene(base))[0]["features"]
    assert set(strict) - set(lenient) >= {"elongation", "corners", "template_shape"} and "diamond" not in strict


def _drawn(kind: str, size: float, aspect: float = 1.0, corners: int = 6, turn: float = 0.0, color=(220, 30, 30)):
    """A 64 x 64 image of one red shape on black, drawn at 8x and box-filtered (antialiased like the renderer)."""
    from PIL import Image, ImageDraw

    ss, c = 8, 32 * 8
    big = Image.new("RGB", (64 * ss, 64 * ss), (15, 15, 15))
    draw = ImageDraw.Draw(big)
    w, h = size * aspect * ss, size * ss
    box = [c - w / 2, c - h / 2, c + w / 2, c + h / 2]
    if kind == "rectangle":
        draw.rectangle(box, fill=color)
    elif kind == "ellipse":
        draw.ellipse(box, fill=color)
    elif kind == "triangle":
        draw.polygon([(c, box[1]), (box[2], box[3]), (box[0], box[3])], fill=color)
    else:  # a regular polygon
        r = h / 2
        angles = [2 * np.pi * i / corners + turn - np.pi / 2 for i in range(corners)]
        draw.polygon([(c + r * np.cos(a), c + r * np.sin(a)) for a in angles], fill=color)
    return big.resize((64, 64), Image.BOX)


@pytest.mark.parametrize("size", [12, 18, 24])
def test_strict_shapes_tell_squares_from_rectangles_and_circles_from_ellipses_and_polygons(size):
    """The lenient scorer (``strict=False``, before 2026-12-06) took each of these for the named shape; the strict
    one rejects it and still accepts the true shape."""
    cases = {
        "a red square": [_drawn("rectangle", size, 1.5), _drawn("rectangle", size, 1 / 1.5)],
        "a red circle": [
            _drawn("ellipse", size, 2.0),
            _drawn("ellipse", size, 1.5),
            _drawn("polygon", size, corners=6),
            _drawn("polygon", size, corners=6, turn=np.pi / 6),
            _drawn("polygon", size, corners=5),
        ],
        "a red triangle": [_drawn("rectangle", size)],
    }
    truths = {
        "a red square": _drawn("rectangle", size),
        "a red circle": _drawn("ellipse", size),
        "a red triangle": _drawn("triangle", size),
    }
    for prompt, wrong in cases.items():
        assert score(prompt, truths[prompt])["correct"], prompt
        for image in wrong:
            assert not score(prompt, image)["correct"], prompt
    for prompt in ("a red square", "a red circle"):  # the leniency the strict rules remove
        assert all(score(prompt, image, strict=False)["correct"] for image in cases[prompt])


def test_strict_rules_read_elongation_and_corners():
    from diffusers_var_accel.lab.data.scorer import shape_holds

    def geometry(image):
        return detect_objects(image)[0]["features"]

    assert geometry(_drawn("ellipse", 20, 2.0))["elongation"] == pytest.approx(2.0, abs=0.05)
    assert geometry(_drawn("rectangle", 20, 1.5))["elongation"] == pytest.approx(1.5, abs=0.05)
    assert [geometry(_drawn("polygon", 20, corners=n))["corners"] for n in (5, 6)] == [5, 6]
    assert geometry(_drawn("ellipse", 20))["corners"] == 0
    assert geometry(_drawn("rectangle", 20))["corners"] == 4
    assert geometry(_drawn("triangle", 20))["corners"] == 3
    hexagon = geometry(_drawn("polygon", 20, corners=6))
    assert hexagon["template_shape"] == "circle" and hexagon["rejected"].startswith("6 corners (harmonic 0.0")
    assert shape_holds("square", {"elongation": 1.0, "corners": 3}) == (False, "3 corners, 4 wanted")
    assert shape_holds("triangle", {"elongation": 1.6, "corners": 3}) == (True, "")
