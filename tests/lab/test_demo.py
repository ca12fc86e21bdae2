"""``var-accel demo``: its captions, its FLOPs (the same as ``var-accel bench``'s) and what the docs say it draws."""

import re
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from diffusers_var_accel.lab.demo import caption_grid, default_prompts

ROOT = Path(__file__).resolve().parents[2]


def test_caption_grid_labels_every_row_and_column():
    prompts = ["a circle", "a green circle above a purple square and a yellow triangle", "x"]
    methods = ["baseline", "fastvar:skip_last_scales=false,prune_ratios=[0.3,0.4]"]
    cell = 64
    rows = [[Image.new("RGB", (16, 16), "white") for _ in prompts] for _ in methods]
    grid = np.asarray(caption_grid(rows, methods, prompts, cell=cell).convert("L"))
    label_w = grid.shape[1] - cell * len(prompts)
    header_h = grid.shape[0] - cell * len(methods)
    assert label_w >= 80 and header_h >= 12
    for j in range(len(prompts)):  # text (dark pixels) above every column
        assert (grid[:header_h, label_w + j * cell : label_w + (j + 1) * cell] < 128).any(), j
    for i in range(len(methods)):  # and left of every row
        assert (grid[header_h + i * cell : header_h + (i + 1) * cell, :label_w] < 128).any(), i

    # the long prompt wraps onto more lines than the short one: its caption goes lower
    def lowest_ink(j):
        return np.nonzero((grid[:header_h, label_w + j * cell : label_w + (j + 1) * cell] < 128).any(axis=1))[0].max()

    assert lowest_ink(1) > lowest_ink(0)


@pytest.mark.parametrize("doc", ["README.md", "docs/quickstart.md"])
def test_docs_quote_the_prompts_the_demo_draws(doc):
    text = " ".join((ROOT / doc).read_text().split())
    listed = re.search(r"generates the first six held-out shapes prompts \(([^;)]*)", text)
    assert listed, f"{doc} no longer says which prompts var-accel demo draws"
    assert re.findall(r'"([^"]+)"', listed.group(1)) == default_prompts(6)
    assert 'a blue square to the left of a yellow triangle")' not in text


def test_demo_and_bench_count_the_same_flops(tmp_path):
    from diffusers_var_accel.lab.bench import run_bench
    from diffusers_var_accel.lab.demo import run_demo
    from diffusers_var_accel.pipelines.pipeline_loading import load_embedded_pipeline

    pipe = load_embedded_pipeline()
    demo = run_demo(
        num_prompts=1, methods=["baseline", "lazyvar"], output_dir=tmp_path / "demo", pipe=pipe, progress=False
    )
    bench = run_bench(
        num_prompts=1,
        methods="baseline,lazyvar",
        repeats=1,
        warmup=0,
        output_dir=tmp_path / "bench",
        pipe=pipe,
        save_images=False,
        progress=False,
        fid_feature_extractor=None,
        lpips_fn=None,
        verbose=False,
    )
    assert demo["prompts"][0] == bench["items"][0]["prompt"] and demo["seeds"][0] == bench["items"][0]["seed"]
    for method in ("baseline", "lazyvar"):
        assert demo["methods"][method]["gflops"] == pytest.approx(
            bench["methods"][method]["flops"]["total_gflops"], rel=1e-12
        )
    assert demo["methods"]["lazyvar"]["flops_ratio"] == pytest.approx(bench["methods"]["lazyvar"]["flops"]["ratio"])


def test_demo_refuses_to_overwrite_an_earlier_demo_unless_asked(tmp_path, capsys):
    from diffusers_var_accel.lab.cli import main

    out = tmp_path / "demo"
    out.mkdir()
    (out / "report.json").write_text("{}")
    assert main(["demo", "--num-prompts", "1", "--methods", "baseline", "-o", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{out} holds an earlier demo's report.json: pass --overwrite" in err
    assert (out / "report.json").read_text() == "{}"  # untouched


def test_demo_warms_every_method_up_and_reports_its_spread(tmp_path, monkeypatch):
    """One untimed call per method before the timed, interleaved ones; each method's spread is in the report, and a
    note names a method whose times spread widely."""
    from diffusers_var_accel.lab import demo as demo_module
    from diffusers_var_accel.pipelines.pipeline_loading import load_embedded_pipeline

    pipe = load_embedded_pipeline()
    calls = []
    original = type(pipe).__call__

    def recording(self, *args, acceleration=None, **kwargs):
        calls.append(type(acceleration).__name__ if acceleration is not None else "baseline")
        return original(self, *args, acceleration=acceleration, **kwargs)

    monkeypatch.setattr(type(pipe), "__call__", recording)
    ticks = iter([0.0, 1.0, 10.0, 11.0, 20.0, 21.0, 30.0, 34.0])  # lazyvar: 1 s then 4 s
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks))
    report = demo_module.run_demo(
        num_prompts=1, methods=["baseline", "lazyvar"], repeats=2, output_dir=tmp_path / "d", pipe=pipe, progress=False
    )
    assert calls[:6] == ["baseline", "LazyVARScheduler"] * 3  # warm-up of each, then two interleaved rounds
    assert report["methods"]["baseline"]["spread"] == 0.0
    assert report["methods"]["lazyvar"]["spread"] == pytest.approx(3 / 2.5)
    assert [n.split(":")[0] for n in report["spread_notes"]] == ["lazyvar"]
    assert "note: lazyvar: its times spread by 120% of the median" in demo_module.format_table(report)
    # the speed-up is the median of the per-round ratios: 1 s / 1 s and 1 s / 4 s
    assert report["methods"]["lazyvar"]["speedup"] == pytest.approx((1.0 + 0.25) / 2)
    assert report["methods"]["lazyvar"]["unsteady"] and "unsteady" in demo_module.format_table(report)
    threads = __import__("torch").get_num_threads()
    assert report["threads"] == threads and f"timed with {threads} torch CPU thread" in demo_module.format_table(
        report
    )
