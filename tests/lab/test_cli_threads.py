"""``--threads N`` on the commands that generate: checked in one line, set in torch before the work, put back after."""

from __future__ import annotations

import pytest
import torch

from diffusers_var_accel.lab import cli

COMMANDS = ["generate", "demo", "serve", "bench"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("value", ["0", "-2", "1.5", "two"])
def test_a_bad_thread_count_is_one_line(command, value, capsys):
    argv = [command] + (["a red circle"] if command == "generate" else []) + [f"--threads={value}"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --threads {value}: must be a whole number of threads, 1 or more"]


def test_the_default_is_the_usable_cores_less_one(monkeypatch):
    for cores, expected in ((1, 1), (2, 1), (16, 15)):
        monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid, n=cores: set(range(n)), raising=False)
        assert cli.default_threads() == expected
        assert cli.parse_threads(None) == expected
    assert cli.parse_threads("3") == 3


def _record_threads(monkeypatch, module, name, seen, result=None):
    def record(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return result

    monkeypatch.setattr(module, name, record)


@pytest.mark.parametrize("command", COMMANDS)
def test_the_work_runs_with_the_asked_threads_and_they_are_put_back(command, monkeypatch, tmp_path):
    import diffusers_var_accel.lab.bench as bench
    import diffusers_var_accel.lab.demo as demo
    import diffusers_var_accel.lab.generate_job as generate_job
    import diffusers_var_accel.lab.serve as serve

    seen = []
    target = {
        "generate": (generate_job, "run_generate_job", 0),
        "demo": (demo, "run_demo", None),
        "serve": (serve, "serve", None),
        "bench": (bench, "run_bench", None),
    }[command]
    _record_threads(monkeypatch, *target[:2], seen, target[2])
    if command == "serve":
        pytest.importorskip("gradio", reason="serve needs the [app] extra (gradio)")
    before = torch.get_num_threads()
    wanted = 3 if before != 3 else 2
    argv = [command] + (["a red circle"] if command == "generate" else [])
    if command != "serve":
        argv += ["--output", str(tmp_path / "out")]
    assert cli.main(argv + ["--threads", str(wanted)]) == 0
    assert cli.main(argv) == 0  # no flag: the default
    assert seen == [wanted, cli.default_threads()]
    assert torch.get_num_threads() == before
