"""A process killed (SIGKILL, as ``kill -9``) while it writes leaves no half-written file where a finished one is
expected, and the same command again completes the work: ``generate``, ``calibrate``, ``save_pretrained`` and
``convert``.

Each case runs the real command in a child process whose writer is made to die at a chosen point: half-way through
writing a file (its temporary is truncated to half, then the process kills itself), or just before a file is renamed
into place. Then the files are read back, and the same command runs again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_DIR = Path(
    os.environ.get("VAR_ACCEL_INFINITY_FIXTURE", Path(__file__).resolve().parents[1] / "fixtures" / "infinity")
)

#: Child-process preamble, the writer's death. ``KILL_HOOK=replace``: ``os.replace`` onto a path whose name matches
#: ``KILL_NAME`` (a glob), on its ``KILL_AT``-th such call. ``KILL_HOOK=save_file``: safetensors' ``save_file`` (how
#: diffusers writes weights), on its ``KILL_AT``-th call, once it has written. Then the file is truncated to half its
#: size (``KILL_MODE=half``; for ``replace`` the temporary) or left whole (``before-rename``), and the process
#: SIGKILLs itself: the state a writer killed at that moment leaves.
PREAMBLE = textwrap.dedent("""
    import fnmatch, os, signal, sys
    import safetensors.torch
    _calls = [0]
    def _die(path):
        if os.environ.get("KILL_MODE") == "half" and os.path.isfile(path):
            os.truncate(path, os.path.getsize(path) // 2)
        os.kill(os.getpid(), signal.SIGKILL)
    def _due():
        _calls[0] += 1
        return _calls[0] == int(os.environ.get("KILL_AT", "1"))
    if os.environ["KILL_HOOK"] == "replace":
        _replace = os.replace
        def _dying_replace(src, dst, *args, **kwargs):
            if fnmatch.fnmatch(os.path.basename(os.fspath(dst)), os.environ["KILL_NAME"]) and _due():
                _die(src)
            return _replace(src, dst, *args, **kwargs)
        os.replace = _dying_replace
    else:
        _save_file = safetensors.torch.save_file
        def _dying_save_file(tensors, filename, *args, **kwargs):
            out = _save_file(tensors, filename, *args, **kwargs)
            if _due():
                _die(filename)
            return out
        safetensors.torch.save_file = _dying_save_file
""")


def run_child(
    code: str, kill_name=None, kill_at=1, mode="half", hook="replace", cwd=None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if kill_name is not None or hook == "save_file":
        env.update(KILL_HOOK=hook, KILL_NAME=kill_name or "*", KILL_AT=str(kill_at), KILL_MODE=mode)
        code = PREAMBLE + code
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=900)


def cli(*argv) -> str:
    return f"import sys\nfrom diffusers_var_accel.lab.cli import main\nsys.exit(main({list(map(str, argv))!r}))\n"


def assert_killed(result: subprocess.CompletedProcess):
    assert result.returncode == -9, (result.returncode, result.stderr[-2000:])


def visible_files(folder: Path):
    return sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".partial-") for part in p.relative_to(folder).parts)
    )


@pytest.mark.parametrize("mode", ["half", "before-rename"])
def test_generate_killed_while_writing_an_image_then_resumed(tmp_path, mode):
    out = tmp_path / "out"
    prompts = ["a red circle", "two blue squares", "a green triangle"]
    argv = ["generate", *prompts, "-o", out, "--no-progress"]
    killed = run_child(cli(*argv), kill_name="two-blue-squares-s1.png", mode=mode)
    assert_killed(killed)
    written = visible_files(out)
    assert "two-blue-squares-s1.png" not in written  # never a part of it under its name
    for name in written:
        if name.endswith(".png"):
            Image.open(out / name).load()  # every image there is whole
    assert any(p.name.startswith(".partial-") for p in out.iterdir())  # what the writer left, hidden
    again = run_child(cli(*argv))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "already there" in again.stderr
    manifest = json.loads((out / "generations.json").read_text())
    assert sorted(r["file"] for r in manifest["images"]) == sorted(
        ["a-red-circle-s0.png", "two-blue-squares-s1.png", "a-green-triangle-s2.png"]
    )
    for record in manifest["images"]:
        Image.open(out / record["file"]).load()
    assert not any(p.name.startswith(".partial-") for p in out.iterdir())  # the resumed run cleared them
    # the resumed image is the one a run that was never killed makes
    fresh = tmp_path / "fresh"
    assert run_child(cli("generate", "two blue squares", "--seed", "1", "-o", fresh, "--no-progress")).returncode == 0
    assert np.array_equal(
        np.asarray(Image.open(out / "two-blue-squares-s1.png")),
        np.asarray(Image.open(fresh / "two-blue-squares-s1.png")),
    )


def test_calibrate_killed_while_writing_its_record_then_run_again(tmp_path):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps([{"group_scales": [-2, -1], "keep_ratios": [0.2, 0.1]}]))
    out = tmp_path / "cal"
    argv = [
        *"calibrate --method lazyvar --target-flops-ratio 1.2 --num-prompts 1 --grid".split(),
        grid,
        *"--timing-repeats 1 -o".split(),
        out,
        "--no-progress",
    ]
    killed = run_child(cli(*argv), kill_name="calibration.json", mode="half")
    assert_killed(killed)
    assert "calibration.json" not in visible_files(out) and "acceleration_config.json" not in visible_files(out)
    Image.open(out / "frontier.png").load()  # written before it, whole
    again = run_child(cli(*argv))
    assert again.returncode == 0, again.stderr[-2000:]
    record = json.loads((out / "calibration.json").read_text())
    assert record["method"] == "lazyvar" and len(record["tried"]) == 1
    assert json.loads((out / "acceleration_config.json").read_text())["_class_name"] == "LazyVARScheduler"


SAVE = textwrap.dedent("""
    import torch
    from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline
    pipe = build_tiny_infinity_pipeline(seed={seed})
    pipe.save_pretrained(sys.argv[1] if len(sys.argv) > 1 else {folder!r})
""")


@pytest.mark.parametrize(
    "hook, kill_name, mode",
    [("save_file", None, "half"), ("replace", "model_index.json", "before-rename")],
    ids=["in-a-weights-file", "before-the-index"],
)
def test_save_pretrained_killed_over_an_earlier_save_leaves_a_loadable_folder(tmp_path, hook, kill_name, mode):
    """Killed while saving over an earlier save: every file there is whole (the earlier save's or the new one's), the
    folder loads, and the same save again gives the new pipeline."""
    from diffusers_var_accel import InfinityPipeline
    from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

    folder = tmp_path / "pipe"
    assert run_child("import sys\n" + SAVE.format(seed=0, folder=str(folder))).returncode == 0
    killed = run_child(
        "import sys\n" + SAVE.format(seed=1, folder=str(folder)), kill_name=kill_name, mode=mode, hook=hook
    )
    assert_killed(killed)
    InfinityPipeline.from_pretrained(folder)  # loads: no file is a part of itself
    again = run_child("import sys\n" + SAVE.format(seed=1, folder=str(folder)))
    assert again.returncode == 0, again.stderr[-2000:]
    loaded = InfinityPipeline.from_pretrained(folder)
    expected = build_tiny_infinity_pipeline(seed=1)
    for (name, a), (_, b) in zip(loaded.transformer.state_dict().items(), expected.transformer.state_dict().items()):
        assert torch.equal(a, b), name
    assert not any(p.name.startswith(".partial-") for p in folder.parent.iterdir())


def test_convert_killed_while_saving_then_run_again(tmp_path):
    if not (FIXTURE_DIR / "infinity_tiny.pth").is_file():
        pytest.skip(f"no Infinity fixture in {FIXTURE_DIR}")
    from diffusers_var_accel import InfinityPipeline

    out = tmp_path / "converted"
    argv = [
        *"convert infinity --transformer".split(),
        FIXTURE_DIR / "infinity_tiny.pth",
        "--vae",
        FIXTURE_DIR / "vae_tiny.pth",
        "--output",
        out,
    ]
    killed = run_child(cli(*argv), kill_at=2, mode="half", hook="save_file")
    assert_killed(killed)
    assert not (out / "model_index.json").is_file()  # not a pipeline yet, so the same command is not refused
    again = run_child(cli(*argv))
    assert again.returncode == 0, again.stderr[-2000:]
    pipe = InfinityPipeline.from_pretrained(out)
    official = torch.load(FIXTURE_DIR / "infinity_tiny.pth", map_location="cpu", weights_only=True)
    assert sum(p.numel() for p in pipe.transformer.parameters()) > 0 and len(official) > 0
