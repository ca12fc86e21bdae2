"""The ``var-accel`` command line (the README's main job)."""

import json

from diffusers_var_accel.cli import main


def test_generate_with_the_default_tiny_model_writes_images(tmp_path, capsys):
    assert main(["generate", "a red circle", "a blue square", "--output", str(tmp_path), "--seed", "3"]) == 0
    report = json.loads((tmp_path / "generations.json").read_text())
    assert [r["prompt"] for r in report["images"]] == ["a red circle", "a blue square"]
    assert [r["seed"] for r in report["images"]] == [3, 4]
    from PIL import Image

    for r in report["images"]:
        assert Image.open(tmp_path / r["file"]).size == (256, 256)
    assert "RANDOM weights" in capsys.readouterr().err


def test_generate_rejects_an_unsupported_size(tmp_path, capsys):
    assert main(["generate", "a red circle", "--height", "300", "--output", str(tmp_path)]) == 2
    assert "300x300" in capsys.readouterr().err
