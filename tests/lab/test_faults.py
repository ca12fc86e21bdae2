"""A process killed (SIGKILL, as ``kill -9``) right after any one of its write events leaves nothing lost and
nothing mixed, and the same command again finishes with the result of a run that was never killed:
``save_pretrained`` (Infinity, HART), ``var-accel convert``, ``var-accel calibrate`` and ``var-accel generate``.

Each command runs once per write event in a child process that kills itself right after that event
(:mod:`kill_points`: the children are forks, so torch and the models load once). After each kill the folder is read
back, the command runs again, and what it leaves is compared byte for byte with an uninterrupted run's; no
temporary file may be left over."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kill_points import kill_at_each_write  # noqa: E402

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not hasattr(os, "fork"), reason="the kill points fork the test process"),
]

FIXTURE_DIR = Path(
    os.environ.get("VAR_ACCEL_INFINITY_FIXTURE", Path(__file__).resolve().parents[1] / "fixtures" / "infinity")
)


def tree(folder: Path) -> dict:
    """``{relative path: sha256}`` of every file under ``folder`` (hidden ones included); ``{}`` when it is not there."""
    if not folder.is_dir():
        return {}
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def leftovers(parent: Path) -> list:
    """Temporaries or folders moved aside anywhere under ``parent``."""
    return sorted(
        p.relative_to(parent).as_posix() for p in parent.rglob("*") if p.name.startswith((".partial-", ".replaced-"))
    )


def cli(*argv) -> int:
    from diffusers_var_accel.lab.cli import main

    return main([str(a) for a in argv])


# ---------------------------------------------------------------------------------------------------------------------
# save_pretrained
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["infinity", "hart"])
def test_save_pretrained_killed_at_each_write_over_an_earlier_save(tmp_path, family):
    """Killed at any write of a save over another pipeline's folder: the folder loads as the earlier pipeline or the
    new one, every file of one of them (never a mix, never neither); files a user put there stay; the same save again
    gives the new pipeline and leaves no temporary."""
    from diffusers_var_accel import HARTPipeline, InfinityPipeline
    from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline
    from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

    build, cls = {
        "infinity": (build_tiny_infinity_pipeline, InfinityPipeline),
        "hart": (build_tiny_hart_pipeline, HARTPipeline),
    }[family]
    earlier, new = build(seed=0), build(seed=1)
    new.enable_lazyvar()  # the scheduler component is saved with the pipeline
    reference = tmp_path / "reference"
    earlier.save_pretrained(reference / "earlier")
    (reference / "earlier" / "README.md").write_text("notes beside the pipeline\n")
    new.save_pretrained(reference / "new")
    expected_earlier, expected_new = tree(reference / "earlier"), {**tree(reference / "new"), "README.md": ""}
    expected_new["README.md"] = expected_earlier["README.md"]
    assert (
        expected_earlier["transformer/diffusion_pytorch_model.safetensors"]
        != expected_new["transformer/diffusion_pytorch_model.safetensors"]
        and "acceleration/acceleration_config.json" in expected_new
    )
    work = tmp_path / "work"
    folder = work / "pipe"
    outcomes = []

    def check(k: int) -> None:
        loaded = cls.from_pretrained(folder)  # settles what the killed save left, then loads
        state = tree(folder)
        outcome = "earlier" if state == expected_earlier else "new" if state == expected_new else None
        assert outcome is not None, f"event {k}: the folder is a mix: {sorted(state)}"
        assert (loaded.acceleration is not None) == (outcome == "new"), k
        assert leftovers(work) == [], (k, leftovers(work))
        outcomes.append(outcome)
        new.save_pretrained(folder)  # the same save again
        assert tree(folder) == expected_new and leftovers(work) == [], k
        shutil.rmtree(folder)
        shutil.copytree(reference / "earlier", folder)

    shutil.copytree(reference / "earlier", folder)
    events = kill_at_each_write(lambda: new.save_pretrained(folder), check)
    assert events >= 15 and len(outcomes) == events
    # the earlier pipeline until the new one is swapped in at once; never neither in between
    assert outcomes == ["earlier"] * outcomes.index("new") + ["new"] * (events - outcomes.index("new"))
    assert tree(folder) == expected_new and leftovers(work) == []


def test_save_pretrained_killed_at_each_write_into_a_new_folder(tmp_path):
    """Killed at any write of a save into a new folder: nothing there loads as a pipeline until the save is whole."""
    from diffusers_var_accel import InfinityPipeline
    from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

    pipe = build_tiny_infinity_pipeline(seed=0)
    pipe.save_pretrained(tmp_path / "reference")
    expected = tree(tmp_path / "reference")
    work = tmp_path / "work"
    folder = work / "pipe"
    whole = []

    def check(k: int) -> None:
        if folder.exists():
            InfinityPipeline.from_pretrained(folder)
            assert tree(folder) == expected, k
            whole.append(k)
        else:
            with pytest.raises(FileNotFoundError):
                InfinityPipeline.from_pretrained(folder)
        pipe.save_pretrained(folder)
        assert tree(folder) == expected and leftovers(work) == [], k
        shutil.rmtree(folder)

    events = kill_at_each_write(lambda: pipe.save_pretrained(folder), check)
    assert whole == [events]  # only after the last write (the rename into place)


# ---------------------------------------------------------------------------------------------------------------------
# var-accel convert
# ---------------------------------------------------------------------------------------------------------------------
def test_convert_killed_at_each_write_then_the_same_command_again(tmp_path, capsys):
    """Killed at any write: the output folder is absent or the whole conversion; the same command again (no
    --overwrite) finishes it, byte for byte the uninterrupted conversion; --overwrite stays needed for another
    pipeline's folder and for other settings."""
    if not (FIXTURE_DIR / "infinity_tiny.pth").is_file():
        pytest.skip(f"no Infinity fixture in {FIXTURE_DIR}")
    from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

    def argv(output, *more):
        return [
            *"convert infinity --transformer".split(),
            FIXTURE_DIR / "infinity_tiny.pth",
            "--vae",
            FIXTURE_DIR / "vae_tiny.pth",
            "--hub-shim",
            "--output",
            output,
            *more,
        ]

    assert cli(*argv(tmp_path / "reference")) == 0
    expected = tree(tmp_path / "reference")
    assert "pipeline.py" in expected and ".var-accel-conversion.json" in expected
    work = tmp_path / "work"
    out = work / "converted"
    capsys.readouterr()

    def check(k: int) -> None:
        state = tree(out)
        assert state in ({}, expected), (k, sorted(state))
        assert cli(*argv(out)) == 0, (k, capsys.readouterr().err)  # the same command, no --overwrite
        assert tree(out) == expected and leftovers(work) == [], k
        shutil.rmtree(out)

    events = kill_at_each_write(lambda: sys.exit(cli(*argv(out))), check)
    assert events >= 10
    # finished: the same command again has nothing to do; other settings or another pipeline need --overwrite
    assert cli(*argv(out)) == 0 and "nothing to do" in capsys.readouterr().out
    assert cli(*argv(out, "--dtype", "bfloat16")) == 2 and "--overwrite" in capsys.readouterr().err
    foreign = work / "foreign"
    build_tiny_infinity_pipeline().save_pretrained(foreign)
    assert cli(*argv(foreign)) == 2 and "--overwrite" in capsys.readouterr().err
    assert cli(*argv(foreign, "--overwrite")) == 0 and tree(foreign) == expected


