"""Bad command-line input: exit status 2 and one ``error:`` line naming the bad value, never a traceback."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from diffusers_var_accel.lab.cli import build_parser, main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _fails_cleanly(capsys, argv, *expected):
    """``main(argv)`` exits 2 with exactly one ``error:`` line on stderr that holds every ``expected`` text."""
    capsys.readouterr()
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    for text in expected:
        assert text in errors[0], (text, errors[0])
    return errors[0]


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("lazyvar:keep_ratios=abc", ["keep_ratios='abc'", "list of numbers"]),
        ("lazyvar:keep_ratios=[0.1,abc,0.2,0.3]", ["[0.1,abc,0.2,0.3]", "list of numbers"]),
        ("lazyvar:keep_ratios=0.5", ["keep_ratios='0.5'", "list of numbers", "keep_ratios=[0.5,0.5]"]),
        ("lazyvar:keep_ratios=[NaN,0.1,0.1,0.1]", ["NaN", "list of numbers"]),
        ("lazyvar:group_scales=[-1.5]", ["group_scales='[-1.5]'", "list of integers"]),
        ("lazyvar:parallel_decoding=yes", ["parallel_decoding='yes'", "boolean (true or false)"]),
        ("fastvar:skip_last_scales=1", ["skip_last_scales='1'", "boolean"]),
        ("fastvar:cache_scale=-5.5", ["cache_scale='-5.5'", "integer"]),
        ("depthvar:reference_scale=true", ["reference_scale='true'", "integer"]),
        ("depthvar:rotation_step=fast", ["rotation_step='fast'", "number"]),
        ("arvar:upsample_mode=3", ["upsample_mode='3'", "string"]),
        ("infinity-2b/lazyvar:keep_ratios=x", ["keep_ratios='x'", "list of numbers"]),
        ("lazyvar:nope=1", ["no setting 'nope'", "keep_ratios"]),
        ("lazyvar:keep_ratios", ["'keep_ratios'", "key=value"]),
    ],
)
def test_accel_overrides_are_checked_against_the_declared_types(tmp_path, capsys, spec, expected):
    line = _fails_cleanly(capsys, ["generate", "x", "--accel", spec, "-o", str(tmp_path / "out")], *expected)
    assert f"--accel {spec}" in line
    assert not (tmp_path / "out").exists()  # refused before anything is loaded or written


def test_accel_overrides_of_the_right_types_still_load():
    from diffusers_var_accel.lab.cli import _load_accel, check_acceleration_overrides

    for spec in (
        "lazyvar:keep_ratios=[0.4,0.2,0.1,0.05]",
        "fastvar:skip_last_scales=false,prune_ratios=[0.3,0.4]",
        "depthvar:rotation_step=0.5,start_scale=null",
        "arvar:upsample_mode=nearest",
    ):
        check_acceleration_overrides(spec)
        assert _load_accel(spec, "infinity") is not None


@pytest.mark.parametrize("command", ["generate", "bench", "demo"])
def test_overrides_are_checked_in_every_command(tmp_path, capsys, command):
    flag = "--accel" if command == "generate" else "--methods"
    value = "fastvar:skip_last_scales=maybe" if command == "generate" else "baseline,fastvar:skip_last_scales=maybe"
    _fails_cleanly(
        capsys,
        [command, *(["x"] if command == "generate" else []), flag, value, "-o", str(tmp_path / "o")],
        "skip_last_scales='maybe'",
        "boolean",
    )


@pytest.mark.parametrize(
    "device", ["gpu", "cuda:99", "tpu", "cpu:x"] + ([] if torch.cuda.is_available() else ["cuda", "cuda:0"])
)
@pytest.mark.parametrize("command", ["generate", "bench"])
def test_a_device_that_is_not_there(tmp_path, capsys, command, device):
    argv = [command, *(["x"] if command == "generate" else []), "--device", device, "-o", str(tmp_path / "o")]
    _fails_cleanly(capsys, argv, f"--device {device}")


@pytest.fixture()
def regular_file(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("not a folder")
    return path


@pytest.mark.parametrize("under", [False, True])
@pytest.mark.parametrize("command", ["generate", "demo", "bench", "convert"])
def test_an_output_that_is_or_is_under_a_regular_file(capsys, regular_file, command, under):
    output = str(regular_file / "sub" if under else regular_file)
    argv = {
        "generate": ["generate", "x"],
        "demo": ["demo"],
        "bench": ["bench"],
        "convert": ["convert", "hart", "--checkpoint", str(FIXTURES / "hart" / "hart-tiny")],
    }[command]
    _fails_cleanly(capsys, argv + ["-o", output], f"--output {output}", "a_file", "not a folder")
    assert regular_file.read_text() == "not a folder"


def _model_folder(tmp_path, kind):
    folder = tmp_path / kind
    folder.mkdir()
    from diffusers_var_accel.embedded import EMBEDDED_MODEL_PATH

    index = (EMBEDDED_MODEL_PATH / "model_index.json").read_text()
    if kind == "only_index":
        (folder / "model_index.json").write_text(index)
    elif kind == "bad_json":
        (folder / "model_index.json").write_text(index[: len(index) // 2])
    elif kind == "unknown_class":
        (folder / "model_index.json").write_text(
            json.dumps({**json.loads(index), "_class_name": "StableDiffusionPipelin"})
        )
    elif kind in ("truncated_weights", "empty_weights", "no_vae"):
        import shutil

        folder.rmdir()
        shutil.copytree(EMBEDDED_MODEL_PATH, folder)
        weights = folder / "vae" / "diffusion_pytorch_model.safetensors"
        if kind == "no_vae":
            shutil.rmtree(folder / "vae")
        else:
            weights.write_bytes(weights.read_bytes()[:1000] if kind == "truncated_weights" else b"")
    return folder


@pytest.mark.parametrize(
    "kind", ["empty", "only_index", "bad_json", "unknown_class", "truncated_weights", "empty_weights", "no_vae"]
)
def test_a_model_folder_that_is_not_a_pipeline(tmp_path, capsys, kind):
    folder = _model_folder(tmp_path, kind)
    line = _fails_cleanly(
        capsys, ["generate", "x", "--model", str(folder), "-o", str(tmp_path / "out")], f"--model {folder}"
    )
    if kind in ("truncated_weights", "empty_weights", "no_vae"):
        assert "vae" in line  # the message says which part of the folder is wrong
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["no_config", "unknown_class", "bad_json", "missing_json", "unknown_class_json"])
def test_a_bad_accel_folder_or_file(tmp_path, capsys, kind):
    folder = tmp_path / "scheduler"
    folder.mkdir()
    config = folder / "acceleration_config.json"
    spec = str(folder)
    if kind == "unknown_class":
        config.write_text(json.dumps({"_class_name": "LazyVARSchedulr", "keep_ratios": [0.1]}))
    elif kind == "bad_json":
        config.write_text('{"_class_name": "LazyVARScheduler", ')
    elif kind == "missing_json":
        spec = str(tmp_path / "nothing.json")
    elif kind == "unknown_class_json":
        spec = str(tmp_path / "my.json")
        Path(spec).write_text(json.dumps({"_class_name": "FastVARSchedular"}))
    out = tmp_path / "out"
    _fails_cleanly(capsys, ["generate", "x", "--accel", spec, "-o", str(out)], f"--accel {spec}")
    assert not out.exists() or not (out / "generations.json").exists()  # nothing recorded as accelerated


@pytest.mark.parametrize(
    "argv, unknown",
    [
        (["generate", "--prompt", "x"], "--prompt"),  # not silently --prompts-file
        (["generate", "x", "--prompts", "p.txt"], "--prompts"),
        (["generate", "x", "--out", "o"], "--out"),
        (["generate", "x", "--acc", "lazyvar"], "--acc"),
        (["bench", "--method", "lazyvar"], "--method"),
        (["demo", "--num", "2"], "--num"),
        (["convert", "hart", "--checkpoint", "c", "--over", "-o", "o"], "--over"),
        (["flops", "--mod", "infinity-2b"], "--mod"),
    ],
)
def test_options_are_not_abbreviated(capsys, argv, unknown):
    _fails_cleanly(capsys, argv, "unrecognized arguments", unknown)


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "x"],
        ["demo"],
        ["bench"],
        ["convert", "hart", "--checkpoint", "c"],
        ["convert", "infinity", "--transformer", "t", "--vae", "v"],
    ],
)
def test_dash_o_is_output_in_every_command(argv):
    assert build_parser().parse_args(argv + ["-o", "here"]).output == "here"


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            [*"convert infinity --transformer missing.pth --vae".split(), str(FIXTURES / "infinity" / "vae_tiny.pth")],
            ["--transformer missing.pth", "no such file"],
        ),
        (
            [
                *"convert infinity --transformer".split(),
                str(FIXTURES / "infinity" / "infinity_tiny.pth"),
                *"--vae nope.pth".split(),
            ],
            ["--vae nope.pth", "no such file"],
        ),
        (["convert", "hart", "--checkpoint", "no_such_folder"], ["--checkpoint no_such_folder", "not a folder"]),
        (["convert", "hart", "--checkpoint", "EMPTY"], ["llm/config.json"]),
        (
            ["convert", "hart", "--checkpoint", str(FIXTURES / "hart" / "hart-tiny"), "--text-encoder", "no_t5"],
            ["--text-encoder no_t5", "not a folder"],
        ),
    ],
)
def test_convert_with_missing_inputs_exits_2(tmp_path, capsys, argv, expected):
    (tmp_path / "EMPTY").mkdir()
    argv = [str(tmp_path / "EMPTY") if a == "EMPTY" else a for a in argv]
    _fails_cleanly(capsys, argv + ["-o", str(tmp_path / "out")], *expected)
    assert not (tmp_path / "out" / "model_index.json").exists()


def test_debug_shows_the_traceback_instead(tmp_path):
    folder = _model_folder(tmp_path, "only_index")
    with pytest.raises(OSError):
        main(["generate", "x", "--model", str(folder), "-o", str(tmp_path / "out"), "--debug"])


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["flops", "--model", "infinity-2b", "--accel", "nope"], "unknown acceleration 'nope'"),
        (["launches", "--models", "nope"], "--models 'nope': unknown"),
    ],
)
def test_debug_reaches_the_counters_before_or_after_their_name(capsys, argv, needle):
    """``flops`` and ``launches`` parse their own arguments: without ``--debug`` one error line and status 2; with it,
    wherever it stands, the traceback of the same error (their own arguments kept, not dropped)."""
    assert main(argv) == 2
    assert needle in capsys.readouterr().err
    for debug in (argv + ["--debug"], ["--debug"] + argv):
        with pytest.raises(ValueError, match=re.escape(needle)):
            main(debug)


def test_the_installed_command_prints_one_line_and_exits_2(tmp_path):
    """The real process: stderr is exactly one line (no traceback, no warnings) for errors found before loading."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    script = (
        "import sys; from diffusers_var_accel.lab.cli import main\n"
        "codes = [main(a.split('|')) for a in sys.argv[1:]]\nsys.exit(max(codes) if min(codes) == max(codes) else 99)"
    )
    cases = [
        f"generate|x|--accel|lazyvar:keep_ratios=abc|-o|{tmp_path / 'o'}",
        f"generate|x|--device|cuda:99|-o|{tmp_path / 'o'}",
        f"generate|x|-o|{Path(__file__)}/sub",
    ]
    done = subprocess.run([sys.executable, "-c", script, *cases], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 3 and all(line.startswith("error: ") for line in lines), done.stderr
    assert "keep_ratios='abc'" in lines[0] and "cuda:99" in lines[1] and "not a folder" in lines[2]


@pytest.mark.parametrize(
    "option, value, expected",
    [
        ("--guidance-scale", "nan", "not a finite number"),
        ("--guidance-scale", "inf", "not a finite number"),
        ("--guidance-scale", "strong", "not a number"),
        ("--tau", "0", "a temperature > 0"),
        ("--tau", "-1", "a temperature > 0"),
        ("--tau", "NaN", "not a finite number"),
        ("--top-k", "-1", "0 (off) or more"),
        ("--top-k", "1.5", "not an integer"),
        ("--top-p", "1.5", "0 (off) to 1"),
        ("--top-p", "-0.1", "0 (off) to 1"),
        ("--top-p", "nan", "not a finite number"),
    ],
)
@pytest.mark.parametrize("command", ["generate", "bench"])
def test_sampling_values_are_checked_before_loading(tmp_path, capsys, command, option, value, expected):
    argv = [command, *(["x"] if command == "generate" else []), option, value, "-o", str(tmp_path / "o")]
    _fails_cleanly(capsys, argv, f"argument {option}", f"'{value}'", expected)


@pytest.mark.parametrize(
    "option, value", [("--num-prompts", "0"), ("--num-prompts", "-2"), ("--repeats", "0"), ("--num-prompts", "two")]
)
def test_demo_counts_are_checked(tmp_path, capsys, option, value):
    _fails_cleanly(capsys, ["demo", option, value, "-o", str(tmp_path / "o")], f"argument {option}", f"'{value}'")


@pytest.mark.parametrize("prompts", [[""], ["   "], ["two red circles", "\t"]])
def test_an_empty_or_blank_prompt_is_refused_before_loading(tmp_path, capsys, prompts):
    line = _fails_cleanly(capsys, ["generate", *prompts, "-o", str(tmp_path / "out")], "prompt")
    assert ("empty" in line) == (prompts == [""]) and repr(prompts[-1]) in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "family, fits, other",
    [("infinity", "embedded/lazyvar", "hart-0.7b"), ("hart", "hart-0.7b/lazyvar", "infinity-2b")],
)
def test_an_unknown_method_lists_only_the_presets_of_the_loaded_family(family, fits, other):
    from diffusers_var_accel.schedulers.specs import load_acceleration

    for spec in ("lazyvr", "infinity-2b/lazyvr"):
        with pytest.raises(ValueError) as err:
            load_acceleration(spec, family)
        listed = str(err.value).split(";", 1)[1]  # after the bad name itself
        assert other not in listed and fits in listed
    with pytest.raises(ValueError, match="did you mean 'lazyvar'"):
        load_acceleration("lazyvr", family)
