"""Writing files so that a killed process (``kill -9``, a power cut) never leaves a half-written one where a finished
one is expected: every file is written under a temporary name beside its place and renamed into it
(``os.replace``, atomic on POSIX and Windows within one file system); a folder (a saved pipeline, a calibration) is
written whole into a temporary sibling folder and swapped in by two renames (:func:`replace_folder`), so a reader
finds the earlier folder or the new one, never a mix of both and never neither. Below everything else in the
package: it imports nothing of it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Union

PathLike = Union[str, os.PathLike]

#: The prefix of a temporary entry (hidden; a later write removes a stale one left by a killed process).
TEMP_PREFIX = ".partial-"

#: The prefix of an earlier folder moved aside while :func:`replace_folder` swaps a new one in (hidden; a stale one is
#: moved back when the new folder never arrived, else removed: :func:`resolve_interrupted_replace`).
REPLACED_PREFIX = ".replaced-"


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


def _stale_writer(entry_name: str, prefix: str) -> Optional[str]:
    """For ``<prefix><pid>-<name>`` written by a process that is gone (or by this one, which is not writing it now):
    ``<name>``; else ``None``."""
    if not entry_name.startswith(prefix):
        return None
    pid, _, name = entry_name[len(prefix) :].partition("-")
    if pid.isdigit() and name and (int(pid) == os.getpid() or not _alive(int(pid))):
        return name
    return None


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink()


def _fsync_dir(folder: Path) -> None:
    """Make the renames in ``folder`` durable (POSIX; a no-op where a directory cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temporaries(folder: PathLike, only: Optional[str] = None, recursive: bool = False) -> None:
    """Clear what killed writers left in ``folder``: temporaries ``.partial-<pid>-...`` whose process is gone are
    removed (a live writer's are left alone), and an interrupted folder swap is settled
    (:func:`resolve_interrupted_replace`). ``only``: just the leftovers of the entry of that name; ``recursive``: in
    every folder below ``folder`` too."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    if recursive:
        for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()):
            if not sub.name.startswith((TEMP_PREFIX, REPLACED_PREFIX)):
                remove_stale_temporaries(sub, only, recursive=True)
    for entry in sorted(folder.iterdir()):
        replaced = _stale_writer(entry.name, REPLACED_PREFIX)
        if replaced is not None and only in (None, replaced):
            target = folder / replaced
            if target.exists() or target.is_symlink():
                _remove(entry)  # the new folder arrived: the earlier one goes
            else:
                os.replace(entry, target)  # killed between the two renames: the earlier folder comes back
            continue
        written = _stale_writer(entry.name, TEMP_PREFIX)
        if written is not None and only in (None, written) and (entry.exists() or entry.is_symlink()):
            _remove(entry)


def resolve_interrupted_replace(folder: PathLike) -> None:
    """Settle what a process killed while :func:`replace_folder` wrote ``folder`` left beside it: the earlier folder
    moved back when the new one never arrived (killed between the two renames), or removed when it did; an unfinished
    new folder removed. Afterwards ``folder`` is the earlier one or the new one, whole. Cheap when nothing is left."""
    folder = Path(os.path.abspath(folder))
    parent = folder.parent
    try:
        names = os.listdir(parent)
    except OSError:  # no such parent (e.g. a Hub repo id), or not readable: nothing of ours there
        return
    if any(n.startswith((TEMP_PREFIX, REPLACED_PREFIX)) and n.endswith("-" + folder.name) for n in names):
        remove_stale_temporaries(parent, only=folder.name)


def _link_or_copy(src: str, dst: str) -> str:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def replace_folder(
    folder: PathLike, write: Callable[[Path], None], owned: Callable[[Path], Iterable[str]] = lambda folder: ()
) -> Path:
    """Replace ``folder`` by what ``write(tmp)`` writes into ``tmp``, all or nothing.

    ``tmp`` is a temporary sibling of ``folder`` (``.partial-<pid>-<name>``, same file system; ``write`` creates it
    or finds it created). Entries of the earlier ``folder`` that ``write`` did not write and ``owned(folder)`` does not
    name (files a user put there, e.g. a README) are carried over as hard links (copies where links fail), as
    diffusers' ``save_pretrained`` leaves them; the entries ``owned`` names belong to the earlier version and go with
    it. Then the earlier folder is renamed aside (``.replaced-<pid>-<name>``), the new one renamed into place, and the
    earlier one removed. A process killed at any point leaves the earlier folder or the new one, whole: what it left
    beside is settled by :func:`resolve_interrupted_replace` (called here first, and when a pipeline loads). An error
    or Ctrl-C leaves the earlier folder and removes the temporary.

    Returns:
        `Path`: ``folder``.
    """
    folder = Path(os.path.abspath(folder))  # "." or "out/" has a name and a parent too
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{folder} is a file, not a folder; give a folder path")
    parent = folder.parent
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(parent, only=folder.name)
    if folder.is_symlink():  # swap the folder the link points to; the link stays
        folder = Path(os.path.realpath(folder))
        parent = folder.parent
        remove_stale_temporaries(parent, only=folder.name)
    tmp = _temp_name(folder)
    aside = parent / f"{REPLACED_PREFIX}{os.getpid()}-{folder.name}"
    try:
        write(tmp)
        tmp.mkdir(exist_ok=True)  # a write that wrote nothing still replaces the folder
        if folder.is_dir():
            skip = set(owned(folder))
            for entry in sorted(folder.iterdir()):
                if (
                    entry.name in skip
                    or entry.name.startswith((TEMP_PREFIX, REPLACED_PREFIX))
                    or (tmp / entry.name).exists()
                    or (tmp / entry.name).is_symlink()
                ):
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.copytree(entry, tmp / entry.name, symlinks=True, copy_function=_link_or_copy)
                elif entry.is_symlink():
                    os.symlink(os.readlink(entry), tmp / entry.name)
                else:
                    _link_or_copy(os.fspath(entry), os.fspath(tmp / entry.name))
            cwd = os.getcwd()
            os.replace(folder, aside)
            try:
                os.replace(tmp, folder)
            except BaseException:
                os.replace(aside, folder)  # the new folder did not arrive: the earlier one comes back
                raise
            _fsync_dir(parent)
            if cwd == os.fspath(folder) or cwd.startswith(os.fspath(folder) + os.sep):
                os.chdir(cwd if os.path.isdir(cwd) else folder)  # the process was in the earlier folder: the new one
            shutil.rmtree(aside)
        else:
            os.replace(tmp, folder)
            _fsync_dir(parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return folder