# ---------------------------------------------------------------------------------------------------------------------
# var-accel calibrate
# ---------------------------------------------------------------------------------------------------------------------
def test_calibrate_killed_at_each_write_over_an_earlier_calibration(tmp_path, monkeypatch):
    """Killed at any write over an earlier, different calibration: the folder holds the earlier calibration or the
    new one, its files agreeing (never a new calibration.json beside an old acceleration_config.json); the same
    command again writes the uninterrupted run's files, and no temporary is left. The measurements (the slow part,
    no write) are made once; each child runs the whole command on them."""
    import diffusers_var_accel.lab.calibration as calibration
    from diffusers_var_accel import VARAccelScheduler

    measured = {}
    real_calibrate = calibration.calibrate

    def calibrate_once(pipe, method, **kwargs):
        key = json.dumps(kwargs.get("grid"))
        if key not in measured:
            # at the tiny model's smallest size (a full-size call of its VAE takes a minute here)
            measured[key] = real_calibrate(pipe, method, **kwargs, sampling={"height": 256, "width": 256})
        return measured[key]

    monkeypatch.setattr(calibration, "calibrate", calibrate_once)

    def argv(output, keep):
        grid = tmp_path / f"grid-{keep}.json"
        grid.write_text(json.dumps([{"group_scales": [-1], "keep_ratios": [keep]}]))
        return [
            *"calibrate --model tiny --method lazyvar --target-flops-ratio 1.01 --num-prompts 1 --seeds 0".split(),
            *"--timing-repeats 1 --no-progress --grid".split(),
            grid,
            "-o",
            output,
        ]

    assert cli(*argv(tmp_path / "earlier", 0.5)) == 0
    assert cli(*argv(tmp_path / "new", 0.25)) == 0
    expected_earlier, expected_new = tree(tmp_path / "earlier"), tree(tmp_path / "new")
    assert expected_earlier["calibration.json"] != expected_new["calibration.json"]
    work = tmp_path / "work"
    out = work / "cal"

    def check(k: int) -> None:
        scheduler = VARAccelScheduler.from_pretrained(out)  # settles what the killed run left, then loads
        state = tree(out)
        assert state in (expected_earlier, expected_new), (k, sorted(state))
        assert list(scheduler.keep_ratios) == [0.5 if state == expected_earlier else 0.25], k
        record = json.loads((out / "calibration.json").read_text())
        config = json.loads((out / "acceleration_config.json").read_text())
        assert record["chosen"]["settings"]["keep_ratios"] == config["keep_ratios"], k  # the files agree
        assert cli(*argv(out, 0.25)) == 0, k
        assert tree(out) == expected_new and leftovers(work) == [], (k, leftovers(work))
        shutil.rmtree(out)
        shutil.copytree(tmp_path / "earlier", out)

    shutil.copytree(tmp_path / "earlier", out)
    events = kill_at_each_write(lambda: sys.exit(cli(*argv(out, 0.25))), check)
    assert events >= 5


