"""The embedded default model (a tiny Infinity trained on the shapes world) and the ``var-accel demo`` main job."""

from __future__ import annotations

import json

import pytest
import torch

from diffusers_var_accel import InfinityPipeline
from diffusers_var_accel.embedded import EMBEDDED_MODEL_PATH, EMBEDDED_SAMPLING
from diffusers_var_accel.pipelines.pipeline_loading import load_embedded_pipeline
from registry_lists import SPECS


@pytest.fixture(scope="module")
def pipe():
    p = load_embedded_pipeline()
    p.set_progress_bar_config(disable=True)
    return p


def test_packaged_folder_is_small_and_complete():
    files = [f for f in EMBEDDED_MODEL_PATH.rglob("*") if f.is_file()]
    assert sum(f.stat().st_size for f in files) < 30 * 2**20
    index = json.loads((EMBEDDED_MODEL_PATH / "model_index.json").read_text())
    assert index["_class_name"] == "InfinityPipeline"
    assert {"transformer", "vae", "text_encoder", "tokenizer"} <= set(index)


def test_loads_by_name_offline_with_its_fixed_schedule(pipe, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    named = InfinityPipeline.from_pretrained("embedded")
    assert named.transformer.config.scale_schedule == pipe.transformer.config.scale_schedule
    schedule = pipe.transformer.config.scale_schedule
    assert len(schedule) >= 9 and schedule[-1][1:] == [16, 16]
    areas = [h * w for _, h, w in schedule]
    assert sum(areas[-3:]) > 0.5 * sum(areas)  # the last three scales hold most tokens, as in the real model
    assert pipe.default_size == (64, 64)


def test_generates_deterministically_with_a_seed(pipe):
    def run(seed):
        return pipe(
            "a red circle", generator=torch.Generator().manual_seed(seed), output_type="pt", **EMBEDDED_SAMPLING
        ).images

    a, b, c = run(0), run(0), run(1)
    assert a.shape == (1, 3, 64, 64)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_demo_on_two_prompts_writes_its_files(tmp_path, capsys):
    from diffusers_var_accel.lab.cli import main

    assert main(["demo", "--num-prompts", "2", "--output", str(tmp_path)]) == 0

    def refuse(constant):
        raise AssertionError(f"report.json holds the non-JSON constant {constant}")

    report = json.loads((tmp_path / "report.json").read_text(), parse_constant=refuse)  # strict JSON
    assert report["methods"]["baseline"]["psnr_mean"] == "inf"  # identical images, written as a string
    assert list(report["methods"]) == list(SPECS)  # the baseline and every library method, in registry order
    assert len(report["prompts"]) == 2
    base = report["methods"]["baseline"]
    assert base["speedup"] == 1.0 and base["flops_ratio"] == 1.0 and base["ssim_mean"] == pytest.approx(1.0)
    for name, r in report["methods"].items():
        assert r["gflops"] > 0 and 0 <= r["scorer_accuracy"] <= 1 and len(r["scorer_correct"]) == 2, name
        if name != "baseline":
            assert r["flops_ratio"] > 1, name  # every preset removes counted work
    from PIL import Image

    width, height = Image.open(tmp_path / "grid.png").size
    assert (
        12 <= height - len(report["methods"]) * 128 <= 80 and 80 <= width - 2 * 128 <= 220
    )  # a caption row and a label column
    captured = capsys.readouterr()
    assert "| method |" in captured.out and "lazyvar" in captured.out
    assert "demo: loading the embedded model" in captured.err and "counting FLOPs" in captured.err  # progress
