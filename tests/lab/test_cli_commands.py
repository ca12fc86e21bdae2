"""``var-accel`` commands: generate (--prompts-file, --accel, --batch-size), convert, flops, shimmed folders, errors."""

import json
import os
import subprocess
import sys
import shutil
from pathlib import Path

import numpy as np
import PIL.Image
import pytest

from diffusers_var_accel.lab import cli
from diffusers_var_accel.lab.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _images(folder: Path):
    record = json.loads((folder / "generations.json").read_text())
    return record, [np.asarray(PIL.Image.open(folder / r["file"])) for r in record["images"]]


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("two red circles\n\n  a blue square  \n")  # a blank line and padding are skipped
    return path


@pytest.fixture(scope="module")
def baseline_dir(tmp_path_factory, prompts_file):
    out = tmp_path_factory.mktemp("baseline")
    assert main(["generate", "--prompts-file", str(prompts_file), "--seed", "5", "--output", str(out)]) == 0
    return out


def test_generate_prompts_file_writes_one_image_per_line_with_seeds(baseline_dir):
    record, images = _images(baseline_dir)
    assert [r["prompt"] for r in record["images"]] == ["two red circles", "a blue square"]
    assert [r["seed"] for r in record["images"]] == [5, 6]
    assert record["acceleration"] == "baseline"
    assert len(images) == 2 and all(im.shape == (64, 64, 3) for im in images)


def test_generate_batch_size_keeps_each_images_seed(tmp_path, prompts_file, baseline_dir):
    out = tmp_path / "batched"
    assert (
        main(
            ["generate", "--prompts-file", str(prompts_file), "--seed", "5", "--batch-size", "2", "--output", str(out)]
        )
        == 0
    )
    record, images = _images(out)
    assert record["batch_size"] == 2 and [r["seed"] for r in record["images"]] == [5, 6]
    _, reference = _images(baseline_dir)
    for got, want in zip(images, reference):  # same seeds -> the same images as one call per prompt
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


def test_generate_accel_preset_and_json_file(tmp_path, prompts_file, baseline_dir):
    from diffusers_var_accel.schedulers.specs import load_acceleration

    preset_out = tmp_path / "lazyvar"
    assert (
        main(
            [
                *"generate --prompts-file".split(),
                str(prompts_file),
                *"--seed 5 --accel lazyvar --output".split(),
                str(preset_out),
            ]
        )
        == 0
    )
    record, accelerated = _images(preset_out)
    assert record["acceleration"] == "lazyvar" and len(accelerated) == 2
    _, baseline = _images(baseline_dir)
    assert any(not np.array_equal(a, b) for a, b in zip(accelerated, baseline)), "LazyVAR left every image unchanged"

    # the same scheduler as a JSON file of another name than acceleration_config.json -> the same images
    scheduler = load_acceleration("lazyvar", "infinity", preset_model="embedded")  # the embedded model's own preset
    scheduler.save_config(tmp_path / "saved")
    json_file = tmp_path / "my_lazyvar.json"
    shutil.copyfile(tmp_path / "saved" / "acceleration_config.json", json_file)
    (tmp_path / "saved" / "acceleration_config.json").unlink()  # the file's folder must not be what gets read
    json_out = tmp_path / "from_json"
    assert (
        main(
            [
                *"generate --prompts-file".split(),
                str(prompts_file),
                *"--seed 5 --accel".split(),
                str(json_file),
                "--output",
                str(json_out),
            ]
        )
        == 0
    )
    _, from_json = _images(json_out)
    assert len(from_json) == 2
    for got, want in zip(from_json, accelerated):
        assert np.array_equal(got, want)


def test_generate_accel_override_changes_the_scheduler(tmp_path, monkeypatch):
    seen = {}
    real = cli._load_accel

    def spy(spec, family, *preset_model):
        seen["scheduler"] = real(spec, family, *preset_model)
        return seen["scheduler"]

    monkeypatch.setattr(cli, "_load_accel", spy)
    assert (
        main(["generate", "two red circles", "--accel", "fastvar:skip_last_scales=false", "--output", str(tmp_path)])
        == 0
    )
    assert type(seen["scheduler"]).__name__ == "FastVARScheduler"
    assert seen["scheduler"].config.skip_last_scales is False


