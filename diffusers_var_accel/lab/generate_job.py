"""The ``var-accel generate`` job: one PNG per (prompt, seed) into a folder, resumable, split across processes.

The command line (:mod:`diffusers_var_accel.lab.cli`) parses and checks the arguments and calls :func:`run_generate_job`.
The job

1. returns at once when the folder's manifest records this very invocation and holds all its images;
2. loads the pipeline and the acceleration, and settles the settings (size, sampling, acceleration config);
3. compares them with the folder's: the same run again resumes (finished images are skipped), other settings are
   refused unless ``overwrite`` (then the earlier images are deleted);
4. generates this process's share of the (prompt, seed) items (torchrun / accelerate launch), each image written
   atomically and recorded in the process's journal;
5. merges the journals into one manifest (``generations.json``) on the main process.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from diffusers_var_accel.lab.families import check_sampling_options, family_of_tiny_model, sampling_option_names
from diffusers_var_accel.files import atomic_file, remove_stale_temporaries, write_atomic
from diffusers_var_accel.lab.user_errors import UserInputError, user_errors

#: The manifest the job writes into its output folder.
MANIFEST_NAME = "generations.json"

#: The sampling arguments the job records (and takes): every registered family's, each once.
SAMPLING_KEYS: Tuple[str, ...] = tuple(sampling_option_names())


@dataclass
class GenerateJob:
    """What one ``var-accel generate`` makes (the command line's arguments, checked).

    Args:
        prompts: the prompts; prompt ``i`` uses seed ``seed + i``.
        output: the output folder (created; it may hold an earlier run's images).
        model: ``None`` (the embedded model), a family's tiny model name or a pipeline folder.
        height / width: the image size (``None``: the model's own; the width defaults to the height).
        seed: the seed of the first prompt.
        sampling: ``{option: value}`` of the sampling options given (``guidance_scale``, ``tau``, ...; ``None``:
            not given); an option the model's family does not take is refused.
        accel: the acceleration spec (``None``: the baseline).
        device / dtype: where and in which dtype the pipeline runs.
        batch_size: prompts per pipeline call (each image keeps its own seed).
        overwrite: delete an earlier run's images made with other settings instead of refusing.
        summary: after each call, print what acceleration did (``pipe.acceleration_summary()``) and the call's
            counted FLOPs against the baseline's (two more calls, under the FLOP counter).
        progress: a progress bar per image (single process only).
        debug: re-raise the original error of a bad input instead of a :class:`UserInputError`.
    """

    prompts: List[str]
    output: Path
    model: Optional[str] = None
    height: Optional[int] = None
    width: Optional[int] = None
    seed: int = 0
    sampling: Dict[str, Any] = field(default_factory=dict)
    accel: Optional[str] = None
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int = 1
    overwrite: bool = False
    summary: bool = False
    progress: bool = True
    debug: bool = False


def image_file_name(prompt: str, seed: int) -> str:
    """The PNG file of ``(prompt, seed)``: ``<prompt slug>-s<seed>.png``, e.g. ``two-red-circles-s0.png``. A prompt
    that is not exactly its lower-case words (capitals, punctuation, more than 60 characters) gets 8 hex digits of
    its SHA-1 too, so two prompts never share a file."""
    words = re.sub(r"[^a-z0-9]+", "-", prompt.lower()).strip("-")
    slug = words[:60].rstrip("-") or "prompt"
    if slug.replace("-", " ") != prompt:
        slug += "-" + hashlib.sha1(prompt.encode("utf-8")).hexdigest()[:8]
    return f"{slug}-s{seed}.png"


def _json_normal(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples become lists), for comparing settings."""
    return json.loads(json.dumps(value, default=str))


def _journal_files(out_dir: Path) -> List[Path]:
    return sorted(out_dir.glob(".generations-process*.jsonl"))


def _read_manifest(out_dir: Path) -> Tuple[Optional[Dict[str, Any]], List[Dict[str, Any]]]:
    """``(settings, records)`` already in ``out_dir``: the manifest's, then the journals' of an interrupted run."""
    path = out_dir / MANIFEST_NAME
    settings, records = None, []
    if path.is_file():
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            raise UserInputError(
                f"--output {out_dir}: its {MANIFEST_NAME} is not valid JSON ({err}); pass --overwrite "
                "to start the folder afresh, or another --output"
            ) from None
        settings = manifest.get("settings") if isinstance(manifest, dict) else None
        records = list(manifest.get("images", [])) if isinstance(manifest, dict) else []
        if (
            settings is None
        ):  # written by an older version (0000.png, ...): its images are not named by prompt and seed
            settings = {"version": "older var-accel (files numbered 0000.png, ...)"}
    for journal in _journal_files(out_dir):
        records.extend(_read_journal(journal))
    return settings, records


def _read_journal(journal: Path) -> List[Dict[str, Any]]:
    """The whole records of a process's journal. A record is one line ending in a newline; a line without its newline
    (torn by a power cut) or not valid JSON is ignored with a warning naming the file and line: that image is redone."""
    records = []
    data = journal.read_bytes()
    lines = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        torn = number == len(lines)  # after the last newline: empty, or a record cut short
        if torn and not line:
            break
        try:
            if torn:
                raise ValueError("the line has no newline: the record was cut short")
            record = json.loads(line.decode("utf-8"))
            if not isinstance(record, dict) or not isinstance(record.get("file"), str):
                raise ValueError("not a record of an image")
        except (ValueError, UnicodeDecodeError) as err:
            print(
                f"warning: {journal}, line {number}: ignored ({err}); its image is generated again",
                file=sys.stderr,
            )
            continue
        records.append(record)
    return records


def _repair_journal(journal: Path) -> None:
    """Cut a torn last record (no newline) off ``journal`` before records are appended to it: a record appended to
    a torn line would be unreadable with it."""
    if not journal.is_file():
        return
    data = journal.read_bytes()
    if data and not data.endswith(b"\n"):
        with journal.open("r+b") as stream:
            stream.truncate(data.rfind(b"\n") + 1)


def _append_record(journal: Path, record: Dict[str, Any]) -> None:
    """Append ``record`` to ``journal`` as one line in one write, flushed to disk: a record is whole, or (a power cut
    during the write) a torn last line that :func:`_read_journal` ignores."""
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def _differences(old: Dict[str, Any], new: Dict[str, Any]) -> List[str]:
    """The settings that differ between two runs (the acceleration by its configuration, not by how it was named)."""
    out = []
    for key in dict.fromkeys([*old, *new]):
        if key == "acceleration" or old.get(key) == new.get(key):
            continue
        if key == "acceleration_config":
            out.append(f"acceleration: {old.get('acceleration', 'baseline')!r} there, {new.get('acceleration')!r} now")
        else:
            out.append(f"{key}: {old.get(key)!r} there, {new.get(key)!r} now")
    return out


def _sampling_settings(pipe, options: Dict[str, Any]) -> Dict[str, Any]:
    """The sampling values a call uses: ``options``, else the pipeline's own defaults (``null``: the pipeline picks
    per size, e.g. HART's top-k)."""
    parameters = inspect.signature(pipe.__call__).parameters
    settings = {}
    for key in SAMPLING_KEYS:
        if key in options:
            settings[key] = options[key]
        elif key in parameters and parameters[key].default is not inspect.Parameter.empty:
            settings[key] = parameters[key].default
    return settings


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def _default_side(pipe, model: Optional[str]) -> int:
    """The image side a call makes when no ``--height`` is given: the tiny model's registered size, else the
    pipeline's ``default_size`` (one side, or ``(height, width)``)."""
    tiny = family_of_tiny_model(model)
    if tiny is not None and tiny.tiny_size is not None:
        return tiny.tiny_size
    side = pipe.default_size
    return side[0] if isinstance(side, tuple) else side


def _files_stamp(path: Path) -> List[List[Any]]:
    """``[[relative path, size, mtime_ns]]`` of every file under ``path`` (a file or a folder): a change of any of
    them (a replaced checkpoint, an edited config) changes the stamp; only ``stat`` is read."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return [
        [str(p.relative_to(path) if path.is_dir() else p.name), p.stat().st_size, p.stat().st_mtime_ns] for p in files
    ]


def _invocation(job: GenerateJob) -> Dict[str, Any]:
    """What decides a run's images that is known before any model loads: the arguments that change an image, the
    package version, and the stamp of the files the arguments name (the model folder, an acceleration file or
    folder). The same invocation over a folder that holds all its images has nothing to do."""
    from diffusers_var_accel.embedded import EMBEDDED_MODEL_PATH
    from diffusers_var_accel.version import __version__

    key: Dict[str, Any] = {
        "model": job.model,
        "height": job.height,
        "width": job.width,
        "seed": job.seed,
        "dtype": job.dtype,
        "accel": job.accel,
        "device": job.device,
        **{name: job.sampling.get(name) for name in SAMPLING_KEYS},
    }
    key["version"] = __version__
    key["num_prompts"] = len(job.prompts)
    model_path = EMBEDDED_MODEL_PATH if job.model is None else Path(job.model)
    key["model_files"] = _files_stamp(model_path) if model_path.exists() else None
    accel = Path(job.accel) if job.accel else None
    key["accel_files"] = _files_stamp(accel) if accel is not None and accel.exists() else None
    return _json_normal(key)


def nothing_to_do(job: GenerateJob) -> bool:
    """Whether the folder's manifest records this very invocation and holds every image it makes (then no model
    needs loading). Only for a single process: under torchrun every process takes part in the run."""
    out_dir = job.output
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or job.overwrite or not (out_dir / MANIFEST_NAME).is_file():
        return False
    try:
        manifest = json.loads((out_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, OSError):
        return False  # the full path reports it
    if not isinstance(manifest, dict) or manifest.get("invocation") != _invocation(job):
        return False
    recorded = {r.get("file") for r in manifest.get("images", []) if isinstance(r, dict)}
    names = {image_file_name(prompt, job.seed + i) for i, prompt in enumerate(job.prompts)}
    return names <= recorded and all((out_dir / name).is_file() for name in names)


def _write_manifest(
    job: GenerateJob,
    settings: Dict[str, Any],
    records: List[Dict[str, Any]],
    invocation: Optional[Dict[str, Any]] = None,
) -> None:
    manifest = {
        "settings": settings,
        "height": settings["height"],
        "width": settings["width"],
        "acceleration": settings["acceleration"],
        "batch_size": job.batch_size,
        "images": records,
    }
    if invocation is not None:
        manifest["invocation"] = invocation
    write_atomic(job.output / MANIFEST_NAME, json.dumps(manifest, indent=2, allow_nan=False).encode("utf-8"))


def _make_output_folder(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserInputError(f"--output {path}: cannot create the folder ({err.strerror or err})") from None


def _leave_process_group() -> None:
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def run_generate_job(
    job: GenerateJob,
    load_pipeline: Callable[[Optional[str], str, str], Any],
    load_acceleration: Callable[[Optional[str], str, Optional[str]], Any],
) -> int:
    """Run ``job`` (see the module docstring); 0 when done.

    Args:
        job: the checked arguments.
        load_pipeline: ``load_pipeline(model, device, dtype)``, e.g. :func:`diffusers_var_accel.lab.loading.load_pipeline`.
        load_acceleration: ``load_acceleration(spec, family, preset_model)``: the scheduler of ``job.accel`` (``None``
            for the baseline).

    Raises:
        UserInputError: a bad model, acceleration, sampling option or output folder (the message names it).
    """
    import torch

    from diffusers_var_accel.lab.bench.runner import finish_distributed, process_share, process_state
    from diffusers_var_accel.embedded import EMBEDDED_MODEL_NAMES, EMBEDDED_SAMPLING

    out_dir, prompts = job.output, job.prompts
    # 1. The same invocation over a folder that holds all its images: nothing to load
    if nothing_to_do(job):
        # what a run killed after writing this manifest left: its journals (merged into the manifest) and temporaries
        for journal_file in _journal_files(out_dir):
            journal_file.unlink()
        remove_stale_temporaries(out_dir)
        print(
            f"{out_dir}: all {len(prompts)} images of this command are already there (same command, same files): "
            "nothing to generate",
            file=sys.stderr,
        )
        return 0

    # 2. Processes (torchrun / accelerate launch), pipeline, acceleration
    state, device = process_state(job.device)
    try:
        with user_errors(f"--model {job.model or 'embedded'}: ", job.debug):
            pipe = load_pipeline(job.model, device, job.dtype)
        pipe.set_progress_bar_config(disable=state.num_processes > 1 or not job.progress)
        is_embedded = job.model is None or job.model in EMBEDDED_MODEL_NAMES
        try:  # an option of another family (--tau for HART), from the registry
            check_sampling_options(pipe.model_family, [k for k, v in job.sampling.items() if v is not None], _flag)
        except ValueError as err:
            raise UserInputError(str(err)) from None
        with user_errors(f"--accel {job.accel}: ", job.debug):
            acceleration = load_acceleration(job.accel, pipe.model_family, getattr(pipe, "preset_model", None))
        height = job.height or _default_side(pipe, job.model)
        width = job.width or height
        options = dict(EMBEDDED_SAMPLING) if is_embedded else {}  # the embedded model's evaluated settings
        options.update({k: job.sampling[k] for k in SAMPLING_KEYS if job.sampling.get(k) is not None})
        settings = {
            "model": "embedded"
            if is_embedded
            else (job.model if family_of_tiny_model(job.model) is not None else str(Path(job.model).resolve())),
            "pipeline": type(pipe).__name__,
            "height": height,
            "width": width,
            **_sampling_settings(pipe, options),
            "acceleration": job.accel or "baseline",
            "acceleration_config": None
            if acceleration is None
            else {
                "_class_name": type(acceleration).__name__,
                **{k: v for k, v in acceleration.config.items() if not k.startswith("_")},
            },
            "dtype": job.dtype,
            "device_type": torch.device(device).type,
        }
        settings = _json_normal(settings)

        # 3. The output folder: a new one, the same run again (resumed: finished images are skipped), or refused
        try:
            old_settings, old_records = _read_manifest(out_dir) if out_dir.is_dir() else (None, [])
        except UserInputError:
            if not job.overwrite:
                raise
            old_settings, old_records = {"manifest": "unreadable"}, []  # --overwrite: start afresh
        state.wait_for_everyone()  # every process has read the folder before the main process changes it
        same_run = old_settings is None or not _differences(old_settings, settings)
        if not same_run and not job.overwrite:
            raise UserInputError(
                f"--output {out_dir} holds images generated with other settings ("
                + "; ".join(_differences(old_settings, settings))
                + "); pass another --output, or --overwrite to delete them and start afresh"
            )
        if not same_run:  # --overwrite
            if state.is_main_process:
                for record in old_records:
                    name = str(record.get("file", "")) if isinstance(record, dict) else ""
                    if name and Path(name).name == name and name.endswith(".png"):  # only images of this folder
                        (out_dir / name).unlink(missing_ok=True)
                for stale in [out_dir / MANIFEST_NAME, *_journal_files(out_dir)]:
                    stale.unlink(missing_ok=True)
            old_records = []
        finished = {
            r["file"]: r for r in old_records if isinstance(r, dict) and (out_dir / str(r.get("file"))).is_file()
        }
        if state.is_main_process:
            _make_output_folder(out_dir)
            remove_stale_temporaries(out_dir)  # what a killed earlier run was writing (never a finished image)
            _write_manifest(job, settings, list(finished.values()))
        state.wait_for_everyone()

        # 4. This process's share of the (prompt, seed) items, minus the finished ones
        items, seen = [], set()
        for i, prompt in enumerate(prompts):
            name = image_file_name(prompt, job.seed + i)
            if name not in seen:  # the same prompt and seed twice: one image
                seen.add(name)
                items.append({"position": i, "prompt": prompt, "seed": job.seed + i, "file": name})
        mine = process_share(state, items)
        todo = [item for item in mine if item["file"] not in finished]
        if not todo and mine:
            print(
                f"{out_dir}: all {len(mine)} of this run's images are already there (same settings): nothing to "
                "generate",
                file=sys.stderr,
            )
        elif len(todo) < len(mine):
            print(
                f"{out_dir}: {len(mine) - len(todo)} of this run's {len(mine)} images are already there (same settings); "
                f"generating the other {len(todo)}",
                file=sys.stderr,
            )
        if acceleration is not None:
            options["acceleration"] = acceleration
        journal = out_dir / f".generations-process{state.process_index}.jsonl"
        _repair_journal(journal)
        for first in range(0, len(todo), job.batch_size):
            batch = todo[first : first + job.batch_size]
            generators = [
                torch.Generator("cpu").manual_seed(item["seed"]) for item in batch
            ]  # each image its own seed
            start = time.perf_counter()
            with user_errors("", job.debug):
                if len(batch) == 1:
                    images = pipe(
                        batch[0]["prompt"], height=height, width=width, generator=generators[0], **options
                    ).images
                else:
                    images = pipe(
                        [item["prompt"] for item in batch], height=height, width=width, generator=generators, **options
                    ).images
            seconds = (time.perf_counter() - start) / len(batch)
            if job.summary:  # what acceleration did in this call, and its counted FLOPs against the baseline's
                from .summary import call_summary

                call = {"height": height, "width": width, **options}
                print(call_summary(pipe, [item["prompt"] for item in batch], **call))
            for item, image in zip(batch, images):
                path = out_dir / item["file"]
                with atomic_file(path) as tmp:  # a killed run leaves no half-written image behind
                    image.save(tmp)
                record = {
                    "prompt": item["prompt"],
                    "seed": item["seed"],
                    "file": item["file"],
                    "seconds": round(seconds, 3),
                    "process": state.process_index,
                }
                _append_record(journal, record)
                print(f"{path}  ({seconds:.2f} s)  {item['prompt']}")

        # 5. One manifest: the main process merges every process's journal
        state.wait_for_everyone()
        if state.is_main_process:
            _, records = _read_manifest(out_dir)
            order = {item["file"]: n for n, item in enumerate(items)}
            merged: Dict[str, Dict[str, Any]] = {}
            for record in records:
                if isinstance(record, dict) and (out_dir / str(record.get("file"))).is_file():
                    merged.setdefault(record["file"], record)
            earlier = [r for f, r in merged.items() if f not in order]
            this_run = sorted((r for f, r in merged.items() if f in order), key=lambda r: order[r["file"]])
            # the invocation lets the same command again skip loading the model when every image is there
            _write_manifest(job, settings, earlier + this_run, invocation=_invocation(job))
            for journal_file in _journal_files(out_dir):
                journal_file.unlink()
            print(f"wrote {out_dir / MANIFEST_NAME} ({len(merged)} images)", file=sys.stderr)
    except BaseException:
        # A process that fails leaves at once (torchrun then stops the others): a barrier here would wait forever
        # for processes that are still generating or waiting at another barrier.
        _leave_process_group()
        raise
    finish_distributed()
    return 0
