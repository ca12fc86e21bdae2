"""``var-accel generate``: file names that never collide, no silent overwrite, resume, and the settings it records."""

import inspect
import json
from pathlib import Path

import numpy as np
import PIL.Image
import pytest

from diffusers_var_accel import HARTPipeline, InfinityPipeline
from diffusers_var_accel.lab.cli import main
from diffusers_var_accel.lab.generate_job import image_file_name
from diffusers_var_accel.embedded import EMBEDDED_SAMPLING

PROMPTS = ["a circle", "two red circles", "a blue square"]


def _strict(text: str):
    def refuse(constant):
        raise AssertionError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def _manifest(folder: Path):
    return _strict((folder / "generations.json").read_text())


def _pixels(folder: Path):
    return {r["file"]: np.asarray(PIL.Image.open(folder / r["file"])) for r in _manifest(folder)["images"]}


@pytest.fixture()
def calls(monkeypatch):
    """Counts the pipeline calls; ``calls["fail_at"] = n`` interrupts the n-th call (as a Ctrl-C would)."""
    state = {"n": 0, "fail_at": None}
    real = InfinityPipeline.__call__

    def counting(self, *args, **kwargs):
        state["n"] += 1
        if state["n"] == state["fail_at"]:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(InfinityPipeline, "__call__", counting)
    return state


@pytest.fixture(scope="module")
def one_shot(tmp_path_factory):
    out = tmp_path_factory.mktemp("one_shot")
    assert main(["generate", *PROMPTS, "--seed", "7", "-o", str(out), "--no-progress"]) == 0
    return out


@pytest.mark.parametrize(
    "prompt, seed, name",
    [
        ("two red circles", 0, "two-red-circles-s0.png"),
        ("a circle", 12, "a-circle-s12.png"),
        ("Two red circles", 0, None),  # capitals: a hash keeps it apart from "two red circles"
        ("two red circles!", 0, None),
        ("", 3, None),
        ("a " * 80, 1, None),  # long: cut, with a hash
        ("猫", 0, None),
    ],
)
def test_file_names_are_readable_and_distinct(prompt, seed, name):
    got = image_file_name(prompt, seed)
    if name is not None:
        assert got == name
    else:
        assert got.endswith(f"-s{seed}.png") and len(got) <= 60 + 9 + 12 and "/" not in got
    assert got != image_file_name("two red circles", seed) or prompt == "two red circles"


def test_names_of_close_prompts_never_collide():
    prompts = [
        "red fox",
        "Red fox",
        "red  fox",
        "red-fox",
        "red fox.",
        "RED FOX",
        "red fox " + "x" * 70,
        "red fox " + "y" * 70,
    ]
    assert len({image_file_name(p, 0) for p in prompts}) == len(prompts)
    assert image_file_name("red fox", 0) != image_file_name("red fox", 1)


def test_the_manifest_records_the_settings_used(one_shot):
    manifest = _manifest(one_shot)
    settings = manifest["settings"]
    assert settings["model"] == "embedded" and settings["pipeline"] == "InfinityPipeline"
    assert {k: settings[k] for k in EMBEDDED_SAMPLING} == EMBEDDED_SAMPLING  # the embedded model's evaluated settings
    assert (settings["height"], settings["width"], settings["dtype"], settings["device_type"]) == (
        64,
        64,
        "float32",
        "cpu",
    )
    assert settings["acceleration"] == "baseline" and settings["acceleration_config"] is None
    assert [(r["prompt"], r["seed"], r["file"]) for r in manifest["images"]] == [
        (p, 7 + i, image_file_name(p, 7 + i)) for i, p in enumerate(PROMPTS)
    ]


def test_tiny_model_records_the_pipeline_defaults_and_the_overrides(tmp_path):
    assert (
        main(
            [
                *"generate x --model tiny --top-k 5 --accel lazyvar:keep_ratios=[0.5,0.4,0.3,0.2] -o".split(),
                str(tmp_path),
                "--no-progress",
            ]
        )
        == 0
    )
    settings = _manifest(tmp_path)["settings"]
    defaults = inspect.signature(InfinityPipeline.__call__).parameters
    assert settings["guidance_scale"] == defaults["guidance_scale"].default
    assert settings["tau"] == defaults["tau"].default and settings["top_p"] == defaults["top_p"].default
    assert settings["top_k"] == 5
    assert settings["acceleration_config"]["_class_name"] == "LazyVARScheduler"
    assert settings["acceleration_config"]["keep_ratios"] == [0.5, 0.4, 0.3, 0.2]


