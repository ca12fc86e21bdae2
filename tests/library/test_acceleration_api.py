"""The acceleration API around the schedulers: the pipeline component, attach/detach, specs, composition, JSON."""

from __future__ import annotations

import json

import pytest
import torch

from diffusers_var_accel import FastVARScheduler, IdentityScheduler, InfinityPipeline, LazyVARScheduler
from diffusers_var_accel.schedulers.composition import ComposedScheduler
from diffusers_var_accel.schedulers.scheduling_var_base import VARAccelScheduler
from diffusers_var_accel.schedulers.specs import load_acceleration
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

SIZE = dict(height=256, width=256)


@pytest.fixture(scope="module")
def pipe():
    p = build_tiny_infinity_pipeline(seed=0, depth=4)
    p.set_progress_bar_config(disable=True)
    return p


def _latents(pipe, **kwargs):
    return pipe(
        "a red circle", generator=torch.Generator().manual_seed(0), output_type="latent", **SIZE, **kwargs
    ).images


def test_acceleration_component_round_trips_through_save_and_from_pretrained(pipe, tmp_path):
    lazy = LazyVARScheduler.from_preset("infinity", keep_ratios=[0.5, 0.3, 0.2, 0.1])
    expected = _latents(pipe, acceleration=lazy)
    pipe.save_pretrained(tmp_path / "plain")
    loaded = InfinityPipeline.from_pretrained(tmp_path / "plain", acceleration=lazy)
    loaded.set_progress_bar_config(disable=True)
    assert loaded.acceleration is lazy
    assert torch.equal(_latents(loaded), expected)

    loaded.save_pretrained(tmp_path / "accelerated")
    config = json.loads((tmp_path / "accelerated" / "acceleration" / "acceleration_config.json").read_text())
    assert config["_class_name"] == "LazyVARScheduler" and config["keep_ratios"] == [0.5, 0.3, 0.2, 0.1]
    index = json.loads((tmp_path / "accelerated" / "model_index.json").read_text())
    assert index["acceleration"][1] == "LazyVARScheduler"
    reloaded = InfinityPipeline.from_pretrained(tmp_path / "accelerated")
    reloaded.set_progress_bar_config(disable=True)
    assert isinstance(reloaded.acceleration, LazyVARScheduler)
    assert torch.equal(_latents(reloaded), expected)


def test_enable_disable_and_per_call_acceleration(pipe):
    baseline = _latents(pipe)
    pipe.enable_lazyvar()
    accelerated = _latents(pipe)
    assert not torch.equal(accelerated, baseline)
    # a per-call scheduler overrides the attached one, for that call only
    assert torch.equal(_latents(pipe, acceleration=IdentityScheduler()), baseline)
    assert torch.equal(_latents(pipe), accelerated)
    pipe.enable_fastvar(pruned_layers=None)
    pipe.disable_acceleration()
    assert pipe.acceleration is None
    assert torch.equal(_latents(pipe), baseline)


def test_scheduler_for_another_family_is_rejected_everywhere(pipe, tmp_path):
    hart = LazyVARScheduler.from_preset("hart")
    with pytest.raises(ValueError, match="hart"):
        pipe.enable_acceleration(hart)
    with pytest.raises(ValueError, match="hart"):
        _latents(pipe, acceleration=hart)
    with pytest.raises(ValueError, match="VARAccelScheduler or a method name"):
        pipe.enable_acceleration(3)
    pipe.save_pretrained(tmp_path / "p")
    with pytest.raises(ValueError, match="hart"):
        InfinityPipeline.from_pretrained(tmp_path / "p", acceleration=hart)


def test_from_pretrained_overrides_and_unknown_keys(tmp_path):
    FastVARScheduler.from_preset("infinity").save_pretrained(tmp_path)
    loaded = FastVARScheduler.from_pretrained(tmp_path, prune_ratios=[0.3, 0.6])
    assert list(loaded.config.prune_ratios) == [0.3, 0.6]
    assert isinstance(VARAccelScheduler.from_pretrained(tmp_path), FastVARScheduler)
    with pytest.raises(ValueError, match="keep_ratio"):
        FastVARScheduler.from_pretrained(tmp_path, keep_ratio=0.5)
    with pytest.raises(ValueError, match="FastVARScheduler"):
        LazyVARScheduler.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="presets exist"):
        FastVARScheduler.from_preset("sd3")


def test_load_acceleration_specs(tmp_path):
    assert load_acceleration("baseline", "infinity") is None
    fast = load_acceleration("fastvar:skip_last_scales=false,prune_ratios=[0.2,0.3]", "infinity")
    assert isinstance(fast, FastVARScheduler) and fast.config.skip_last_scales is False
    assert list(fast.config.prune_ratios) == [0.2, 0.3]
    LazyVARScheduler().save_pretrained(tmp_path)
    assert isinstance(load_acceleration(str(tmp_path), "infinity"), LazyVARScheduler)
    assert isinstance(load_acceleration(str(tmp_path / "acceleration_config.json"), "infinity"), LazyVARScheduler)
    with pytest.raises(ValueError, match="unknown acceleration"):
        load_acceleration("turbo", "infinity")
    with pytest.raises(ValueError, match="key=value"):
        load_acceleration("lazyvar:oops", "infinity")


