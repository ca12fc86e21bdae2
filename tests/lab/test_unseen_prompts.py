"""The string-disjoint test set (``lab/data/unseen.py``): no list the packaged model met holds one of its strings,
and no selection path reads it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from diffusers_var_accel.lab.calibration import calibrate, calibration_prompts, choose
from diffusers_var_accel.lab.data import shapes, unseen
from diffusers_var_accel.lab.data.shapes import CATEGORIES, caption_from_metadata, heldout_prompts, parse_prompt
from diffusers_var_accel.lab.selection import selecting

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def training_captions():
    return unseen.packaged_training_captions()


def test_dataset_captions_are_make_datasets():
    world = dict(lattice=1 / 16, sizes=((0.375, 0.375), (0.375, 0.375)), layout="canonical", background="black")
    weights = dict(single_object=0.5, colors=0.5, counting=1, two_objects=1.5, position=3, color_attr=2)
    for kwargs in (dict(), dict(category_weights=weights, **world)):
        rendered = [c for _, c, _ in shapes.make_dataset(40, seed=3, size=32, **kwargs)]
        drawn = shapes.make_dataset_captions(40, seed=3, category_weights=kwargs.get("category_weights"))
        assert rendered == drawn


def test_the_set_is_fixed_balanced_and_in_the_grammar():
    entries = unseen.unseen_prompts()
    assert entries == unseen.unseen_prompts()
    assert len(entries) == 2 * unseen.PER_CATEGORY
    assert [e["category"] for e in entries[:4]] == ["color_attr", "position"] * 2
    assert len({e["prompt"] for e in entries}) == len(entries)
    for e in entries:
        assert parse_prompt(e["prompt"]) == e["metadata"]
        assert not unseen.sampler_can_draw(e["metadata"])
    with pytest.raises(ValueError, match="no strings outside"):
        unseen.unseen_prompts(categories=("counting",))
    with pytest.raises(ValueError, match="per_category"):
        unseen.unseen_prompts(per_category=127)


def test_disjoint_from_every_list_the_model_met(training_captions):
    strings = {e["prompt"] for e in unseen.unseen_prompts(per_category=126)}
    lists = {
        "training captions": training_captions,
        "validation (sampling settings)": {e["prompt"] for e in heldout_prompts(120, seed=1)},
        "held-out by seed": {e["prompt"] for e in heldout_prompts()},
        "calibration prompts": set(calibration_prompts(300)),
        "tokenizer check scenes": set(shapes.make_dataset_captions(240, seed=1000)),
    }
    for folder in sorted((ROOT / "diffusers_var_accel" / "presets").glob("*/*/calibration.json")):
        lists[str(folder)] = set(json.loads(folder.read_text())["prompts"])
    for name, seen in lists.items():
        assert seen and not strings & seen, name


def test_the_other_categories_are_exhausted(training_captions):
    """Every string of the four categories the set leaves out is a training caption of the packaged model."""
    coverage = unseen.category_coverage()
    for category in CATEGORIES:
        meanings = unseen.grammar_strings(category)
        assert all(parse_prompt(caption_from_metadata(m)) == m for m in meanings)
        total, drawable, trained = coverage[category]
        assert total == len(meanings) and drawable == trained
        assert (total > drawable) == (category in unseen.UNSEEN_CATEGORIES)


def test_selection_paths_never_read_it():
    for path in (
        "diffusers_var_accel/lab/calibration.py",
        "scripts/embedded_sampling_check.py",
        "scripts/train_embedded.py",
        "scripts/calibration_frontier.py",
    ):
        source = (ROOT / path).read_text()
        assert "data.unseen" not in source and "unseen_prompts" not in source, path
    decorated = {}
    for path in ("scripts/embedded_sampling_check.py", "scripts/train_embedded.py"):
        for node in ast.parse((ROOT / path).read_text()).body:
            if isinstance(node, ast.FunctionDef):
                decorated[path, node.name] = [ast.unparse(d) for d in node.decorator_list]
    assert decorated["scripts/embedded_sampling_check.py", "main"] == ["decides('the sampling check')"]
    assert decorated["scripts/train_embedded.py", "evaluate_validation"] == ['decides("training\'s validation")']


def test_reading_it_while_deciding_raises():
    class ReadsTheTestSet(list):
        def __iter__(self):
            return iter([e["prompt"] for e in unseen.unseen_prompts()])

    with pytest.raises(RuntimeError, match="a calibration search was deciding"):
        calibrate(None, "lazyvar", target_flops_ratio=2.0, prompts=ReadsTheTestSet())
    with pytest.raises(RuntimeError, match="a calibration choice was deciding"):
        choose(ReadsTheTestSet(), target_flops_ratio=2.0)
    with selecting("a test"), pytest.raises(RuntimeError, match="a test was deciding"):
        unseen.unseen_prompts()
    assert len(unseen.unseen_prompts()) == 2 * unseen.PER_CATEGORY
