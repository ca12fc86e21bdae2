"""``diffusers_var_accel/lab/bench/gpu.py`` (the one-GPU runner), run on the CPU with the tiny models, and its FLOP counts."""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from diffusers_var_accel.lab.bench.gpu import (  # noqa: E402
    OFFICIAL_ROW,
    add_speedups,
    block_order,
    count_flops_records,
    how_it_ran,
    main,
    read_flops_table,
)


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
    from diffusers_var_accel.lab.bench.gpu import _rows_for

    methods = ["baseline", "fastvar", "lazyvar", "depthvar"]
    assert [r["label"] for r in _rows_for("graphs", methods)] == ["baseline", "lazyvar", "fastvar", "depthvar"]
    assert [r["label"] for r in _rows_for("eager", methods)] == methods + [OFFICIAL_ROW]


def test_cpu_smoke_run_prints_one_table_and_writes_every_block(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    argv = "--models tiny --device cpu --size 256 --methods baseline,lazyvar --batch-sizes 1,2 --repeats 1"
    argv += " --warmup 0 --graph-warmup 1 --capture trace --flops none --json"
    assert main(argv.split() + [str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["torch"] and report["python"] and report["capture"] == "trace"
    assert [(b["model"], b["batch_size"], b["mode"]) for b in report["blocks"]] == block_order(
        ["tiny"], [1, 2], ["eager", "graphs"]
    )
    for block in report["blocks"]:
        labels = [r["label"] for r in block["records"]]
        assert labels == (
            ["baseline", "lazyvar", OFFICIAL_ROW] if block["mode"] == "eager" else ["baseline", "lazyvar"]
        )
        assert block["tflops_per_image"] == {"baseline": None, "lazyvar": None}  # --flops none
        for r in block["records"]:
            assert r["median_s"] > 0 and r["repeats"] == 1 and r["speedup_vs_eager"] > 0 and r["peak_gib"] > 0
            if block["mode"] == "graphs":
                assert r["passes_captured"] == 0 and r["passes_replayed"] > 0 and r["speedup_vs_graphs"] > 0
                assert r["fresh_input_check"] == {"tokens_equal": True, "latent_max_abs_diff": 0.0}
    printed = capsys.readouterr().out
    assert "graphs (" in printed and "replays)" in printed and "total" in printed


def test_time_budget_stops_new_blocks(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert (
        main(
            [
                *"--models tiny --device cpu --size 256 --methods baseline --batch-sizes 1,2 --modes eager --repeats 1 --warmup 0 --max-seconds 0 --json".split(),
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


def test_the_committed_flop_table_is_what_the_counter_counts():
    """The device run reads its FLOPs from benchmarks/results/gpu_flops.json (counted on a CPU): two of its entries
    counted again here equal it, and HART's baseline and LazyVAR are the README's counted numbers."""
    table = read_flops_table()
    assert set(table) == {"infinity-2b@1024x1024", "hart-0.7b@1024x1024"}
    counted = count_flops_records("hart-0.7b", "hart", ["baseline", "lazyvar"], 1024, 1024)
    for method in ("baseline", "lazyvar"):
        assert table["hart-0.7b@1024x1024"][method] == pytest.approx(counted[method], rel=1e-12)
        assert counted[method]["loop_tflops"] == counted[method]["total_tflops"] - counted[method]["vae_tflops"]
    assert counted["baseline"]["total_tflops"] == pytest.approx(55.70, abs=0.01)  # the README's counted numbers
    assert counted["lazyvar"]["total_tflops"] == pytest.approx(31.13, abs=0.01)
    assert set(table["infinity-2b@1024x1024"]) == {"baseline", "fastvar", "lazyvar", "depthvar", "arvar", "stagevar"}
    assert table["infinity-2b@1024x1024"]["baseline"]["total_tflops"] == pytest.approx(125.05, abs=0.01)


def test_graph_rows_and_official_sampling_use_the_pipeline_switches(tmp_path, monkeypatch, capsys):
    """With ``enable_cuda_graphs`` / ``set_sampling`` on the pipeline (a CPU no-op here) the graph rows are timed
    between enable and disable, and the official-style row samples in "official" mode, restored afterwards."""
    import warnings

    from diffusers_var_accel import InfinityPipeline

    events = []

    def enable_cuda_graphs(self, capture, max_workspaces):
        events.append(f"enable {capture} {max_workspaces}")
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
                *"--models tiny --device cpu --size 256 --methods baseline --batch-sizes 1 --repeats 1 --warmup 0 --graph-warmup 0 --no-flops --json".split(),
                str(out),
            ]
        )
        == 0
    )
    # eager block: baseline (device sampling), official-style (official, then restored); graphs block: enable with a
    # workspace per row .. the timed call, the fresh-input check (under graphs, then eagerly) .. disable
    assert events == [
        "call:device",
        "sampling=official",
        "call:official",
        "sampling=device",
        "enable cuda 1",
        "call:device",
        "call:device",
        "call:device",
        "disable",
    ]
    eager, graphs = json.loads(out.read_text())["blocks"]
    assert eager["records"][1]["sampled_with"] == "official"
    assert graphs["records"][0]["median_s"] > 0 and graphs["records"][0]["speedup_vs_graphs"] == 1.0
    assert graphs["records"][0]["speedup_vs_eager"] > 0


def test_an_interrupt_keeps_and_prints_what_was_measured(tmp_path, monkeypatch, capsys):
    """gpu.sh's timeout sends SIGINT: the runner stops, prints the one table of the blocks done and lists the rest."""
    import diffusers_var_accel.lab.bench.gpu as gpu

    measure, calls = gpu.measure_rows, []

    def interrupted_second_block(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return measure(*args, **kwargs)

    monkeypatch.setattr(gpu, "measure_rows", interrupted_second_block)
    monkeypatch.setattr(gpu, "_graphs_switch", lambda pipe, enable, *args: None)  # graph blocks "available" (no-op)
    out = tmp_path / "gpu.json"
    assert (
        main(
            [
                *"--models tiny --device cpu --size 256 --methods baseline --batch-sizes 1,2 --repeats 1 --warmup 0 --graph-warmup 0 --no-flops --json".split(),
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
                *"--models tiny --device cpu --size 256 --methods baseline,lazyvar --batch-sizes 1 --modes eager --repeats 2 --warmup 1 --no-flops --json".split(),
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
                *"--models tiny --device cpu --size 256 --methods baseline,lazyvar --batch-sizes 1 --repeats 3 --warmup 0 --no-flops --json".split(),
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


def test_dry_run_of_gpu_sh_drives_every_graph_row_through_replays(tmp_path):
    """``bash benchmarks/gpu.sh --dry-run``: the runner end to end on the CPU on the real 13-scale (Infinity) and
    14-scale (HART) schedules, every method, the graph rows through the trace stand-in: every graph row replayed
    every timed pass and captured none, its fresh-seed check holds, every row has a peak memory; JSON and log under
    ``$OUT``."""
    import os
    import subprocess

    # The device call's 390 s budget is the GPU's; on a CPU shared with other tests the dry run (about 220 s alone)
    # once ran past it and skipped its last block: this test checks the runner's rows, so it gives the dry run the
    # test's own time (the per-test limit is 900 s).
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "GPU_SH_DEADLINE": "840"}
    done = subprocess.run(
        # and the runner's own "no new block after --max-seconds" (300 s by default) moves with it
        ["bash", str(REPO / "benchmarks" / "gpu.sh"), "--dry-run", "--max-seconds", "780"],
        env=env,
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_results.json").read_text())
    assert [(b["model"], b["batch_size"], b["mode"]) for b in report["blocks"]] == block_order(
        ["tiny", "tiny-hart"], [1], ["eager", "graphs"]
    )
    log = (tmp_path / "gpu.log").read_text()
    assert "built tiny (infinity, 2 blocks, 13 scales" in log and "built tiny-hart (hart, 2 blocks, 14 scales" in log
    methods = ["baseline", "fastvar", "lazyvar", "depthvar", "arvar", "stagevar"]
    for block in report["blocks"]:
        records = block["records"]
        assert sorted(r["method"] for r in records if r["label"] != OFFICIAL_ROW) == sorted(methods)
        for r in records:
            assert r["median_s"] > 0 and r["peak_gib"] > 0, r
            if block["mode"] == "graphs":
                assert how_it_ran(block, r) == f"graphs ({r['passes_replayed']} replays)" and r["passes_replayed"] > 0
                assert r["fresh_input_check"] == {"tokens_equal": True, "latent_max_abs_diff": 0.0}, r
    assert log.count("so far:") == len(report["blocks"]) and "total" in log


def test_a_graph_row_that_captured_while_timed_is_a_bug_not_a_number():
    """Its ``ran`` says so, and it is neither a graph baseline nor given a ``vs graphs`` speed-up."""

    def record(label, median, captured):
        return {"label": label, "method": label, "median_s": median, "passes_captured": captured, "passes_replayed": 9}

    blocks = [
        {
            "model": "m",
            "batch_size": 1,
            "mode": "eager",
            "records": [{"label": "baseline", "method": "baseline", "median_s": 2.0}],
        },
        {
            "model": "m",
            "batch_size": 1,
            "mode": "graphs",
            "records": [record("baseline", 1.0, 0), record("lazyvar", 5.0, 3)],
        },
    ]
    add_speedups(blocks)
    base, lazy = blocks[1]["records"]
    assert how_it_ran(blocks[1], lazy) == "BUG: 3 captured while timed" and lazy["speedup_vs_graphs"] is None
    assert how_it_ran(blocks[1], base) == "graphs (9 replays)" and base["speedup_vs_graphs"] == 1.0
    assert lazy["speedup_vs_eager"] == 0.4  # against the eager baseline it is still a measured time
    blocks[1]["records"][0]["passes_captured"] = 1  # a graph baseline that captured: no graph baseline at all
    add_speedups(blocks)
    assert all(r["speedup_vs_graphs"] is None for r in blocks[1]["records"])


def test_a_model_that_fails_to_build_skips_its_blocks_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    import diffusers_var_accel.lab.bench.gpu as gpu

    build = gpu.build_pipeline

    def failing(model, *args, **kwargs):
        if model == "tiny-hart":
            raise RuntimeError("CUDA out of memory (simulated)")
        return build(model, *args, **kwargs)

    monkeypatch.setattr(gpu, "build_pipeline", failing)
    out = tmp_path / "gpu.json"
    argv = (
        "--models tiny-hart,tiny --device cpu --size 256 --methods baseline --batch-sizes 1 --modes eager --repeats 1"
    )
    assert main(argv.split() + ["--warmup", "0", "--flops", "none", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [b["model"] for b in report["blocks"]] == ["tiny"]
    assert report["skipped"] == ["tiny-hart batch 1 eager: failed: RuntimeError: CUDA out of memory (simulated)"]
    assert "error: building tiny-hart failed" in capsys.readouterr().out


def test_gpu_sh_returns_the_runners_status_after_its_deadline(tmp_path):
    """At the deadline gpu.sh interrupts the runner, which keeps what it measured, writes the JSON and exits 0; the
    script returns that 0 (not timeout's 124)."""
    import os
    import subprocess

    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "GPU_SH_DEADLINE": "20"}
    argv = "--models tiny --device cpu --size 256 --methods baseline --modes eager --batch-sizes 1 --repeats 1000"
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu.sh"), *argv.split(), "--warmup", "0", "--flops", "none"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_results.json").read_text())
    (block,) = report["blocks"]
    assert block["interrupted"] is True and block["records"][0]["repeats"] > 0
    assert "total" in (tmp_path / "gpu.log").read_text()
