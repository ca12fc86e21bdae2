"""``var-accel generate --prompts-file`` split across 2 CPU processes (torchrun, gloo): the same images and manifest
as 1 process, and a resumed run generates only what is missing."""

import json
import os
import subprocess
import sys
from pathlib import Path

PROMPTS = ["a circle", "two red circles", "a blue square", "a green triangle"]


def _run(command, prompts_file: Path, out: Path) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}  # the same threads per process in both runs
    done = subprocess.run(
        command + ["generate", "--prompts-file", str(prompts_file), "--seed", "3", "--no-progress", "-o", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stderr


def _files(out: Path):
    return {path.name: path.read_bytes() for path in sorted(out.glob("*.png"))}


def test_two_processes_give_the_same_images_as_one_and_resume(tmp_path):
    single = [sys.executable, "-m", "diffusers_var_accel"]
    double = [
        sys.executable,
        *"-m torch.distributed.run --standalone --nproc_per_node 2 -m diffusers_var_accel".split(),
    ]
    three, four = tmp_path / "three.txt", tmp_path / "four.txt"
    three.write_text("\n".join(PROMPTS[:3]) + "\n")
    four.write_text("\n".join(PROMPTS) + "\n")

    _run(single, four, tmp_path / "one")
    _run(double, three, tmp_path / "two")
    one, two = (
        json.loads((tmp_path / "one" / "generations.json").read_text()),
        json.loads((tmp_path / "two" / "generations.json").read_text()),
    )
    assert [r["process"] for r in two["images"]] == [0, 0, 1]  # 3 items split between 2 processes, merged in order
    assert [(r["prompt"], r["seed"], r["file"]) for r in two["images"]] == [
        (r["prompt"], r["seed"], r["file"]) for r in one["images"][:3]
    ]
    assert two["settings"] == one["settings"]
    assert not list((tmp_path / "two").glob(".generations-process*.jsonl"))
    made = {name: (tmp_path / "two" / name).stat().st_mtime_ns for name in _files(tmp_path / "two")}

    # the 4-prompt file into the same folder, on 2 processes: only the 4th image is generated
    err = _run(double, four, tmp_path / "two")
    assert "already there" in err
    assert {name: (tmp_path / "two" / name).stat().st_mtime_ns for name in made} == made
    resumed = json.loads((tmp_path / "two" / "generations.json").read_text())
    assert [(r["prompt"], r["seed"], r["file"]) for r in resumed["images"]] == [
        (r["prompt"], r["seed"], r["file"]) for r in one["images"]
    ]
    assert _files(tmp_path / "two") == _files(tmp_path / "one")  # byte for byte