# ---------------------------------------------------------------------------------------------------------------------
# var-accel generate
# ---------------------------------------------------------------------------------------------------------------------
PROMPTS = ["a red circle", "two blue squares"]


def manifest_without_timings(folder: Path) -> dict:
    manifest = json.loads((folder / "generations.json").read_text())
    for record in manifest["images"]:
        record.pop("seconds")
    return manifest


def generate_argv(output):
    return ["generate", *PROMPTS, "--model", "tiny", "-o", output, "--no-progress"]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """An uninterrupted run's folder."""
    folder = tmp_path_factory.mktemp("generated") / "reference"
    assert cli(*generate_argv(folder)) == 0
    return folder


def test_generate_killed_at_each_write_then_resumed(generated, tmp_path, capsys):
    """Killed at any write: every image there is whole; the same command again finishes, and its images and
    manifest are the uninterrupted run's (timings aside); no temporary or journal is left."""
    expected_manifest = manifest_without_timings(generated)
    expected_images = {k: v for k, v in tree(generated).items() if k.endswith(".png")}
    assert len(expected_images) == len(PROMPTS)
    out = tmp_path / "work" / "out"

    def check(k: int) -> None:
        for name, digest in tree(out).items():
            if name.endswith(".png") and not name.startswith(".partial-"):
                assert digest == expected_images[name], (k, name)  # whole, and the image an uninterrupted run makes
        capsys.readouterr()
        assert cli(*generate_argv(out)) == 0, (k, capsys.readouterr().err)
        assert manifest_without_timings(out) == expected_manifest, k
        state = tree(out)
        assert {n: d for n, d in state.items() if n.endswith(".png")} == expected_images, k
        assert sorted(state) == sorted(tree(generated)), (k, sorted(state))  # no temporary, no journal
        shutil.rmtree(out)

    events = kill_at_each_write(lambda: sys.exit(cli(*generate_argv(out))), check)
    assert events >= 3 * len(PROMPTS)  # per image at least its temporary, its rename, its journal record


def test_generate_journal_with_a_torn_last_line(generated, tmp_path, capsys):
    """A journal whose last record was cut short (a power cut mid-write): the rerun warns naming the journal and the
    line, makes that image again, and its manifest is the uninterrupted run's."""
    expected = manifest_without_timings(generated)
    out = tmp_path / "out"
    journal = out / ".generations-process0.jsonl"

    def tear(k: int) -> None:
        lines = journal.read_bytes().splitlines(keepends=True) if journal.is_file() else []
        if len(lines) == len(PROMPTS):  # the last image's record is written: cut it short
            journal.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
            raise _Torn
        shutil.rmtree(out, ignore_errors=True)

    with pytest.raises(_Torn):
        kill_at_each_write(lambda: sys.exit(cli(*generate_argv(out))), tear)
    capsys.readouterr()
    assert cli(*generate_argv(out)) == 0
    err = capsys.readouterr().err
    assert f"{journal}, line {len(PROMPTS)}: ignored" in err, err
    assert manifest_without_timings(out) == expected
    assert not journal.exists()


class _Torn(Exception):
    pass
