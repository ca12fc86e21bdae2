"""``benchmarks/gpu.py`` (the one-GPU runner), run on the CPU with the tiny models, and its FLOP counts."""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.gpu import count_tflops_per_image, main  # noqa: E402


def test_cpu_smoke_run_writes_one_block_per_model_and_batch_size(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert main(["--models", "tiny,tiny-hart", "--device", "cpu", "--size", "256", "--methods", "baseline,lazyvar",
                 "--batch-sizes", "1,2", "--repeats", "1", "--warmup", "0", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [(b["model"], b["batch_size"]) for b in report["blocks"]] == [("tiny", 1), ("tiny", 2), ("tiny-hart", 1), ("tiny-hart", 2)]
    for block in report["blocks"]:
        assert [r["method"] for r in block["records"]] == ["baseline", "lazyvar"]
        assert block["records"][0]["speedup_vs_first"] == 1.0
        assert block["tflops_per_image"] == {"baseline": None, "lazyvar": None}  # no counted config for tiny models
    printed = capsys.readouterr().out
    assert "tiny 256x256 batch 2" in printed and "speed-up" in printed and "total" in printed


def test_bad_arguments(capsys):
    assert main(["--methods", "lazyvar,baseline"]) == 2
    assert "must start with baseline" in capsys.readouterr().err
    assert main(["--batch-sizes", "1,x"]) == 2
    assert "--batch-sizes" in capsys.readouterr().err


def test_flop_counts_of_the_real_hart_config():
    tflops = count_tflops_per_image("hart-0.7b", "hart", ["baseline", "lazyvar"], 1024, 1024)
    assert tflops["baseline"] == pytest.approx(55.70, abs=0.01)  # the README's counted numbers
    assert tflops["lazyvar"] == pytest.approx(31.13, abs=0.01)
