"""What the lab's family records hold: the tiny builders, the convert sub-commands, the sampling options, the launch
structures; that the command line and the benchmark read them (a family added to the registries is offered without
an edit of cli.py, loading.py or bench/); and that the library registry's no-guidance value and pipeline classes are
what the pipelines use."""

from __future__ import annotations

import argparse
import inspect

import pytest

from diffusers_var_accel.families import MODEL_FAMILIES, model_family_names
from diffusers_var_accel.lab.families import (
    ConvertCommand,
    check_sampling_options,
    family_of_tiny_model,
    lab_family,
    lab_families,
    sampling_option_names,
    tiny_model_names,
)

FAMILIES = model_family_names()


@pytest.mark.parametrize("name", FAMILIES)
def test_sampling_options_are_exactly_the_pipelines_own(name):
    """A family's registered options are parameters of its pipeline's ``__call__``, and no other family's option is
    (the registry cannot drift from the pipeline)."""
    family = lab_family(name)
    parameters = inspect.signature(family.pipeline_class().__call__).parameters
    assert family.sampling_options and all(option in parameters for option in family.sampling_options)
    assert [o for o in sampling_option_names() if o not in family.sampling_options and o in parameters] == []


def test_sampling_option_names_are_every_familys_once_in_order():
    assert sampling_option_names() == ["guidance_scale", "tau", "top_k", "top_p"]
    assert len(set(sampling_option_names())) == len(sampling_option_names())


def test_an_option_of_another_family_is_refused_naming_both():
    check_sampling_options("infinity", ["tau", "top_k", "height", "acceleration"])  # Infinity's own, and non-sampling
    with pytest.raises(
        ValueError,
        match=r"--tau is an option of Infinity only; HART samples with --guidance-scale, "
        r"--top-k, --top-p",
    ):
        check_sampling_options("hart", ["top_k", "tau"], lambda o: "--" + o.replace("_", "-"))
    with pytest.raises(ValueError, match="unknown model family 'halt'"):
        check_sampling_options("halt", [])


@pytest.mark.parametrize("name", FAMILIES)
def test_the_tiny_model_builds_the_familys_pipeline(name):
    family = lab_family(name)
    assert family_of_tiny_model(family.tiny_model) == family
    pipe = family.build_tiny_pipeline(seed=0)
    assert isinstance(pipe, family.pipeline_class()) and pipe.model_family == name


def test_tiny_model_names_come_from_the_registry():
    assert tiny_model_names() == ["tiny", "tiny-hart"]
    assert family_of_tiny_model("embedded") is None and family_of_tiny_model(None) is None


@pytest.mark.parametrize("name", FAMILIES)
def test_the_convert_command_adds_its_options_and_names_a_missing_checkpoint(name, tmp_path):
    command = lab_family(name).convert_command()
    assert isinstance(command, ConvertCommand) and command.help and command.description
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    required = [a for a in parser._actions if a.required]
    assert required, "a converter takes its checkpoint as a required option"
    missing = str(tmp_path / "missing")
    args = parser.parse_args([token for a in required for token in (a.option_strings[0], missing)])
    args.text_encoder = args.tokenizer = None
    with pytest.raises(FileNotFoundError, match=required[0].option_strings[0]):
        command.convert(args, None)


def test_the_convert_sub_commands_are_the_registrys(capsys):
    from diffusers_var_accel.lab.cli import main

    assert main(["convert", "--help"]) == 0
    assert "{" + ",".join(MODEL_FAMILIES) + "}" in capsys.readouterr().out
    for name in FAMILIES:
        assert main(["convert", name, "--help"]) == 0
        assert lab_family(name).convert_command().description in capsys.readouterr().out


@pytest.mark.parametrize("name", FAMILIES)
def test_the_flop_counter_lives_beside_the_familys_part_of_the_meter(name):
    family = lab_family(name)
    counter = family.count_flops()
    assert callable(counter) and counter.__module__ == family.flop_breakdown.partition(":")[0]
    # that part of the meter knows the family's preset model
    assert MODEL_FAMILIES[name].preset_model in family.flop_breakdown_spec().models


