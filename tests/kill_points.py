"""Kill a command (SIGKILL, as ``kill -9`` or a crash would) right after each of its write events, one child process
per event, and look at what each left.

The children are forks of the calling process, so the libraries (torch, diffusers) and whatever the test built
before (a pipeline, a calibration's measurements) are loaded once, not once per kill. In a child every write event
is counted: a file opened for writing, a rename, a link, a removal, a folder made or removed, a safetensors file
written. Right after the ``k``-th, the child kills itself with SIGKILL; ``shutil.rmtree`` counts as one event, and
a kill at it removes one file first (a removal cut short).
"""

from __future__ import annotations

import builtins
import io
import os
import shutil
import signal
import sys
import traceback
import warnings
from typing import Callable, List

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _install(kill_at: int, log: List[str]) -> None:
    """In a child: count write events from now on; SIGKILL the process right after the ``kill_at``-th."""
    count = [0]
    quiet = [0]  # inside an operation counted as one event

    def event(what: str, path) -> None:
        if quiet[0]:
            return
        count[0] += 1
        log.append(f"{what} {os.fspath(path) if isinstance(path, (str, bytes, os.PathLike)) else path}")
        if count[0] == kill_at:
            os.write(2, f"killed after write event {count[0]}: {log[-1]}\n".encode())
            os.kill(os.getpid(), signal.SIGKILL)

    def after(name: str, real: Callable, describe: Callable = lambda *a, **k: True) -> Callable:
        def wrapped(*args, **kwargs):
            out = real(*args, **kwargs)
            if describe(*args, **kwargs):
                event(name, args[0] if args else "")
            return out

        return wrapped

    real_open = builtins.open
    writing = lambda file, mode="r", *a, **k: any(c in mode for c in "wax+")  # noqa: E731
    builtins.open = io.open = after("open", real_open, writing)
    real_os_open = os.open
    os.open = after("os.open", real_os_open, lambda path, flags, *a, **k: bool(flags & _WRITE_FLAGS))
    for name in ("replace", "rename", "link", "symlink", "unlink", "remove", "rmdir", "mkdir", "truncate"):
        setattr(os, name, after(name, getattr(os, name)))
    real_rmtree = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        if not quiet[0] and count[0] + 1 == kill_at:  # the removal cut short: one file gone
            for root, _, files in os.walk(path):
                if files:
                    os.unlink(os.path.join(root, files[0]))
                    break
        quiet[0] += 1
        try:
            real_rmtree(path, *args, **kwargs)
        finally:
            quiet[0] -= 1
        event("rmtree", path)

    shutil.rmtree = rmtree
    real_copytree = shutil.copytree

    def copytree(src, dst, *args, **kwargs):
        quiet[0] += 1
        try:
            out = real_copytree(src, dst, *args, **kwargs)
        finally:
            quiet[0] -= 1
        event("copytree", dst)
        return out

    shutil.copytree = copytree
    import safetensors.torch

    real_serialize = (
        safetensors.torch.serialize_file
    )  # what save_file calls (the weights file of diffusers, transformers)

    def serialize_file(tensors, filename, *args, **kwargs):
        out = real_serialize(tensors, filename, *args, **kwargs)
        event("safetensors", filename)
        return out

    safetensors.torch.serialize_file = serialize_file


def kill_at_each_write(action: Callable[[], None], check: Callable[[int], None], limit: int = 400) -> int:
    """For ``k = 1, 2, ...``: run ``action()`` in a forked child killed right after its ``k``-th write event, then
    ``check(k)`` here on what it left. Stops at the first ``k`` the child finishes without being killed (exit 0).

    Returns:
        `int`: the number of write events of ``action``.
    """
    for k in range(1, limit + 1):
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # "fork() in a multi-threaded process"
            pid = os.fork()
        if pid == 0:  # the child: never returns into the test
            code = 0
            try:
                log: List[str] = []
                _install(k, log)
                action()
            except SystemExit as exit_:  # a command's exit status
                code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
            except BaseException:  # noqa: BLE001 - reported through the exit status
                traceback.print_exc()
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            assert os.WTERMSIG(status) == signal.SIGKILL, f"event {k}: the child died of signal {os.WTERMSIG(status)}"
            check(k)
            continue
        assert os.WEXITSTATUS(status) == 0, f"event {k}: the child failed (exit status {os.WEXITSTATUS(status)})"
        return k - 1
    raise AssertionError(f"more than {limit} write events")
