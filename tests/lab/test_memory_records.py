"""The memory meter's counted peak in the other records (issue 46, item 1): ``var-accel flops --memory`` and the GPU
runner's ``--count-memory`` carry the count of the same setting. The meter itself is tested in
``test_memory_meter.py``; here a stand-in ``count_memory`` records the settings it was asked for, so the test checks
that each row gets the count of its own model, method, batch, size, dtype and guidance."""

from __future__ import annotations

import dataclasses
import json

import pytest

from diffusers_var_accel.lab.bench import flops, gpu, memory


@pytest.fixture
def asked(monkeypatch):
    """Replace the meter by a stand-in that returns a distinct peak per setting and records each setting."""
    settings_seen = []

    def count_memory(settings):
        settings.check()
        settings_seen.append(settings)
        return {"peak_bytes": 1000 * len(settings_seen) + settings.batch_size}

    monkeypatch.setattr(memory, "count_memory", count_memory)
    return settings_seen


@pytest.fixture
def quick_flops(monkeypatch):
    """The families' FLOP counts (tested in test_flops.py, minutes on a shared CPU) replaced by their output's shape:
    a comparison's ``summary`` rows, or one result."""
    real = flops.family_flops()

    def run_cli(args, methods):
        rows = [{"method": m, "total_tflops": 1.0} for m in ["baseline", *methods]]
        print(json.dumps({"summary": rows} if methods else {"total_tflops": 1.0}) if args.json else "FLOP table")
        return 0

    monkeypatch.setattr(
        flops, "family_flops", lambda: {n: dataclasses.replace(s, run_cli=run_cli) for n, s in real.items()}
    )


def test_flops_memory_flag_adds_the_counted_peak_of_each_method(asked, quick_flops, capsys):
    assert flops.main(["--model", "hart-0.7b", "--accel", "lazyvar", "--batch-size", "2", "--memory", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [(r["method"], r["peak_bytes"]) for r in result["summary"]] == [("baseline", 1002), ("lazyvar", 2002)]
    assert [(s.model, s.accel, s.batch_size, s.cfg) for s in asked] == [
        ("hart-0.7b", None, 2, True),
        ("hart-0.7b", "lazyvar", 2, True),
    ]
    asked.clear()
    assert flops.main(["--model", "hart-0.7b", "--no-cfg", "--memory"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("FLOP table") and "Counted peak device memory" in out and "baseline: 0.00 GiB" in out
    assert [(s.accel, s.cfg) for s in asked] == [(None, False)]
    asked.clear()
    assert flops.main(["--model", "infinity-2b", "--height", "512", "--width", "512", "--memory", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["peak_bytes"] == 1001
    assert [(s.model, s.height, s.width) for s in asked] == [("infinity-2b", 512, 512)]


def test_gpu_runner_rows_get_the_counted_peak_once_per_setting(asked, monkeypatch):
    monkeypatch.setattr(gpu, "_COUNTED_PEAKS", {})
    meta = {"height": 1024, "width": 1024, "dtype": "bfloat16"}
    records = [{"method": "baseline", "peak_gib": 9.0}, {"method": "lazyvar", "peak_gib": 7.0}]
    gpu.add_counted_peaks(records, "infinity-2b", 4, meta)
    again = [{"method": "lazyvar"}]
    gpu.add_counted_peaks(again, "infinity-2b", 4, meta)  # the same setting in another block: not counted again
    assert [r["counted_peak_gib"] * 2**30 for r in records + again] == [1004, 2004, 2004]
    assert [(s.model, s.accel, s.batch_size, s.dtype, s.height) for s in asked] == [
        ("infinity-2b", None, 4, "bfloat16", 1024),
        ("infinity-2b", "lazyvar", 4, "bfloat16", 1024),
    ]
    tiny = [{"method": "baseline"}]
    gpu.add_counted_peaks(tiny, "tiny", 1, {"height": 1024, "width": 1024, "dtype": "float32"})
    assert tiny[0]["counted_peak_gib"] is None
    assert "unknown model 'tiny'" in tiny[0]["counted_peak_note"]