def test_help_shows_the_defaults_of_each_kind_of_model(capsys):
    assert main(["generate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    infinity = inspect.signature(InfinityPipeline.__call__).parameters
    hart = inspect.signature(HARTPipeline.__call__).parameters
    assert f"embedded {EMBEDDED_SAMPLING['guidance_scale']}" in text and f"embedded {EMBEDDED_SAMPLING['tau']}" in text
    assert f"Infinity folder / tiny {infinity['guidance_scale'].default}" in text
    assert f"Infinity folder / tiny {infinity['tau'].default}" in text
    assert f"Infinity folder / tiny {infinity['top_k'].default}" in text
    assert f"Infinity folder / tiny {infinity['top_p'].default}" in text
    assert f"HART {hart['guidance_scale'].default}" in text
    assert "--overwrite" in text and "resume" in text


def test_a_second_run_adds_to_the_folder_and_a_repeat_generates_nothing(tmp_path, calls, one_shot, capsys):
    out = tmp_path / "out"
    assert main(["generate", PROMPTS[0], "--seed", "7", "-o", str(out), "--no-progress"]) == 0
    assert main(["generate", PROMPTS[1], "--seed", "8", "-o", str(out), "--no-progress"]) == 0
    assert calls["n"] == 2
    assert [r["prompt"] for r in _manifest(out)["images"]] == PROMPTS[:2]
    first = (out / image_file_name(PROMPTS[0], 7)).stat().st_mtime_ns
    capsys.readouterr()
    assert main(["generate", PROMPTS[0], "--seed", "7", "-o", str(out), "--no-progress"]) == 0  # the same again
    assert calls["n"] == 2 and "already there" in capsys.readouterr().err
    assert (out / image_file_name(PROMPTS[0], 7)).stat().st_mtime_ns == first
    reference = _pixels(one_shot)
    for name, pixels in _pixels(out).items():
        assert np.array_equal(pixels, reference[name])


@pytest.mark.parametrize(
    "change, named",
    [
        (["--guidance-scale", "3"], "guidance_scale: 2.0 there, 3.0 now"),
        (["--accel", "lazyvar"], "acceleration: 'baseline' there, 'lazyvar' now"),
        (["--top-k", "4"], "top_k: 0 there, 4 now"),
        (["--model", "tiny"], "model: 'embedded' there, 'tiny' now"),
    ],
)
def test_other_settings_into_the_same_folder_are_refused_unless_overwrite(tmp_path, capsys, change, named):
    out = tmp_path / "out"
    assert main(["generate", "a circle", "-o", str(out), "--no-progress"]) == 0
    before = (out / "a-circle-s0.png").read_bytes()
    capsys.readouterr()
    assert main(["generate", "a circle", *change, "-o", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and named in err and "--overwrite" in err
    assert (out / "a-circle-s0.png").read_bytes() == before
    assert _manifest(out)["settings"]["acceleration"] == "baseline"
    # --overwrite: the earlier images go, the new run is recorded
    assert main(["generate", "two red circles", *change, "-o", str(out), "--no-progress", "--overwrite"]) == 0
    assert not (out / "a-circle-s0.png").exists()
    assert [r["file"] for r in _manifest(out)["images"]] == ["two-red-circles-s0.png"]


def test_a_folder_of_an_older_version_is_not_overwritten(tmp_path, capsys):
    (tmp_path / "0000.png").write_bytes(b"old")
    (tmp_path / "generations.json").write_text(
        json.dumps({"height": 64, "width": 64, "images": [{"file": "0000.png"}]})
    )
    assert main(["generate", "a circle", "-o", str(tmp_path), "--no-progress"]) == 2
    assert "older var-accel" in capsys.readouterr().err and (tmp_path / "0000.png").read_bytes() == b"old"
    assert main(["generate", "a circle", "-o", str(tmp_path), "--no-progress", "--overwrite"]) == 0
    assert not (tmp_path / "0000.png").exists() and (tmp_path / "a-circle-s0.png").is_file()


@pytest.mark.parametrize("batch_size", [1, 2])
def test_an_interrupted_run_resumes_where_it_stopped(tmp_path, calls, one_shot, batch_size):
    out = tmp_path / "out"
    command = ["generate", *PROMPTS, "--seed", "7", "-o", str(out), "--no-progress", "--batch-size", str(batch_size)]
    calls["fail_at"] = 2  # Ctrl-C during the second call
    assert main(command) == 130  # interrupted: says how to resume
    done_before = batch_size  # the first call's images are on disk and in the journal
    assert len(list(out.glob("*.png"))) == done_before and list(out.glob(".generations-process*.jsonl"))
    calls["fail_at"], calls["n"] = None, 0
    assert main(command) == 0
    assert calls["n"] == -(-(len(PROMPTS) - done_before) // batch_size)  # only the missing images were generated
    manifest = _manifest(out)
    assert [r["prompt"] for r in manifest["images"]] == PROMPTS and manifest["batch_size"] == batch_size
    assert not list(out.glob(".generations-process*.jsonl")) and not list(out.glob(".*.tmp*"))
    reference = _pixels(one_shot)
    for name, pixels in _pixels(out).items():  # the same images as the uninterrupted run
        assert np.abs(pixels.astype(int) - reference[name].astype(int)).max() <= (0 if batch_size == 1 else 1)


@pytest.mark.parametrize("model", ["tiny", "tiny-hart"])
def test_dtype_holds_for_the_tiny_models(tmp_path, monkeypatch, model):
    import torch

    from diffusers_var_accel.lab import cli

    seen = {}
    real = cli._load_pipeline

    def spy(*args):
        seen["pipe"] = real(*args)
        return seen["pipe"]

    monkeypatch.setattr(cli, "_load_pipeline", spy)
    assert main(["generate", "x", "--model", model, "--dtype", "bfloat16", "-o", str(tmp_path), "--no-progress"]) == 0
    assert seen["pipe"].transformer.dtype == torch.bfloat16 and seen["pipe"].vae.dtype == torch.bfloat16
    assert _manifest(tmp_path)["settings"]["dtype"] == "bfloat16"


def test_an_unreadable_manifest_is_refused_unless_overwrite(tmp_path, capsys):
    (tmp_path / "generations.json").write_text('{"settings": ')
    assert main(["generate", "a circle", "-o", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "generations.json is not valid JSON" in err and "--overwrite" in err
    assert main(["generate", "a circle", "-o", str(tmp_path), "--no-progress", "--overwrite"]) == 0
    assert [r["file"] for r in _manifest(tmp_path)["images"]] == ["a-circle-s0.png"]


def test_the_same_command_again_loads_no_model_but_a_changed_file_does(tmp_path, calls, monkeypatch, capsys):
    """A repeat of a finished command says so without loading the model; an edited acceleration file (same name) or
    another argument is a new invocation and goes the full way (and, with the same settings, still generates
    nothing new)."""
    import diffusers_var_accel.lab.cli as cli

    accel = tmp_path / "accel.json"
    accel.write_text(
        json.dumps({"_class_name": "LazyVARScheduler", "group_scales": [-2, -1], "keep_ratios": [0.2, 0.1]})
    )
    out = tmp_path / "out"
    argv = ["generate", *PROMPTS[:2], "--accel", str(accel), "-o", str(out), "--no-progress"]
    assert main(argv) == 0 and calls["n"] == 2
    loads = []
    real = cli._load_pipeline
    monkeypatch.setattr(cli, "_load_pipeline", lambda *a, **k: loads.append(a) or real(*a, **k))
    capsys.readouterr()
    assert main(argv) == 0
    assert loads == [] and calls["n"] == 2
    assert (
        "all 2 images of this command are already there (same command, same files): nothing to generate"
        in capsys.readouterr().err
    )
    accel.write_text(
        json.dumps({"_class_name": "LazyVARScheduler", "group_scales": [-2, -1], "keep_ratios": [0.3, 0.1]})
    )
    assert main(argv) == 2  # other settings in the same folder: refused, after loading the model to compare them
    assert len(loads) == 1 and "other settings" in capsys.readouterr().err
