"""The ``var-accel`` command line (the README's main job)."""

import json

import PIL.Image

from diffusers_var_accel.lab.cli import main


def test_generate_with_the_tiny_model_writes_images(tmp_path, capsys):
    assert (
        main(
            ["generate", "a red circle", "a blue square", "--model", "tiny", "--output", str(tmp_path), "--seed", "3"]
        )
        == 0
    )
    report = json.loads((tmp_path / "generations.json").read_text())
    assert [r["prompt"] for r in report["images"]] == ["a red circle", "a blue square"]
    assert [r["seed"] for r in report["images"]] == [3, 4]
    from PIL import Image

    for r in report["images"]:
        assert Image.open(tmp_path / r["file"]).size == (256, 256)
    assert "RANDOM weights" in capsys.readouterr().err


def test_generate_rejects_an_unsupported_size(tmp_path, capsys):
    assert main(["generate", "a red circle", "--model", "tiny", "--height", "300", "--output", str(tmp_path)]) == 2
    assert "300x300" in capsys.readouterr().err


def test_generate_with_the_tiny_hart_model(tmp_path, capsys):
    assert main(["generate", "a red fox", "--model", "tiny-hart", "--output", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "generations.json").read_text())
    image = PIL.Image.open(tmp_path / record["images"][0]["file"])
    assert image.size == (record["width"], record["height"]) == (64, 64)
    assert "RANDOM weights" in capsys.readouterr().err


def test_generate_with_a_saved_hart_folder_and_hart_option_errors(tmp_path, capsys):
    from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline

    build_tiny_hart_pipeline(seed=0).save_pretrained(tmp_path / "hart")
    assert main(["generate", "a red fox", "--model", str(tmp_path / "hart"), "--output", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "a-red-fox-s0.png").is_file()
    assert (
        main(
            [
                "generate",
                "a red fox",
                "--model",
                str(tmp_path / "hart"),
                *"--tau 0.5 --output".split(),
                str(tmp_path / "o2"),
            ]
        )
        == 2
    )
    assert "--tau" in capsys.readouterr().err
    assert (
        main(
            [
                "generate",
                "a red fox",
                "--model",
                str(tmp_path / "hart"),
                *"--height 128 --output".split(),
                str(tmp_path / "o3"),
            ]
        )
        == 2
    )
    assert "64x64" in capsys.readouterr().err
    assert main(["generate", "x", "--model", str(tmp_path / "nothing"), "--output", str(tmp_path / "o4")]) == 2
    assert "model_index.json" in capsys.readouterr().err


def test_generate_defaults_to_the_embedded_model(tmp_path, capsys):
    assert main(["generate", "two red circles", "--output", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "generations.json").read_text())
    assert (record["height"], record["width"]) == (64, 64)
    assert PIL.Image.open(tmp_path / record["images"][0]["file"]).size == (64, 64)
    assert "RANDOM" not in capsys.readouterr().err
