"""Tests of the captioned-shapes world (``diffusers_var_accel/lab/data/shapes.py``): determinism, grammar, geometry."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import List

import numpy as np
import pytest

from diffusers_var_accel.lab.data import shapes
from diffusers_var_accel.lab.data.scorer import score
from diffusers_var_accel.lab.data.shapes import (
    CATEGORIES,
    COLORS,
    MARGIN,
    PALETTE,
    SHAPES,
    ShapeScene,
    caption_from_metadata,
    heldout_prompts,
    make_dataset,
    parse_prompt,
    render_scene,
    sample_scene,
    vocabulary,
)

#: sha256 of the default held-out prompts joined by newlines; changes only if the world's grammar or sampler does.
HELDOUT_SHA256 = "1dcace1462c7d65da5a3fcd9dc9349573b88308fbaad3e71b806eff2b4083149"


@pytest.fixture(scope="module")
def scenes() -> List[ShapeScene]:
    return [sample_scene(np.random.default_rng([11, i])) for i in range(1500)]


def test_dataset_is_deterministic():
    a = make_dataset(24, seed=3)
    b = make_dataset(24, seed=3)
    assert [c for _, c, _ in a] == [c for _, c, _ in b]
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for (x, _, _), (y, _, _) in zip(a, b))
    assert all(sa == sb for (_, _, sa), (_, _, sb) in zip(a, b))
    # Sample i does not depend on n; another seed gives other samples.
    head = make_dataset(5, seed=3)
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for (x, _, _), (y, _, _) in zip(head, a))
    other = make_dataset(24, seed=4)
    assert [c for _, c, _ in other] != [c for _, c, _ in a]
    # sample_scene accepts an int seed and a Generator alike.
    assert sample_scene(5) == sample_scene(np.random.default_rng(5))


def test_dataset_images():
    for image, caption, scene in make_dataset(6, seed=0, size=128):
        assert image.mode == "RGB" and image.size == (128, 128)
        assert caption == scene.caption
    assert render_scene(sample_scene(0)).size == (64, 64)


def test_every_category_is_produced_uniformly(scenes):
    counts = Counter(s.category for s in scenes)
    assert set(counts) == set(CATEGORIES)
    assert min(counts.values()) >= 0.6 * len(scenes) / len(CATEGORIES)
    for cat in CATEGORIES:
        assert sample_scene(1, category=cat).category == cat
    with pytest.raises(ValueError):
        sample_scene(1, category="nonsense")


def test_captions_parse_back_to_metadata(scenes):
    for s in scenes:
        assert parse_prompt(s.caption) == s.metadata, s.caption
        assert caption_from_metadata(s.metadata) == s.caption
        assert s.metadata["category"] == s.category


def test_scenes_show_what_captions_say(scenes):
    for s in scenes:
        objs = s.metadata["objects"]
        got = Counter(o.shape for o in s.objects)
        want = Counter()
        for o in objs:
            want[o["shape"]] += o["count"]
        assert got == want, s.caption
        for o in objs:
            if o["color"] is not None:
                n = sum(1 for x in s.objects if x.shape == o["shape"] and x.color == o["color"])
                assert n == o["count"], s.caption
        if s.category == "color_attr":
            assert objs[0]["color"] != objs[1]["color"]
        if s.category in ("two_objects", "color_attr", "position"):
            assert objs[0]["shape"] != objs[1]["shape"]
        if s.category == "position":
            (ax, ay), (bx, by) = s.objects[0].center_xy, s.objects[1].center_xy
            along, across = {
                "left of": (bx - ax, ay - by),
                "right of": (ax - bx, ay - by),
                "above": (by - ay, ax - bx),
                "below": (ay - by, ax - bx),
            }[s.metadata["relation"]]
            assert along >= 0.25 and abs(across) < along, s.caption


def assert_inside_and_apart(scene: ShapeScene) -> None:
    """Every box keeps the margin from the canvas edges, and no two boxes touch."""
    for o in scene.objects:
        x0, y0, x1, y1 = o.box()
        assert min(x0, y0) >= MARGIN - 1e-9 and max(x1, y1) <= 1 - MARGIN + 1e-9, scene.caption
    for i, a in enumerate(scene.objects):
        for b in scene.objects[:i]:
            ax0, ay0, ax1, ay1 = a.box()
            bx0, by0, bx1, by1 = b.box()
            assert ax1 < bx0 or bx1 < ax0 or ay1 < by0 or by1 < ay0, scene.caption


def test_objects_inside_canvas_and_apart(scenes):
    for s in scenes:
        for o in s.objects:
            assert o.shape in SHAPES and o.color in PALETTE
            assert o.size * 64 >= 12
        assert_inside_and_apart(s)


def test_rendered_pixels(scenes):
    """Object pixels never touch (pixel masks of separately rendered objects are disjoint, with a gap), interiors
    keep their exact palette colour, and the background is neutral."""
    for s in scenes[:120]:
        bg = render_scene(ShapeScene([], s.background, "", s.category), 64)
        bg_arr = np.asarray(bg).astype(int)
        assert (bg_arr.max(-1) == bg_arr.min(-1)).all()
        full = np.asarray(render_scene(s, 64))
        masks = []
        for o in s.objects:
            one = np.asarray(render_scene(ShapeScene([o], s.background, "", s.category), 64))
            m = (one != bg_arr).any(-1)
            assert m.any()
            ys, xs = np.nonzero(m)
            assert ys.min() > 0 and xs.min() > 0 and ys.max() < 63 and xs.max() < 63
            masks.append(m)
            cx, cy = (int(v * 64) for v in o.center_xy)
            assert tuple(full[cy, cx]) == PALETTE[o.color]
        grown = [
            np.pad(m, 1)[:-2, 1:-1] | np.pad(m, 1)[2:, 1:-1] | np.pad(m, 1)[1:-1, :-2] | np.pad(m, 1)[1:-1, 2:] | m
            for m in masks
        ]
        for i in range(len(masks)):
            for j in range(i):
                assert not (grown[i] & grown[j]).any(), s.caption


def test_vocabulary_covers_captions(scenes):
    vocab = set(vocabulary())
    used = set()
    for s in scenes:
        used |= set(s.caption.split())
    for p in heldout_prompts():
        used |= set(p["prompt"].split())
    assert used <= vocab
    assert used == vocab  # every vocabulary word does occur
    assert vocabulary() == sorted(vocab)


def test_heldout_prompts_fixed_and_balanced():
    held = heldout_prompts()
    assert len(held) == 200
    assert held == heldout_prompts(200)
    digest = hashlib.sha256("\n".join(p["prompt"] for p in held).encode()).hexdigest()
    assert digest == HELDOUT_SHA256
    counts = Counter(p["category"] for p in held)
    assert set(counts) == set(CATEGORIES) and max(counts.values()) - min(counts.values()) <= 1
    for p in held:
        assert parse_prompt(p["prompt"]) == p["metadata"]
        assert p["metadata"]["category"] == p["category"]
    json.dumps(held)  # plain data
    assert heldout_prompts(12, seed=1) != heldout_prompts(12)


def test_parse_prompt_examples():
    assert parse_prompt("a circle") == {
        "category": "single_object",
        "objects": [{"shape": "circle", "color": None, "count": 1}],
        "relation": None,
    }
    assert parse_prompt("  A Blue   Triangle. ")["category"] == "colors"
    m = parse_prompt("two red circles")
    assert m["category"] == "counting" and m["objects"] == [{"shape": "circle", "color": "red", "count": 2}]
    assert parse_prompt("three squares")["objects"][0] == {"shape": "square", "color": None, "count": 3}
    assert parse_prompt("a circle and a square")["category"] == "two_objects"
    assert parse_prompt("a red circle and a green square")["category"] == "color_attr"
    assert parse_prompt("a red circle and a green circle")["category"] == "color_attr"
    m = parse_prompt("a blue square to the left of a yellow triangle")
    assert m == {
        "category": "position",
        "objects": [
            {"shape": "square", "color": "blue", "count": 1},
            {"shape": "triangle", "color": "yellow", "count": 1},
        ],
        "relation": "left of",
    }
    for rel in ("right of", "above", "below"):
        assert parse_prompt(f"a circle {shapes.RELATIONS[rel]} a square")["relation"] == rel
    assert caption_from_metadata(parse_prompt("an orange circle")) == "an orange circle"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "a dog",
        "a red",
        "red circle",
        "two circle",
        "five circles",
        "a circles",
        "one circle",
        "a circle and",
        "a circle and a circle",
        "a red circle and a red circle",
        "a red circle and a square",
        "a circle next to a square",
        "a circle to the left a square",
        "a blue square above a triangle",
        "a circle above a square please",
        "a magenta circle",
        "a star",
    ],
)
def test_parse_prompt_rejects(bad):
    with pytest.raises(ValueError, match="prompt"):
        parse_prompt(bad)
    try:
        parse_prompt(bad)
    except ValueError as e:
        assert repr(bad) in str(e)


def test_enlarged_grammar_adds_words_and_keeps_the_original_draws():
    """The enlarged grammar adds a shape, two colours and a count; the parser reads them; the sampler draws the
    original grammar's prompts exactly as before (the held-out digest above) and, in the enlarged grammar, prompts of
    every category whose strings are not held out."""
    original, enlarged = shapes.GRAMMARS["original"], shapes.GRAMMARS["enlarged"]
    assert vocabulary() == vocabulary("original") == original.words()
    assert set(vocabulary("enlarged")) - set(vocabulary()) == {"diamond", "diamonds", "pink", "cyan", "four"}
    assert parse_prompt("four pink diamonds")["objects"] == [{"shape": "diamond", "color": "pink", "count": 4}]
    assert parse_prompt("a cyan diamond")["category"] == "colors"
    assert shapes.grammar_of(parse_prompt("a cyan circle")) is enlarged
    assert shapes.grammar_of(parse_prompt("four circles")) is enlarged
    assert shapes.grammar_of(parse_prompt("a red circle to the left of a blue square")) is original
    with pytest.raises(ValueError, match="unknown grammar 'larger'"):
        shapes.get_grammar("larger")
    held = {p["prompt"] for p in heldout_prompts()}
    drawn = heldout_prompts(600, seed=5, grammar="enlarged")
    for category in CATEGORIES:
        fresh = {p["prompt"] for p in drawn if p["category"] == category} - held
        assert fresh, category  # string-disjoint prompts of every category exist
    for p in drawn:
        assert parse_prompt(p["prompt"]) == p["metadata"]
        assert caption_from_metadata(p["metadata"]) == p["prompt"]
        assert set(p["prompt"].split()) <= set(vocabulary("enlarged"))
    # every scene of the enlarged world, in either layout, shows what its caption says and its unnamed objects take
    # the enlarged palette's colours
    colors = set()
    for layout, sizes in (("random", None), ("canonical", ((0.25, 0.3), (0.25, 0.3)))):
        for image, caption, scene in make_dataset(60, seed=2, grammar="enlarged", layout=layout, sizes=sizes):
            assert parse_prompt(caption) == scene.metadata
            assert len(scene.objects) == sum(o["count"] for o in scene.metadata["objects"])
            colors |= {o.color for o in scene.objects}
    assert colors & {"pink", "cyan"}
    with pytest.raises(ValueError, match="unnamed_color 'pink'"):
        sample_scene(0, unnamed_color="pink")  # the original world has no pink
    assert sample_scene(0, unnamed_color="pink", grammar="enlarged").objects


def test_render_rejects_unknown_background():
    s = sample_scene(0)
    s.background = "pink"
    with pytest.raises(ValueError):
        render_scene(s)
    assert set(COLORS) == set(PALETTE)


def test_lattice_scenes_have_edges_on_the_lattice_and_the_same_captions():
    """``lattice`` rounds sizes and box corners to multiples of it; captions (drawn first) and the sampler's rules
    (margin, gaps, position) are unchanged."""
    lattice = 1 / 16
    for i in range(300):
        free = sample_scene(np.random.default_rng([5, i]))
        snapped = sample_scene(np.random.default_rng([5, i]), lattice=lattice)
        assert snapped.caption == free.caption and snapped.metadata == free.metadata
        for o in snapped.objects:
            for v in (*o.box(), o.size):
                assert abs(v / lattice - round(v / lattice)) < 1e-9, (snapped.caption, o)
        assert_inside_and_apart(snapped)
        if snapped.category == "position":
            (ax, ay), (bx, by) = snapped.objects[0].center_xy, snapped.objects[1].center_xy
            along = {"left of": bx - ax, "right of": ax - bx, "above": by - ay, "below": ay - by}[
                snapped.metadata["relation"]
            ]
            assert along >= 0.25 - 1e-9
    # Squares of a 1/16 lattice cover whole 4x4 pixel cells at 64x64: every cell is one flat colour.
    scene = sample_scene(np.random.default_rng([5, 0]), category="single_object", lattice=lattice)
    scene.objects[0].shape = "square"
    scene.background = "white"
    cells = np.asarray(render_scene(scene)).reshape(16, 4, 16, 4, 3)
    assert (cells == cells[:, :1, :, :1]).all()
    images = make_dataset(4, seed=2, lattice=lattice)
    assert [c for _, c, _ in images] == [c for _, c, _ in make_dataset(4, seed=2)]


def test_object_size_ranges_can_be_replaced():
    sizes = ((0.25, 0.3125), (0.34, 0.40))
    seen = set()
    for i in range(300):
        scene = sample_scene(np.random.default_rng([6, i]), lattice=1 / 16, sizes=sizes)
        assert scene.caption == sample_scene(np.random.default_rng([6, i])).caption
        seen |= {round(o.size * 64) for o in scene.objects}
    assert seen == {16, 20, 24}  # 4, 5 and 6 cells of the lattice: never the default ranges' 12 px
    assert {round(o.size * 64) for _, _, s in make_dataset(40, seed=1, sizes=sizes) for o in s.objects} >= {16}


def test_canonical_layout_follows_the_caption():
    """``layout="canonical"``: fixed places from the caption (one in the middle, two in a row in the order named or a
    column for above / below, three in a triangle), one size per scene, a plain background; captions unchanged."""
    sizes = ((0.25, 0.3125), (0.34, 0.40))
    for i in range(300):
        scene = sample_scene(np.random.default_rng([8, i]), lattice=1 / 16, sizes=sizes, layout="canonical")
        assert scene.caption == sample_scene(np.random.default_rng([8, i])).caption
        assert "+" not in scene.background
        assert len({o.size for o in scene.objects}) == 1
        centers = [o.center_xy for o in scene.objects]
        assert_inside_and_apart(scene)
        if len(centers) == 1:
            assert abs(centers[0][0] - 0.5) <= 1 / 16 and abs(centers[0][1] - 0.5) <= 1 / 16
        relation = scene.metadata["relation"]
        if len(centers) == 2:
            (ax, ay), (bx, by) = centers
            want = {"left of": bx - ax, "right of": ax - bx, "above": by - ay, "below": ay - by}.get(relation, bx - ax)
            assert want >= 0.25, scene.caption
        if scene.category == "position":
            assert score(scene.caption, render_scene(scene))["correct"], scene.caption
    with pytest.raises(ValueError, match="layout"):
        sample_scene(1, layout="grid")
    with pytest.raises(ValueError, match="does not fit the canonical layout"):  # two 0.45 boxes cannot sit in a row
        for i in range(20):
            sample_scene(np.random.default_rng([8, i]), sizes=((0.45, 0.45), (0.45, 0.45)), layout="canonical")


def test_unnamed_color_and_background_make_a_scene_a_function_of_its_caption():
    """``unnamed_color`` colours every object whose caption names no colour, ``background`` fixes the background; with
    the canonical layout and one size, two scenes with the same caption are the same image. Captions unchanged."""
    world = dict(
        lattice=1 / 16,
        sizes=((0.375, 0.375), (0.375, 0.375)),
        layout="canonical",
        unnamed_color="blue",
        background="black",
    )
    by_caption = {}
    for i in range(400):
        scene = sample_scene(np.random.default_rng([9, i]), **world)
        assert scene.caption == sample_scene(np.random.default_rng([9, i])).caption
        assert scene.background == "black"
        named = [o["color"] for o in scene.metadata["objects"] for _ in range(o["count"])]
        assert [o.color for o in scene.objects] == [c or "blue" for c in named]
        image = np.asarray(render_scene(scene))
        if scene.caption in by_caption:
            assert np.array_equal(by_caption[scene.caption], image), scene.caption
        by_caption[scene.caption] = image
        if i < 120:
            assert score(scene.caption, image)["correct"], scene.caption
    assert len(by_caption) < 400  # some captions repeated, so the equality above was exercised
    assert [c for _, c, _ in make_dataset(5, seed=3, **world)] == [c for _, c, _ in make_dataset(5, seed=3)]
    with pytest.raises(ValueError, match="unnamed_color 'pink'"):
        sample_scene(1, unnamed_color="pink")
    with pytest.raises(ValueError, match="background 'navy'"):
        sample_scene(1, background="navy")


def test_category_weights_change_how_often_each_category_is_drawn():
    weights = {"position": 3, "color_attr": 1}
    data = make_dataset(200, seed=4, category_weights=weights)
    counts = Counter(scene.category for _, _, scene in data)
    assert set(counts) == {"position", "color_attr"} and counts["position"] > 2 * counts["color_attr"]
    assert all(score(caption, image)["correct"] for image, caption, _ in data[:40])
    assert [c for _, c, _ in make_dataset(30, seed=4)] == [
        c for _, c, _ in make_dataset(30, seed=4, category_weights=None)
    ]
    with pytest.raises(ValueError, match="unknown categories \\['colour'\\]"):
        make_dataset(1, category_weights={"colour": 1})
    with pytest.raises(ValueError, match="category_weights"):
        make_dataset(1, category_weights={"position": 0})