def test_composed_scheduler_json_round_trip_and_conflicts(pipe, tmp_path):
    composed = ComposedScheduler(
        [
            LazyVARScheduler(),
            FastVARScheduler(
                prune_scales=(-5,), prune_ratios=(0.5,), cache_scale=-6, skip_last_scales=False, pruned_layers=None
            ),
        ]
    )
    composed.save_pretrained(tmp_path)
    again = VARAccelScheduler.from_pretrained(tmp_path)
    assert isinstance(again, ComposedScheduler)
    assert [type(m) for m in again.members] == [LazyVARScheduler, FastVARScheduler]
    assert torch.equal(_latents(pipe, acceleration=composed), _latents(pipe, acceleration=again))
    both_group = ComposedScheduler(
        [LazyVARScheduler(), LazyVARScheduler(group_scales=(-2, -1), keep_ratios=(0.5, 0.5))]
    )
    with pytest.raises(ValueError, match="both group scales"):
        _latents(pipe, acceleration=both_group)
    with pytest.raises(ValueError, match="at least one"):
        ComposedScheduler([])


def test_split_acceleration_specs_keeps_overrides_together():
    from diffusers_var_accel.schedulers.specs import split_acceleration_specs

    assert split_acceleration_specs("baseline, fastvar:skip_last_scales=false,prune_ratios=[0.2,0.3],lazyvar") == [
        "baseline",
        "fastvar:skip_last_scales=false,prune_ratios=[0.2,0.3]",
        "lazyvar",
    ]
    assert split_acceleration_specs("arvar:branch_halving_scales=[-2,-1]") == ["arvar:branch_halving_scales=[-2,-1]"]


def test_a_bad_override_names_the_preset_it_was_given_over():
    """An override that fits the paper's preset but not the model's own (one keep ratio more than the embedded
    preset's group has scales) says which preset and what it holds."""
    from diffusers_var_accel import InfinityPipeline, LazyVARScheduler

    group = list(LazyVARScheduler.from_pretrained("embedded/lazyvar").config.group_scales)
    too_many = tuple(round(0.4 / 2**i, 4) for i in range(len(group) + 1))
    pipe = InfinityPipeline.from_pretrained("embedded")
    with pytest.raises(ValueError) as err:
        pipe.enable_lazyvar(keep_ratios=too_many)
    message = str(err.value)
    assert message.startswith(f"lazyvar with keep_ratios={too_many} over the preset embedded/lazyvar (")
    assert (
        f"group_scales={group}" in message
        and f"need one keep ratio per scale of the group: {len(group)} scales, {len(too_many)} ratios" in message
    )
    assert pipe.acceleration is None  # nothing attached
    fitting = too_many[: len(group)]
    assert pipe.enable_lazyvar(keep_ratios=fitting).config.keep_ratios == fitting


def test_a_saved_copy_of_the_embedded_model_keeps_its_own_presets(tmp_path):
    """The pipeline carries what it is into its saved folder: ``preset_model`` is a ``model_index.json`` entry, so a
    copy saved elsewhere (loaded by the pipeline class or by diffusers' ``DiffusionPipeline``) still resolves
    ``enable_<method>()`` to ``embedded/<method>``; a preset named in full is still used as named."""
    from diffusers import DiffusionPipeline

    pipe = InfinityPipeline.from_pretrained("embedded")
    pipe.save_pretrained(tmp_path / "copy")
    assert json.loads((tmp_path / "copy" / "model_index.json").read_text())["preset_model"] == "embedded"
    own = LazyVARScheduler.from_pretrained("embedded/lazyvar").to_dict()
    family = LazyVARScheduler.from_pretrained("infinity-2b/lazyvar").to_dict()
    assert own != family
    for loader in (InfinityPipeline, DiffusionPipeline):
        copy = loader.from_pretrained(tmp_path / "copy")
        assert copy.preset_model == "embedded"
        assert copy.enable_lazyvar().to_dict() == own
        assert copy.enable_acceleration("lazyvar").to_dict() == own
        assert copy.enable_acceleration("embedded/lazyvar").to_dict() == own
        with pytest.raises(ValueError) as err:  # another model's preset by name: refused, naming what fits
            copy.enable_acceleration("infinity-2b/lazyvar")
        assert str(err.value).startswith(
            "the preset 'infinity-2b/lazyvar' does not fit this pipeline's model 'embedded' (infinity); the presets "
            "that fit it: ['embedded/arvar', 'embedded/depthvar', 'embedded/fastvar', 'embedded/lazyvar', "
            "'embedded/stagevar']"
        )
        # on purpose (a comparison, as scripts/eval_embedded.py --accel infinity-2b/lazyvar): as a scheduler
        assert copy.enable_acceleration(LazyVARScheduler.from_pretrained("infinity-2b/lazyvar")).to_dict() == family


def test_a_preset_model_that_does_not_fit_the_model_is_refused(tmp_path):
    """A ``preset_model`` without presets for the pipeline's family is refused at construction and at load, naming
    the value, the family and the preset models that fit."""
    tiny = build_tiny_infinity_pipeline(seed=0)
    components = dict(tiny.components)
    for bad in ("hart-0.7b", "infinity-8b", 3):
        with pytest.raises(ValueError) as err:
            InfinityPipeline(**components, preset_model=bad)
        assert str(err.value).startswith(
            f"preset_model={bad!r} does not fit this infinity model: the preset models with presets for 'infinity' "
            "are ['embedded', 'infinity-2b']"
        )
    own = InfinityPipeline(**components, preset_model="embedded").enable_lazyvar()
    assert own.to_dict() == LazyVARScheduler.from_pretrained("embedded/lazyvar").to_dict()
    tiny.save_pretrained(tmp_path)
    index = json.loads((tmp_path / "model_index.json").read_text())
    assert index["preset_model"] is None
    (tmp_path / "model_index.json").write_text(json.dumps({**index, "preset_model": "hart-0.7b"}))
    with pytest.raises(ValueError, match=r"preset_model='hart-0.7b' does not fit this infinity model"):
        InfinityPipeline.from_pretrained(tmp_path)