def test_generate_loads_a_hub_shimmed_folder(tmp_path, capsys):
    from diffusers_var_accel import HARTPipeline
    from diffusers_var_accel.lab.bench.runner import load_bench_pipeline
    from diffusers_var_accel.hub import has_hub_shim, write_hub_shim
    from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline

    folder = tmp_path / "shimmed"
    build_tiny_hart_pipeline(seed=0).save_pretrained(folder)
    write_hub_shim(folder)
    assert has_hub_shim(folder)
    assert json.loads((folder / "model_index.json").read_text())["_class_name"] == ["pipeline", "HARTPipeline"]
    assert (
        main(
            ["generate", "a red fox", "--model", str(folder), "--accel", "fastvar", "--output", str(tmp_path / "out")]
        )
        == 0
    )
    record, images = _images(tmp_path / "out")
    assert len(images) == 1 and images[0].shape == (64, 64, 3)

    pipe, is_embedded = load_bench_pipeline(str(folder), "cpu")
    assert isinstance(pipe, HARTPipeline) and not is_embedded

    # a shim-form index whose pipeline.py is not our shim is refused, with what to do
    (folder / "pipeline.py").write_text("import os\n")
    capsys.readouterr()
    assert main(["generate", "a red fox", "--model", str(folder), "--output", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "not the diffusers_var_accel shim" in err and "write_hub_shim" in err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["generate", "x", "--accel", "nope"], ["--accel nope", "unknown acceleration 'nope'", "lazyvar"]),
        (["generate", "x", "--accel", "missing.json"], ["missing.json", "no such JSON file", "preset name"]),
        (["generate", "x", "--accel", "hart-0.7b/fastvar"], ["hart-0.7b/fastvar", "infinity-2b/fastvar"]),
        (["generate", "--prompts-file", "no_such_prompts.txt"], ["no_such_prompts.txt", "one prompt per line"]),
        (["generate"], ["give a prompt", "--prompts-file"]),
        (["generate", "x", "--batch-size", "0"], ["--batch-size 0", "1 or more"]),
        (["generate", "x", "--dtype", "float8"], ["invalid choice: 'float8'", "float32", "bfloat16"]),
        (
            ["generate", "x", "--model", "no_such_folder"],
            ["no_such_folder", "model_index.json", "var-accel convert", "tiny-hart"],
        ),
        (["convert"], ["infinity", "hart"]),
        (["convert", "sd"], ["invalid choice: 'sd'", "infinity", "hart"]),
        (["frobnicate"], ["invalid choice: 'frobnicate'", "generate", "convert", "flops"]),
        (["flops", "--model", "gpt-2"], ["invalid choice: 'gpt-2'", "infinity-2b", "hart-0.7b"]),
    ],
)
def test_bad_inputs_exit_2_with_the_value_and_what_to_do(tmp_path, capsys, argv, expected):
    capsys.readouterr()
    assert main(argv + ([] if argv[0] in ("convert", "frobnicate", "flops") else ["--output", str(tmp_path)])) == 2
    err = capsys.readouterr().err
    for text in expected:
        assert text in err, (text, err)
    assert not list(tmp_path.glob("*.png"))