def test_launch_structures_give_the_counters_models():
    from diffusers_var_accel.lab.bench.launches import DEFAULT_MODELS, launch_model_names

    built = [m for family in lab_families() for m in family.launch_structure_builder().models]
    assert DEFAULT_MODELS == ("infinity-2b", "hart-0.7b")
    assert sorted(launch_model_names()) == sorted(built) and launch_model_names()[:2] == list(DEFAULT_MODELS)


@pytest.mark.parametrize("name", FAMILIES)
def test_the_pipelines_no_guidance_value_runs_no_unconditional_rows(name):
    """The registered no-guidance value is the one the family's pipeline treats as guidance off."""
    family = lab_family(name)
    pipe = family.build_tiny_pipeline(seed=0)
    assert not pipe.guided_call(guidance_scale=family.no_guidance)
    assert pipe.guided_call(guidance_scale=family.no_guidance + 1.5)


def test_pipeline_class_names_are_the_registrys():
    from diffusers_var_accel.pipelines.diffusers_registration import AUTO_TEXT2IMAGE_KEYS
    from diffusers_var_accel.pipelines.pipeline_loading import pipeline_class_names

    names = [family.pipeline_class().__name__ for family in MODEL_FAMILIES.values()]
    assert pipeline_class_names() == tuple(sorted(names))
    assert list(AUTO_TEXT2IMAGE_KEYS) == names


# ---------------------------------------------------------------------------------------------------------------------
# the counters on every family, the toy's included (its lab record registered for these tests)
# ---------------------------------------------------------------------------------------------------------------------
import torch  # noqa: E402

import toy_family  # noqa: E402
import toy_family_lab  # noqa: E402
from test_family_conformance import PROMPTS, SMALL_CALLS, toy_scheduler  # noqa: E402
from toy_family import TOY  # noqa: E402

COUNTED_FAMILIES = [*FAMILIES, TOY]


@pytest.fixture(scope="module")
def family_pipes(pipes):
    """``family_pipes(name)``: the tiny pipeline of each family (the toy's own builder for the toy), the toy and its
    lab record registered while the module runs."""
    built = {}

    def get(name):
        if name not in built:
            built[name] = toy_family.build_tiny_toy_pipeline() if name == TOY else pipes(name)
        return built[name]

    with toy_family_lab.registered():
        yield get


@pytest.mark.parametrize("name", COUNTED_FAMILIES)
def test_the_launch_counter_counts_every_family(name, family_pipes):
    from diffusers_var_accel.lab.bench.launches import count_generation

    pipe = family_pipes(name)
    options = {**SMALL_CALLS.get(name, {}), "generator": torch.Generator().manual_seed(0)}
    counted = count_generation(pipe, None, prompt=PROMPTS, **options)
    assert counted["kernels"] > 0 and len(counted["per_scale"]) == len(pipe._kv_cache_layout(*_size(name))[0])


def _size(name):
    small = SMALL_CALLS.get(name, {})
    return small.get("height"), small.get("width")


def test_the_flop_meter_counts_the_toy_through_its_declared_parts():
    from diffusers_var_accel.lab.bench.flops import count_generation_flops

    pipe = toy_family.build_tiny_toy_pipeline()
    config = pipe.transformer.config
    baseline = count_generation_flops(pipe.transformer, pipe.vae, cfg=True, batch_size=1)
    tokens = sum(pn * pn for pn in config.patch_nums)
    C, rows = config.embed_dim, baseline["rows"]
    # the FFN of every block on every token of every row: two Linear layers, C x 2C and 2C x C (2 FLOPs per MAC)
    assert baseline["transformer_breakdown"]["ffn"] == config.depth * rows * tokens * 2 * (2 * C * C) * 2
    assert sum(s["flops"] for s in baseline["per_scale"]) == baseline["transformer_flops"]
    assert all(s["blocks_flops"] > 0 and s["head_flops"] > 0 for s in baseline["per_scale"])
    # the registry's counter is the same meter; a method that computes fewer tokens costs fewer FLOPs
    lazy = lab_family(TOY).count_flops()(accel=toy_scheduler("lazyvar"))
    assert lazy["rows"] == rows and lazy["transformer_flops"] < baseline["transformer_flops"]
