"""``diffusers_var_accel.files``: a folder replaced as a whole (:func:`replace_folder`) is the earlier one or the new
one, whatever stops the writer; what a killed writer left beside it is settled by the next reader or writer."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from diffusers_var_accel.files import REPLACED_PREFIX, TEMP_PREFIX, replace_folder, resolve_interrupted_replace


def contents(folder):
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def write(files):
    def writer(tmp):
        tmp.mkdir()
        for name, text in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text)

    return writer


def dead_pid() -> int:
    """The id of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_replace_keeps_the_files_it_does_not_own_and_drops_the_ones_it_does(tmp_path):
    folder = tmp_path / "out"
    replace_folder(folder, write({"a.json": "1", "part/x": "1", "old-only.json": "1"}))
    (folder / "README.md").write_text("mine")
    replace_folder(folder, write({"a.json": "2", "part/y": "2"}), owned=lambda f: ["old-only.json", "part"])
    assert contents(folder) == {"a.json": "2", "part/y": "2", "README.md": "mine"}
    assert sorted(os.listdir(tmp_path)) == ["out"]


@pytest.mark.parametrize("error", [KeyboardInterrupt, OSError])
def test_an_interrupted_write_leaves_the_earlier_folder_and_no_temporary(tmp_path, error):
    folder = tmp_path / "out"
    replace_folder(folder, write({"a.json": "1"}))

    def failing(tmp):
        write({"a.json": "2"})(tmp)
        raise error("stopped")  # Ctrl-C or a full disk while writing

    with pytest.raises(error):
        replace_folder(folder, failing)
    assert contents(folder) == {"a.json": "1"} and sorted(os.listdir(tmp_path)) == ["out"]


@pytest.mark.parametrize("new_arrived", [False, True])
def test_a_swap_killed_between_its_renames_is_settled_by_the_next_reader(tmp_path, new_arrived):
    """Killed after the earlier folder was moved aside: before the new one arrived, the earlier comes back; after,
    the earlier is removed. An unfinished temporary of a dead writer goes; a live writer's stays."""
    pid = dead_pid()
    aside = tmp_path / f"{REPLACED_PREFIX}{pid}-out"
    write({"a.json": "earlier"})(aside)
    write({"a.json": "new", "half": ""})(tmp_path / f"{TEMP_PREFIX}{pid}-out")
    write({"a.json": "live"})(tmp_path / f"{TEMP_PREFIX}{os.getppid()}-out")  # a running writer's
    if new_arrived:
        write({"a.json": "new"})(tmp_path / "out")
    resolve_interrupted_replace(tmp_path / "out")
    assert contents(tmp_path / "out") == {"a.json": "new" if new_arrived else "earlier"}
    assert sorted(os.listdir(tmp_path)) == sorted(["out", f"{TEMP_PREFIX}{os.getppid()}-out"])


def test_a_file_is_not_replaced_by_a_folder(tmp_path):
    (tmp_path / "out").write_text("a file")
    with pytest.raises(NotADirectoryError, match="is a file"):
        replace_folder(tmp_path / "out", write({"a": "1"}))
    assert (tmp_path / "out").read_text() == "a file"


def test_stale_temporaries_are_removed_below_a_folder(tmp_path):
    """What a killed run left in its output tree (bench writes images two folders down) goes; finished files and a
    live writer's temporaries stay."""
    from diffusers_var_accel.files import remove_stale_temporaries

    pid = dead_pid()
    deep = tmp_path / "lazyvar" / "images"
    deep.mkdir(parents=True)
    (deep / "00000-s0.png").write_text("whole")
    (deep / f"{TEMP_PREFIX}{pid}-00001-s0.png").write_text("half")
    (tmp_path / f"{TEMP_PREFIX}{pid}-results.json").write_text("half")
    (tmp_path / f"{TEMP_PREFIX}{os.getppid()}-results.json").write_text("being written")
    remove_stale_temporaries(tmp_path, recursive=True)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == [
        f"{TEMP_PREFIX}{os.getppid()}-results.json",
        "lazyvar/images/00000-s0.png",
    ]
