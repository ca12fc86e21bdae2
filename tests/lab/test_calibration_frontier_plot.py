"""``scripts/calibration_frontier.py --plot-from``: draws an earlier run's rows, measures nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def frontier_script():
    return load_script("calibration_frontier")


def test_plot_from_draws_a_recorded_run(frontier_script, tmp_path, monkeypatch):
    def no_measuring(*args, **kwargs):
        raise AssertionError("--plot-from must not measure")

    monkeypatch.setattr(frontier_script, "measure", no_measuring)
    rows = json.loads((ROOT / "benchmarks/calibration/embedded_frontier_heldout_strict.json").read_text())
    source = tmp_path / "run.json"
    source.write_text(json.dumps(rows[:4]))
    out = tmp_path / "plot.png"
    assert frontier_script.main(["--plot-from", str(source), "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_from_refuses_a_missing_plot_or_a_foreign_file(frontier_script, tmp_path, capsys):
    source = tmp_path / "run.json"
    source.write_text(json.dumps([{"name": "lazyvar"}]))
    with pytest.raises(SystemExit):
        frontier_script.main(["--plot-from", str(source)])
    assert "give --plot PATH" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        frontier_script.main(["--plot-from", str(source), "--plot", str(tmp_path / "p.png")])
    assert "first row is the baseline" in capsys.readouterr().err
