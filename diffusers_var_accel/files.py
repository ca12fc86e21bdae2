"""Writing files so that a killed process (``kill -9``, a power cut) never leaves a half-written one where a finished
one is expected: every file is written under a temporary name beside its place and renamed into it
(``os.replace``, atomic on POSIX and Windows within one file system); a folder (a saved pipeline) is written into a
temporary sibling folder and moved into place entry by entry. Below everything else in the package: it imports
nothing of it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator, Union

PathLike = Union[str, os.PathLike]

#: The prefix of a temporary entry (hidden; a later write removes a stale one left by a killed process).
TEMP_PREFIX = ".partial-"


def _temp_name(path: Path) -> Path:
    return path.with_name(f"{TEMP_PREFIX}{os.getpid()}-{path.name}")


def write_atomic(path: PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path``: a temporary file beside it, flushed to disk, then renamed into place."""
    path = Path(path)
    tmp = _temp_name(path)
    try:
        with open(tmp, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def write_text_atomic(path: PathLike, text: str) -> Path:
    """:func:`write_atomic` of ``text`` in UTF-8."""
    return write_atomic(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_file(path: PathLike) -> Iterator[Path]:
    """``with atomic_file(path) as tmp: image.save(tmp)``: whatever writes ``tmp`` (same suffix as ``path``, so
    writers that read the format from the name work), it is renamed to ``path`` only when the block succeeds."""
    path = Path(path)
    tmp = _temp_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temporaries(folder: PathLike) -> None:
    """Remove what killed writers left in ``folder``: entries named ``.partial-<pid>-...`` whose process is gone (a
    live writer's are left alone)."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if not entry.name.startswith(TEMP_PREFIX):
            continue
        pid = entry.name[len(TEMP_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


def save_folder_atomically(folder: PathLike, save: Callable[[Path], None], last: str = "model_index.json") -> Path:
    """``save(tmp_folder)`` into a temporary sibling of ``folder``, then every entry moved into ``folder`` by a rename
    (an existing entry of the same name is replaced; other entries of ``folder`` stay), ``last`` (the index that says
    what the folder holds) after all the others. A process killed at any point leaves every file of ``folder``
    complete: the earlier version of an entry or the new one, never a part of one; the same save again completes."""
    folder = Path(folder)
    parent = folder.parent if str(folder.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(parent)
    folder.mkdir(exist_ok=True)
    remove_stale_temporaries(folder)
    tmp = _temp_name(folder)
    try:
        save(tmp)
        entries = sorted(tmp.iterdir(), key=lambda entry: entry.name == last)
        for entry in entries:
            target = folder / entry.name
            if target.is_dir() and not target.is_symlink():
                old = _temp_name(target)  # out of the way first: a directory cannot be replaced by a rename
                os.replace(target, old)
                os.replace(entry, target)
                shutil.rmtree(old)
            else:
                os.replace(entry, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return folder