def test_convert_infinity_official_fixture(tmp_path, capsys):
    out = tmp_path / "infinity"
    assert (
        main(
            [
                *"convert infinity --transformer".split(),
                str(FIXTURES / "infinity" / "infinity_tiny.pth"),
                "--vae",
                str(FIXTURES / "infinity" / "vae_tiny.pth"),
                "--output",
                str(out),
                "--hub-shim",
            ]
        )
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    from diffusers_var_accel.hub import has_hub_shim, pipeline_class

    assert pipeline_class(out).__name__ == "InfinityPipeline" and has_hub_shim(out)
    assert (out / "transformer").is_dir() and (out / "vae").is_dir()
    # an output that already holds a pipeline is not overwritten silently
    assert (
        main(
            [
                *"convert infinity --transformer".split(),
                str(FIXTURES / "infinity" / "infinity_tiny.pth"),
                "--vae",
                str(FIXTURES / "infinity" / "vae_tiny.pth"),
                "--output",
                str(out),
            ]
        )
        == 2
    )
    assert "--overwrite" in capsys.readouterr().err


def test_convert_infinity_errors_say_what_to_do(tmp_path, capsys):
    # a missing input file is a bad value (exit 2); a checkpoint that does not convert is exit 1 (docs/cli.md)
    assert (
        main(
            [
                *"convert infinity --transformer".split(),
                str(tmp_path / "nope.pth"),
                "--vae",
                str(FIXTURES / "infinity" / "vae_tiny.pth"),
                "--output",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "nope.pth" in err and "official checkpoint" in err
    # the transformer and VAE swapped: strict loading lists the offending keys
    assert (
        main(
            [
                *"convert infinity --transformer".split(),
                str(FIXTURES / "infinity" / "vae_tiny.pth"),
                "--vae",
                str(FIXTURES / "infinity" / "infinity_tiny.pth"),
                "--output",
                str(tmp_path / "o"),
            ]
        )
        == 1
    )
    assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "o" / "model_index.json").exists()
    assert (
        main([*"convert infinity --transformer a.pth --vae b.pth --tokenizer t --output".split(), str(tmp_path / "o")])
        == 2
    )
    assert "--tokenizer needs --text-encoder" in capsys.readouterr().err


def test_convert_hart_official_fixture_and_wrong_layout(tmp_path, capsys):
    out = tmp_path / "hart"
    assert main(["convert", "hart", "--checkpoint", str(FIXTURES / "hart" / "hart-tiny"), "--output", str(out)]) == 0
    from diffusers_var_accel.hub import pipeline_class

    assert pipeline_class(out).__name__ == "HARTPipeline"
    assert (out / "transformer").is_dir() and (out / "vae").is_dir() and not (out / "text_encoder").exists()
    # converted without --text-encoder: generating from a prompt says what is missing (exit 2)
    capsys.readouterr()
    assert main(["generate", "a red fox", "--model", str(out), "--output", str(tmp_path / "img")]) == 2
    assert "no text_encoder" in capsys.readouterr().err

    (tmp_path / "empty").mkdir()
    capsys.readouterr()
    assert main(["convert", "hart", "--checkpoint", str(tmp_path / "empty"), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "llm/config.json" in err and "llm/, tokenizer/" in err
    assert main(["convert", "hart", "--checkpoint", str(tmp_path / "missing"), "--output", str(tmp_path / "o")]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_flops_prints_the_counted_table(capsys):
    assert main(["flops", "--model", "infinity-2b", "--accel", "lazyvar"]) == 0
    out = capsys.readouterr().out
    assert "baseline" in out and "lazyvar" in out and "125.05" in out  # the README's counted baseline


def test_flops_runs_without_the_benchmarks_folder(tmp_path):
    """``var-accel flops`` needs only the package (an installed wheel has no ``benchmarks/``): with ``benchmarks``
    unimportable and the working directory outside the checkout, the counter still runs."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'benchmarks' or name.startswith('benchmarks.'):\n"
        "            raise ImportError('benchmarks is not installed')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from diffusers_var_accel.lab.cli import main\n"
        "sys.exit(main(['flops', '--model', 'infinity-2b', '--height', '256', '--width', '256', '--json']))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["model"] == "infinity-2b" and result["total_tflops"] > 0


def test_help_has_descriptions_and_examples(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "convert" in out and "meta tensors" in out
    assert main(["generate", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--prompts-file" in out and "--accel" in out and "--batch-size" in out and "var-accel generate" in out
    assert main(["convert", "hart", "--help"]) == 0
    assert "--checkpoint" in capsys.readouterr().out


# the 8B converter's command line (the converter itself: tests/library/test_checkpoint_infinity8b.py)
from test_checkpoint_infinity8b import FIXTURE_DIR as INFINITY8B_FIXTURE_DIR  # noqa: E402
from test_checkpoint_infinity8b import SHARDED  # noqa: E402


def test_cli_converts_the_sharded_folder(tmp_path, capsys):
    assert (INFINITY8B_FIXTURE_DIR / "manifest.json").is_file(), (
        f"Infinity-8B fixture missing: {INFINITY8B_FIXTURE_DIR}"
    )
    out = tmp_path / "cli"
    assert (
        main(
            [
                *"convert infinity --transformer".split(),
                str(INFINITY8B_FIXTURE_DIR / SHARDED),
                "--vae",
                str(INFINITY8B_FIXTURE_DIR / "vae_tiny.pth"),
                "--output",
                str(out),
            ]
        )
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    config = json.loads((out / "transformer" / "config.json").read_text())
    assert (
        config["apply_spatial_patchify"] is True
        and config["codebook_dim"] == 4 * json.loads((out / "vae" / "config.json").read_text())["codebook_dim"]
    )
