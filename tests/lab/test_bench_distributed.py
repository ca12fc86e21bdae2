"""``var-accel bench`` split across 2 CPU processes (torchrun, gloo) gives the same per-item results as 1 process."""

import json
import os
import subprocess
import sys
from pathlib import Path

ARGS = "bench --num-prompts 3 --seeds 0 --methods baseline,lazyvar --repeats 1 --warmup 0 --no-progress --no-images".split()


def _run(command, tmp_path: Path, name: str) -> dict:
    out = tmp_path / name
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}  # the same threads per process in both runs
    done = subprocess.run(
        command + ARGS + ["--output", str(out)], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((out / "results.json").read_text())


def test_two_processes_give_the_same_items_as_one(tmp_path):
    single = _run([sys.executable, "-m", "diffusers_var_accel"], tmp_path, "one")
    double = _run(
        [sys.executable, *"-m torch.distributed.run --standalone --nproc_per_node 2 -m diffusers_var_accel".split()],
        tmp_path,
        "two",
    )
    assert single["run"]["num_processes"] == 1 and double["run"]["num_processes"] == 2
    assert [p["num_items"] for p in double["run"]["processes"]] == [2, 1]  # 3 items split between 2 processes
    assert [it["process"] for it in double["items"]] == [0, 0, 1]

    def comparable(results):
        return [
            (
                it["prompt_index"],
                it["seed"],
                it["prompt"],
                {m: {k: r[k] for k in ("sha256", "psnr", "ssim", "scorer_correct")} for m, r in it["methods"].items()},
            )
            for it in results["items"]
        ]

    assert comparable(double) == comparable(single)
    for method in ("baseline", "lazyvar"):
        one, two = single["methods"][method], double["methods"][method]
        assert one["fidelity"] == two["fidelity"] and one["scorer"] == two["scorer"] and one["flops"] == two["flops"]
        assert two["seconds_per_image"]["n"] == 3 and len(two["speedup_per_process"]) == 2
