"""Prompt sets of the benchmark: the built-in shapes prompts, GenEval's metadata (packaged) or a prompt file.

``source`` is one of

* ``"shapes"``: the held-out prompts of the captioned-shapes world
  (:func:`~diffusers_var_accel.lab.data.shapes.heldout_prompts`, categories in round robin, so any prefix is balanced);
* ``"geneval"``: the packaged copy of GenEval's ``evaluation_metadata.jsonl`` (553 prompts, MIT licence, in
  ``diffusers_var_accel/lab/data/geneval/``);
* a path: ``.jsonl`` (one JSON object per line with a ``"prompt"`` key, e.g. GenEval's metadata; a line may also be
  a JSON string), ``.json`` (a list of prompts or of objects with ``"prompt"``, or an object of such objects such as
  MJHQ-30K's ``meta_data.json``), or any other text file (one prompt per non-empty line).

A JSONL file whose every line has GenEval's keys (``tag``, ``include``, ``prompt``) is *GenEval-style*: the benchmark
then also writes every method's images in GenEval's folder layout (see :mod:`diffusers_var_accel.lab.bench.runner`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

#: The packaged GenEval prompt metadata (553 prompts; MIT licence beside it).
GENEVAL_METADATA_PATH = Path(__file__).resolve().parents[1] / "data" / "geneval" / "evaluation_metadata.jsonl"

#: Shapes prompts used when ``num_prompts`` is not given (baseline + 4 presets fit in minutes on a 2-core CPU).
DEFAULT_SHAPES_PROMPTS = 24

#: Keys every line of a GenEval metadata file has.
GENEVAL_KEYS = ("tag", "include", "prompt")

BUILT_IN_SOURCES = ("shapes", "geneval")


@dataclass
class BenchPrompt:
    """One prompt of a set.

    Args:
        index: its position in the source (GenEval's folder index; the shapes held-out index).
        prompt: the text.
        category: the source's category (shapes category, GenEval ``tag``, MJHQ ``category``), if any.
        metadata_line: the source's JSON line, unchanged (GenEval layout: written to ``metadata.jsonl``).
    """

    index: int
    prompt: str
    category: Optional[str] = None
    metadata_line: Optional[str] = None


@dataclass
class PromptSet:
    """The selected prompts, where they come from and whether the GenEval layout applies."""

    source: str
    prompts: List[BenchPrompt]
    total: int
    geneval: bool = False

    def __len__(self) -> int:
        return len(self.prompts)


def _prompt_of(entry: Any, where: str) -> str:
    if isinstance(entry, str):
        text = entry
    elif isinstance(entry, dict) and isinstance(entry.get("prompt"), str):
        text = entry["prompt"]
    else:
        raise ValueError(
            f'{where}: expected a prompt string or an object with a "prompt" string, got {str(entry)[:80]!r}'
        )
    if not text.strip():
        raise ValueError(f"{where}: empty prompt")
    return text


def _category_of(entry: Any) -> Optional[str]:
    if isinstance(entry, dict):
        value = entry.get("tag", entry.get("category"))
        return value if isinstance(value, str) else None
    return None


def _read_file(path: Path) -> PromptSet:
    text = path.read_text(encoding="utf-8")
    prompts: List[BenchPrompt] = []
    geneval = False
    if path.suffix.lower() == ".jsonl":
        lines = [line for line in text.splitlines() if line.strip()]
        entries = []
        for number, line in enumerate(lines, 1):
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, line {number}: not JSON ({err.msg})") from None
        for i, (entry, line) in enumerate(zip(entries, lines)):
            prompts.append(
                BenchPrompt(i, _prompt_of(entry, f"{path}, line {i + 1}"), _category_of(entry), line.strip())
            )
        geneval = bool(entries) and all(isinstance(e, dict) and all(k in e for k in GENEVAL_KEYS) for e in entries)
    elif path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not JSON ({err.msg})") from None
        items = list(data.values()) if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise ValueError(f'{path}: expected a JSON list of prompts or an object of {{"prompt": ...}} entries')
        for i, entry in enumerate(items):
            prompts.append(BenchPrompt(i, _prompt_of(entry, f"{path}, entry {i}"), _category_of(entry)))
    else:
        for line in text.splitlines():
            if line.strip():
                prompts.append(BenchPrompt(len(prompts), line.strip()))
    if not prompts:
        raise ValueError(f"{path}: no prompts in the file")
    return PromptSet(str(path), prompts, len(prompts), geneval)


def select_evenly(count: int, total: int) -> List[int]:
    """``count`` indices spread evenly over ``range(total)``, starting at 0 (all of them when ``count == total``)."""
    return [(i * total) // count for i in range(count)]


def load_prompt_set(source: str = "shapes", num_prompts: Optional[int] = None) -> PromptSet:
    """The prompts of ``source`` (see the module docstring), ``num_prompts`` of them.

    Args:
        source: ``"shapes"``, ``"geneval"`` or a file path.
        num_prompts: how many. Shapes: the first ``num_prompts`` held-out prompts (default
            :data:`DEFAULT_SHAPES_PROMPTS`). Files: ``num_prompts`` prompts spread evenly over the file (its sorted
            categories all get a share), all of them by default.

    Raises:
        FileNotFoundError: ``source`` is neither a built-in name nor an existing file.
        ValueError: a malformed file, or ``num_prompts`` below 1 or above the number of prompts in the file.
    """
    if num_prompts is not None and num_prompts < 1:
        raise ValueError(f"the number of prompts must be at least 1, got {num_prompts}")
    if source == "shapes":
        from diffusers_var_accel.lab.data.shapes import heldout_prompts

        n = num_prompts or DEFAULT_SHAPES_PROMPTS
        entries = heldout_prompts(n)
        return PromptSet("shapes", [BenchPrompt(i, e["prompt"], e["category"]) for i, e in enumerate(entries)], n)
    path = GENEVAL_METADATA_PATH if source == "geneval" else Path(source)
    if not path.is_file():
        if source == "geneval":
            raise FileNotFoundError(f"the packaged GenEval metadata is missing from this installation ({path})")
        raise FileNotFoundError(
            f"prompt source {source!r}: no such file; use one of {list(BUILT_IN_SOURCES)} or a "
            ".txt / .jsonl / .json prompt file"
        )
    full = _read_file(path)
    if source == "geneval":
        full.source = "geneval"
    if num_prompts is None or num_prompts == full.total:
        return full
    if num_prompts > full.total:
        raise ValueError(f"asked for {num_prompts} prompts but {full.source} has {full.total}")
    full.prompts = [full.prompts[i] for i in select_evenly(num_prompts, full.total)]
    return full
