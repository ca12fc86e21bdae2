"""``benchmarks/gpu.py`` (the one-GPU runner), run on the CPU with the tiny models, and its FLOP counts."""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.gpu import OFFICIAL_ROW, block_order, count_tflops_per_image, main  # noqa: E402


def test_blocks_run_in_order_of_importance():
    assert block_order(["infinity-2b", "hart-0.7b"], [1, 4], ["eager", "graphs"]) == [
        ("infinity-2b", 1, "eager"),
        ("hart-0.7b", 1, "eager"),
        ("infinity-2b", 1, "graphs"),
        ("hart-0.7b", 1, "graphs"),
        ("infinity-2b", 4, "eager"),
        ("hart-0.7b", 4, "eager"),
        ("infinity-2b", 4, "graphs"),
        ("hart-0.7b", 4, "graphs"),
    ]


def test_graph_rows_start_with_the_baseline_then_lazyvar():
    from benchmarks.gpu import _rows_for

    methods = ["baseline", "fastvar", "lazyvar", "depthvar"]
    assert [r["label"] for r in _rows_for("graphs", methods)] == ["baseline", "lazyvar", "fastvar", "depthvar"]
    assert [r["label"] for r in _rows_for("eager", methods)] == methods + [OFFICIAL_ROW]


def test_cpu_smoke_run_prints_one_table_and_writes_every_block(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert (
        main(
            [
                "--models",
                "tiny,tiny-hart",
                "--device",
                "cpu",
                "--size",
                "256",
                "--methods",
                "baseline,lazyvar",
                "--batch-sizes",
                "1,2",
                "--repeats",
                "1",
                "--warmup",
                "0",
                "--graph-warmup",
                "0",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert [(b["model"], b["batch_size"], b["mode"]) for b in report["blocks"]] == block_order(
        ["tiny", "tiny-hart"], [1, 2], ["eager", "graphs"]
    )
    for block in report["blocks"]:
        labels = [r["label"] for r in block["records"]]
        assert labels == (
            ["baseline", "lazyvar", OFFICIAL_ROW] if block["mode"] == "eager" else ["baseline", "lazyvar"]
        )
        assert block["tflops_per_image"] == {"baseline": None, "lazyvar": None}  # no counted config for tiny models
        for r in block["records"]:
            if block["mode"] == "eager":
                assert r["median_s"] > 0 and r["repeats"] == 1
            if r["median_s"] is None:  # graphs unavailable: n/a, with the reason
                assert block["mode"] == "graphs" and "enable_cuda_graphs" in r["skipped"]
            else:
                assert r["median_s"] > 0 and r["speedup_vs_eager"] > 0
        eager_base = block["records"][0]
        if block["mode"] == "eager":
            assert eager_base["speedup_vs_eager"] == 1.0
    printed = capsys.readouterr().out
    assert printed.count("so far:") == len(report["blocks"])  # the table so far after every block
    table = printed[printed.rindex("model ") :]
    assert table.count("median s") == 1  # then the one final table of every row
    assert "vs eager" in table and "vs graphs" in table and "peak GiB" in table and OFFICIAL_ROW in table
    rows = [line for line in table.splitlines() if line.startswith(("tiny ", "tiny-hart "))]
    assert len(rows) == sum(len(b["records"]) for b in report["blocks"])
    from diffusers_var_accel import HARTPipeline, InfinityPipeline

    graph_rows = {
        model: [line for line in rows if line.startswith(model + " ") and " graphs " in line]
        for model in ("tiny", "tiny-hart")
    }
    for model, cls in (("tiny", InfinityPipeline), ("tiny-hart", HARTPipeline)):
        assert len(graph_rows[model]) == 2 * 2  # two methods, two batch sizes
        for line in graph_rows[model]:
            if hasattr(cls, "enable_cuda_graphs"):  # a no-op on the CPU: timed as eager
                assert "n/a: the pipeline has no enable_cuda_graphs()" not in line
            else:
                assert line.endswith("n/a: the pipeline has no enable_cuda_graphs()")
    assert "total" in printed


def test_time_budget_stops_new_blocks(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert (
        main(
            [
                "--models",
                "tiny",
                "--device",
                "cpu",
                "--size",
                "256",
                "--methods",
                "baseline",
                "--batch-sizes",
                "1,2",
                "--modes",
                "eager",
                "--repeats",
                "1",
                "--warmup",
                "0",
                "--max-seconds",
                "0",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["blocks"] == [] and report["skipped"] == [
        "tiny batch 1 eager: time budget spent",
        "tiny batch 2 eager: time budget spent",
    ]
    assert "skipped tiny batch 1 eager" in capsys.readouterr().out


def test_bad_arguments(capsys):
    assert main(["--methods", "lazyvar,baseline"]) == 2
    assert "must start with baseline" in capsys.readouterr().err
    assert main(["--batch-sizes", "1,x"]) == 2
    assert "--batch-sizes" in capsys.readouterr().err
    assert main(["--modes", "eager,compiled"]) == 2
    assert "--modes 'eager,compiled'" in capsys.readouterr().err


def test_flop_counts_of_the_real_hart_config():
    tflops = count_tflops_per_image("hart-0.7b", "hart", ["baseline", "lazyvar"], 1024, 1024)
    assert tflops["baseline"] == pytest.approx(55.70, abs=0.01)  # the README's counted numbers
    assert tflops["lazyvar"] == pytest.approx(31.13, abs=0.01)


def test_graph_rows_and_official_sampling_use_the_pipeline_switches(tmp_path, monkeypatch, capsys):
    """With ``enable_cuda_graphs`` / ``set_sampling`` on the pipeline (a CPU no-op here) the graph rows are timed
    between enable and disable, and the official-style row samples in "official" mode, restored afterwards."""
    import warnings

    from diffusers_var_accel import InfinityPipeline

    events = []

    def enable_cuda_graphs(self):
        events.append("enable")
        warnings.warn("CUDA graphs need a CUDA device: this does nothing on cpu")

    def set_sampling(self, mode):
        events.append(f"sampling={mode}")
        self.__dict__["_test_sampling"] = mode

    original_call = InfinityPipeline.__call__

    def call(self, *args, **kwargs):
        events.append(f"call:{self.__dict__.get('_test_sampling', 'device')}")
        return original_call(self, *args, **kwargs)

    monkeypatch.setattr(InfinityPipeline, "enable_cuda_graphs", enable_cuda_graphs, raising=False)
    monkeypatch.setattr(InfinityPipeline, "disable_cuda_graphs", lambda self: events.append("disable"), raising=False)
    monkeypatch.setattr(InfinityPipeline, "set_sampling", set_sampling, raising=False)
    monkeypatch.setattr(
        InfinityPipeline,
        "sampling",
        property(lambda self: self.__dict__.get("_test_sampling", "device")),
        raising=False,
    )
    monkeypatch.setattr(InfinityPipeline, "__call__", call)
    out = tmp_path / "gpu.json"
    assert (
        main(
            [
                "--models",
                "tiny",
                "--device",
                "cpu",
                "--size",
                "256",
                "--methods",
                "baseline",
                "--batch-sizes",
                "1",
                "--repeats",
                "1",
                "--warmup",
                "0",
                "--graph-warmup",
                "0",
                "--no-flops",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    # eager block: baseline (device sampling), official-style (official, then restored); graphs block: enable .. disable
    assert events == [
        "call:device",
        "sampling=official",
        "call:official",
        "sampling=device",
        "enable",
        "call:device",
        "disable",
    ]
    eager, graphs = json.loads(out.read_text())["blocks"]
    assert eager["records"][1]["sampled_with"] == "official"
    assert graphs["records"][0]["median_s"] > 0 and graphs["records"][0]["speedup_vs_graphs"] == 1.0
    assert graphs["records"][0]["speedup_vs_eager"] > 0


def test_an_interrupt_keeps_and_prints_what_was_measured(tmp_path, monkeypatch, capsys):
    """gpu.sh's timeout sends SIGINT: the runner stops, prints the one table of the blocks done and lists the rest."""
    import benchmarks.gpu as gpu

    measure, calls = gpu.measure_rows, []

    def interrupted_second_block(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return measure(*args, **kwargs)

    monkeypatch.setattr(gpu, "measure_rows", interrupted_second_block)
    monkeypatch.setattr(
        gpu, "_graphs_switch", lambda pipe, enable: (None, None)
    )  # graph blocks "available" (CPU no-op)
    out = tmp_path / "gpu.json"
    assert (
        main(
            [
                "--models",
                "tiny",
                "--device",
                "cpu",
                "--size",
                "256",
                "--methods",
                "baseline",
                "--batch-sizes",
                "1,2",
                "--repeats",
                "1",
                "--warmup",
                "0",
                "--graph-warmup",
                "0",
                "--no-flops",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert [(b["batch_size"], b["mode"]) for b in report["blocks"]] == [(1, "eager")]
    assert report["skipped"] == [
        "tiny batch 1 graphs: interrupted",
        "tiny batch 2 eager: interrupted",
        "tiny batch 2 graphs: interrupted",
    ]
    assert "interrupted" not in report["blocks"][0]
    printed = capsys.readouterr().out
    assert "tiny             1 eager   baseline" in printed and "skipped tiny batch 2 graphs: interrupted" in printed


def test_a_failing_row_keeps_the_others(tmp_path, monkeypatch, capsys):
    """A row that raises (an OOM, a capture error) is reported with its error; the other rows are timed."""
    from diffusers_var_accel import InfinityPipeline

    original_call = InfinityPipeline.__call__

    def call(self, *args, acceleration=None, **kwargs):
        if acceleration is not None:
            raise RuntimeError("CUDA out of memory (simulated)")
        return original_call(self, *args, acceleration=acceleration, **kwargs)

    monkeypatch.setattr(InfinityPipeline, "__call__", call)
    out = tmp_path / "gpu.json"
    assert (
        main(
            [
                "--models",
                "tiny",
                "--device",
                "cpu",
                "--size",
                "256",
                "--methods",
                "baseline,lazyvar",
                "--batch-sizes",
                "1",
                "--modes",
                "eager",
                "--repeats",
                "2",
                "--warmup",
                "1",
                "--no-flops",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    (block,) = json.loads(out.read_text())["blocks"]
    records = {r["label"]: r for r in block["records"]}
    assert records["baseline"]["repeats"] == 2 and records[OFFICIAL_ROW]["repeats"] == 2
    assert records["lazyvar"]["median_s"] is None
    assert records["lazyvar"]["skipped"] == "failed: RuntimeError: CUDA out of memory (simulated)"
    table = capsys.readouterr().out
    assert "failed: RuntimeError: CUDA out of memory (simulated)" in table and " eager " in table


def test_an_interrupt_inside_a_block_keeps_its_finished_rounds(tmp_path, monkeypatch):
    """The deadline's SIGINT in the middle of a block: the rounds already timed stay in the JSON and the table."""
    from diffusers_var_accel import InfinityPipeline

    original_call, calls = InfinityPipeline.__call__, []

    def call(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # baseline, lazyvar, official-style of round 1, then round 2 is interrupted
            raise KeyboardInterrupt
        return original_call(self, *args, **kwargs)

    monkeypatch.setattr(InfinityPipeline, "__call__", call)
    out = tmp_path / "gpu.json"
    assert (
        main(
            [
                "--models",
                "tiny",
                "--device",
                "cpu",
                "--size",
                "256",
                "--methods",
                "baseline,lazyvar",
                "--batch-sizes",
                "1",
                "--repeats",
                "3",
                "--warmup",
                "0",
                "--no-flops",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    (block,) = report["blocks"]
    assert block["interrupted"] is True and block["mode"] == "eager"
    assert [r["repeats"] for r in block["records"]] == [1, 1, 1]
    assert report["skipped"] == ["tiny batch 1 graphs: interrupted"]


def test_dry_run_of_gpu_sh_writes_its_results_under_out(tmp_path):
    """``bash benchmarks/gpu.sh --dry-run``: the runner end to end on the CPU, JSON and log under ``$OUT``."""
    import os
    import subprocess

    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu.sh"), "--dry-run", "--methods", "baseline,lazyvar"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_results.json").read_text())
    assert [(b["model"], b["batch_size"], b["mode"]) for b in report["blocks"]] == block_order(
        ["tiny", "tiny-hart"], [1, 2], ["eager", "graphs"]
    )
    assert all(r["median_s"] > 0 for b in report["blocks"] for r in b["records"])
    log = (tmp_path / "gpu.log").read_text()
    assert log.count("so far:") == len(report["blocks"]) and "total" in log
