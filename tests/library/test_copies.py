"""Code the two model families keep twice on purpose is marked ``# Copied from diffusers_var_accel.<module>.<name>``
(diffusers' convention, optionally ``with Old->New`` renames); every marked copy must still equal its source."""

from __future__ import annotations

import importlib
import inspect
import re
import textwrap
from pathlib import Path

import pytest

import diffusers_var_accel

PACKAGE = Path(diffusers_var_accel.__file__).parent
COPIED_FROM = re.compile(
    r"^(?P<indent>\s*)# Copied from (?P<target>diffusers_var_accel(?:\.\w+)+)(?: with (?P<renames>.+))?$"
)


def _resolve(target: str):
    """The object a dotted path names: the longest importable module prefix, then attributes."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(target)


def _block_after(lines: list, start: int, indent: str) -> str:
    """The class or function starting at ``lines[start]``: up to the next non-blank line indented no deeper."""
    end = start + 1
    # a signature split over lines closes at the def's own indentation (``) -> ...:``): still the block
    while end < len(lines) and (
        not lines[end].strip()
        or len(lines[end]) - len(lines[end].lstrip()) > len(indent)
        or lines[end].lstrip().startswith(")")
    ):
        end += 1
    return textwrap.dedent("\n".join(lines[start:end])).rstrip()


def stale_copies(source_text: str) -> list:
    """``(target, expected, found)`` for every marked copy in ``source_text`` that differs from its source."""
    lines, stale = source_text.splitlines(), []
    for i, line in enumerate(lines):
        match = COPIED_FROM.match(line)
        if match is None:
            continue
        expected = textwrap.dedent(inspect.getsource(_resolve(match["target"]))).rstrip()
        for rename in (match["renames"] or "").split(","):
            if rename.strip():
                old, new = (part.strip() for part in rename.split("->"))
                expected = expected.replace(old, new)
        found = _block_after(lines, i + 1, match["indent"])
        if found != expected:
            stale.append((match["target"], expected, found))
    return stale


def _marked_files():
    return sorted(p for p in PACKAGE.rglob("*.py") if "# Copied from diffusers_var_accel." in p.read_text())


def test_the_family_copies_are_marked():
    marked = {p.relative_to(PACKAGE).as_posix() for p in _marked_files()}
    assert {"models/autoencoder_hart.py", "models/transformer_hart.py"} <= marked


@pytest.mark.parametrize("path", _marked_files(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_marked_copies_equal_their_source(path):
    stale = stale_copies(path.read_text())
    assert not stale, "\n\n".join(
        f"{target}: expected\n{expected}\nfound\n{found}" for target, expected, found in stale
    )


def test_a_changed_copy_is_reported():
    source = Path(inspect.getsourcefile(_resolve("diffusers_var_accel.models.autoencoder_hart"))).read_text()
    assert stale_copies(source) == []
    edited = source.replace(
        'F.pad(x_BChw, (0, 1, 0, 1), mode="constant", value=0.0)', "F.pad(x_BChw, (1, 0, 1, 0))", 1
    )
    assert edited != source
    assert [target for target, _, _ in stale_copies(edited)] == [
        "diffusers_var_accel.models.autoencoder_bsq.BSQDownsample"
    ]
