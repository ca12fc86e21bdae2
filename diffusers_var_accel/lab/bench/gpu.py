"""One-GPU runner: Infinity-2B and HART-0.7B with random weights at their real configurations, 1024x1024, batch 1 and
4, eager and CUDA graphs, the baseline against every preset, with speed-ups from the same run, counted TFLOPs and
peak memory, in ONE table. Nothing is downloaded.

It reuses ``latency.py`` (``build_pipeline`` builds each model from its real config, its random weights drawn on the
device; ``pipeline_inputs``: random text features of the model's shape). The timed call is the next-scale loop:
``output_type="latent"``, so the text encoder and the decoder are excluded (they cost the same for every method).
Random weights make the token choices meaningless but keep every shape, so the times and FLOPs are those of the real
architectures. Infinity runs in bfloat16, HART in float16 (the official inference dtypes), both under the pipelines'
autocast.

**Blocks.** One block is (model, batch size, mode); its methods are timed interleaved (baseline, A, B, ..., baseline,
...), after warm-up rounds, synchronised, with the peak memory of each call. Modes:

* ``eager``: the pipeline as it is, plus the reference row ``official-style``: the baseline with
  ``pipe.set_sampling("official")`` (``torch.multinomial`` sampling, as the official code).
* ``graphs``: the same methods after ``pipe.enable_cuda_graphs(capture=..., max_workspaces=<rows>)``: one workspace
  per row, so the interleaved rounds replay every pass; ``--graph-warmup`` rounds capture them. A method whose preset
  draws random numbers inside its passes (StageVAR's token mixtures) cannot be captured: its graph row runs the
  preset's capturable variant and is labelled ``<method>*`` (what the ``*`` leaves out is in its note). After the
  timed rounds each graph row runs one call with a fresh seed and fresh text features under graphs and once eagerly
  (``pipe.eager_passes()``), and records whether every scale's tokens are equal and the latents' largest
  difference: a static input that went stale would show there. ``--capture trace`` is the CPU stand-in (the dry run).

**What a row says.** ``ran`` reads ``eager``; ``graphs (N replays)`` (every timed pass replayed); or
``BUG: N captured while timed`` (a timed call captured passes after the warm-up: its time is a capture's, and the row
is left out of ``vs graphs``). ``vs eager`` divides the eager baseline's median of the same (model, batch) by the
row's median, ``vs graphs`` the graph baseline's. ``peak GiB``: ``torch.cuda.max_memory_allocated`` over the row's
timed calls on CUDA (a leak shows as growth between rounds); on a CPU, where these times measure nothing, the peak
of live tensor bytes of the row's first timed call (``LiveTensorBytes``).

**FLOPs** are counted on a CPU, not on the GPU host: the run reads them from ``benchmarks/results/gpu_flops.json``
(made by ``python -m diffusers_var_accel.lab.bench.gpu --write-flops-table``, 3-4 CPU minutes); a model or method not in it is counted
after the last block if ``--max-seconds`` leaves time. ``loop TFLOPs`` exclude the VAE decode, as the timed call does.

Blocks run in order of importance: at batch 1 the eager rows of Infinity-2B and HART-0.7B, then their graph rows
(baseline, LazyVAR, then the other methods), then batch 4; after ``--max-seconds`` no new block, nor a new row's
warm-up, starts. **Every row is guarded**: a row that fails (out of memory, a capture error) is reported with its
error and the others go on; a model that fails to build marks its blocks failed and the run goes on; an interrupt
(``gpu.sh``'s deadline) keeps the finished rounds of the block in progress, prints the table, writes the JSON and
exits 0. The table is printed after every block and at the end; the JSON file is rewritten after every block.

Usage (the time budget of a device call is in ``gpu.sh``'s header)::

    bash benchmarks/gpu.sh                         # = python3 -m diffusers_var_accel.lab.bench.gpu --json $OUT/gpu_results.json
    bash benchmarks/gpu.sh --dry-run               # the real schedules at a tiny width, on the CPU (CI)
    python3 -m diffusers_var_accel.lab.bench.gpu --models infinity-2b --batch-sizes 1 --methods baseline,lazyvar --modes eager
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from diffusers_var_accel.lab.bench.latency import build_pipeline, pipeline_inputs
from diffusers_var_accel.schedulers.registry import default_method_specs
from diffusers_var_accel.schedulers.specs import load_acceleration, split_acceleration_specs

#: latency.py's tiny random-weight models (the dry run's)
TINY_MODELS = ("tiny", "tiny-hart")

DEFAULT_MODELS = ("infinity-2b", "hart-0.7b")
DEFAULT_METHODS = ",".join(default_method_specs())
MODES = ("eager", "graphs")
#: Weights dtype per model family, as the official inference (Infinity bf16, HART fp16).
FAMILY_DTYPES = {"infinity": torch.bfloat16, "hart": torch.float16}
#: The label of the eager reference row (the baseline sampling with torch.multinomial, as the official code).
OFFICIAL_ROW = "official-style"
#: The committed FLOP counts the device run reads (``--write-flops-table`` makes it on a CPU): the source checkout's
#: ``benchmarks/results/gpu_flops.json`` (the runner runs from a checkout, through ``benchmarks/gpu.sh``).
FLOPS_TABLE = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "gpu_flops.json"
#: Seed of the fresh-input check of a graph row (the timed calls use seeds 0..batch-1 and text features of seed 0).
CHECK_SEED = 1000


# -- FLOPs ---------------------------------------------------------------------------------------------------------
def count_tflops_per_image(
    model: str, family: str, methods: List[str], height: int, width: int
) -> Dict[str, Optional[float]]:
    """Loop TFLOPs of one image per method (the FLOP meter on meta tensors, CFG on; the VAE decode excluded, as the
    timed call excludes it); ``None`` for models it does not know."""
    return {
        m: (r or {}).get("loop_tflops") for m, r in count_flops_records(model, family, methods, height, width).items()
    }


def count_flops_records(model: str, family: str, methods: List[str], height: int, width: int) -> Dict[str, Any]:
    """``{method: {"total_tflops", "vae_tflops", "loop_tflops"}}`` counted on meta tensors (``None``: unknown model)."""
    from diffusers_var_accel.lab.bench import flops

    out: Dict[str, Any] = {}
    for method in methods:
        accel = None if method == "baseline" else method
        if family == "infinity" and model in flops.MODEL_SPECS:
            record = flops.count_infinity_flops(model, height, width, accel=accel)
        elif family == "hart" and model in flops.HART_TOKENIZER_CONFIGS:
            record = flops.count_hart_flops(model, accel=accel)
        else:
            out[method] = None
            continue
        total, vae = record["total_tflops"], record.get("vae_tflops", 0.0)
        out[method] = {"total_tflops": total, "vae_tflops": vae, "loop_tflops": total - vae}
    return out


def read_flops_table(path: Path = FLOPS_TABLE) -> Dict[str, Any]:
    """The committed table: ``{"<model>@<h>x<w>": {method: {...}}}`` (empty when the file is missing)."""
    return json.loads(path.read_text())["models"] if path.is_file() else {}


def write_flops_table(path: Path, models: List[str], methods: List[str], size: int) -> None:
    """Count every (model, method) at ``size`` on this machine and write the table the device run reads."""
    from diffusers_var_accel.lab.bench import flops

    table = {}
    for model in models:
        if model in flops.MODEL_SPECS:
            family, height, width = "infinity", size, size
        elif model in flops.HART_TOKENIZER_CONFIGS:
            family, height = "hart", 1024
            width = height
        else:
            raise ValueError(
                f"no FLOP count for model {model!r}: the counter knows {list(flops.MODEL_SPECS)} and "
                f"{list(flops.HART_TOKENIZER_CONFIGS)}"
            )
        table[f"{model}@{height}x{width}"] = count_flops_records(model, family, methods, height, width)
        print(f"counted {model}: {', '.join(methods)}", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "counted_with": f"python -m diffusers_var_accel.lab.bench.gpu --write-flops-table (torch {torch.__version__})",
                "models": table,
            },
            indent=2,
        )
        + "\n"
    )


# -- order and rows ------------------------------------------------------------------------------------------------
def block_order(models: List[str], batch_sizes: List[int], modes: List[str]) -> List[Tuple[str, int, str]]:
    """``(model, batch, mode)`` in order of importance: at the first batch size the eager rows of every model, then
    their graph rows; then the next batch size."""
    return [(model, batch, mode) for batch in batch_sizes for mode in modes for model in models]


#: Graph rows start with these (after the baseline): capture is costly and the time may run out.
GRAPH_FIRST = ("lazyvar",)


def _rows_for(mode: str, methods: List[str]) -> List[Dict[str, Any]]:
    if mode == "graphs":  # the baseline, then LazyVAR, then the rest while time lasts
        methods = (
            methods[:1]
            + [m for m in methods[1:] if m in GRAPH_FIRST]
            + [m for m in methods[1:] if m not in GRAPH_FIRST]
        )
    rows = [{"method": m, "label": m, "sampling": None} for m in methods]
    if mode == "eager":
        rows.append({"method": "baseline", "label": OFFICIAL_ROW, "sampling": "official"})
    return rows


def _graph_scheduler(row: Dict[str, Any], scheduler) -> Any:
    """The scheduler a graph row runs: the method's, or, when its passes draw random numbers inside them (which no
    graph can hold), its capturable variant (the row's label gets a ``*`` and a note says what it leaves out)."""
    if scheduler is None or not scheduler.draws_inside_passes:
        return scheduler
    variant = scheduler.capturable_variant()
    row["label"] = f"{row['method']}*"
    row["note"] = f"* {variant.capturable_variant_note}"
    return variant


# -- timing --------------------------------------------------------------------------------------------------------
def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _sampling_switch(pipe, mode: Optional[str]):
    """Set ``pipe``'s sampling mode for one call; returns the restore function and what the row sampled with."""
    if mode is None:
        return (lambda: None), None
    if not hasattr(pipe, "set_sampling"):
        return (lambda: None), "default (torch.multinomial: no set_sampling)"
    previous = getattr(pipe, "sampling", None)
    pipe.set_sampling(mode)
    return ((lambda: pipe.set_sampling(previous)) if previous is not None else (lambda: None)), mode


def _graph_counts(pipe) -> Optional[Tuple[int, int]]:
    graphs = getattr(pipe, "pass_graphs", None)
    return None if graphs is None else (graphs.captured_passes, graphs.replayed_passes)


def _with_cpu_peak(label: str, peak: Dict[str, Optional[float]], call: Callable[[], Any]) -> Any:
    """``call()`` under the live-bytes meter, its peak (GiB) kept in ``peak[label]``."""
    from diffusers_var_accel.lab.bench.live_bytes import LiveTensorBytes

    with LiveTensorBytes() as meter:
        result = call()
    peak[label] = meter.peak / 2**30
    return result


def fresh_input_check(pipe, inputs: Dict[str, Any], scheduler, batch: int, device: str) -> Dict[str, Any]:
    """One call with a fresh seed and fresh text features under graphs, the same call eagerly: are the tokens of
    every scale equal, and how far apart are the latents."""
    embeds = inputs["prompt_embeds"]
    g = torch.Generator("cpu").manual_seed(CHECK_SEED)
    fresh = {**inputs, "prompt_embeds": torch.randn(embeds.shape, generator=g).to(embeds)}

    def call():
        tokens = {}

        def keep(p, scale_index, scale, values):
            if values["tokens"] is not None:
                tokens[scale_index] = values["tokens"].clone()
            return {}

        generators = [torch.Generator(device).manual_seed(CHECK_SEED + i) for i in range(batch)]
        latent = pipe(
            **fresh,
            generator=generators,
            acceleration=scheduler,
            output_type="latent",
            callback_on_step_end=keep,
            callback_on_step_end_tensor_inputs=["tokens"],
        ).images
        return latent, tokens

    graph_latent, graph_tokens = call()
    with pipe.eager_passes():
        eager_latent, eager_tokens = call()
    same = graph_tokens.keys() == eager_tokens.keys() and all(
        torch.equal(graph_tokens[k], eager_tokens[k]) for k in graph_tokens
    )
    return {
        "tokens_equal": bool(same),
        "latent_max_abs_diff": float((graph_latent.float() - eager_latent.float()).abs().max()),
    }


def measure_rows(
    pipe,
    rows: List[Dict[str, Any]],
    batch: int,
    height: int,
    width: int,
    repeats: int,
    warmup: int,
    device: str,
    out_of_time: Callable[[], bool],
    graphs: bool = False,
    tiny: bool = False,
) -> List[Dict[str, Any]]:
    """Time ``rows`` (``{"method", "label", "sampling"}``) interleaved; one record per row.

    Each row is warmed up ``warmup`` times before the timed rounds; a row whose warm-up would start after the time
    budget is skipped (``"skipped"`` set, no times). With ``graphs`` (the pipeline's passes are captured), each row
    counts the passes its timed calls captured and replayed and runs :func:`fresh_input_check` after the rounds.
    """
    family = pipe.model_family
    schedulers = {}
    for r in rows:
        scheduler = load_row_scheduler(r["method"], family, tiny)
        schedulers[r["label"]] = _graph_scheduler(r, scheduler) if graphs else scheduler  # may relabel the row
    inputs = pipeline_inputs(pipe, batch, height, width, device)
    pipe.set_progress_bar_config(disable=True)

    def run(row: Dict[str, Any]) -> Tuple[float, Optional[str]]:
        # the sampling RNG lives on the timed device, as in the official code
        generators = [torch.Generator(device).manual_seed(i) for i in range(batch)]
        restore, sampled_with = _sampling_switch(pipe, row.get("sampling"))
        try:
            _sync(device)
            start = time.perf_counter()
            pipe(**inputs, generator=generators, acceleration=schedulers[row["label"]], output_type="latent")
            _sync(device)
            return time.perf_counter() - start, sampled_with
        finally:
            restore()

    active, skipped, failed = [], [], {}
    times: Dict[str, List[float]] = {r["label"]: [] for r in rows}
    peak: Dict[str, Optional[float]] = {r["label"]: None for r in rows}
    checks: Dict[str, Dict[str, Any]] = {}
    sampled: Dict[str, Optional[str]] = {}
    interrupted = False
    captures: Dict[str, List[int]] = {r["label"]: [0, 0] for r in rows}  # passes (captured, replayed), timed calls

    def guarded(row: Dict[str, Any], call: Callable[[], Any], timed: bool = False) -> Optional[Any]:
        """``call()`` for ``row``; a failure marks the row failed (the others go on); for a timed call the passes it
        captured / replayed are added to the row's."""
        counts = _graph_counts(pipe)
        try:
            result = call()
            if timed and counts is not None:
                now = _graph_counts(pipe)
                captures[row["label"]][0] += now[0] - counts[0]
                captures[row["label"]][1] += now[1] - counts[1]
            return result
        except Exception as err:  # noqa: BLE001 - an OOM or a capture error must not lose the other rows
            failed[row["label"]] = (
                f"failed: {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
            )
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            return None

    try:
        for row in rows:
            if out_of_time():
                skipped.append(row)
                continue
            if all(guarded(row, lambda row=row: run(row)) is not None for _ in range(warmup)):
                active.append(row)
        for round_index in range(repeats):
            for row in active:
                if row["label"] in failed:
                    continue
                if device.startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats()
                    call = lambda row=row: run(row)  # noqa: E731
                elif round_index == 0:  # a CPU times nothing here: its first round also meters live tensor bytes
                    call = lambda row=row: _with_cpu_peak(row["label"], peak, lambda: run(row))  # noqa: E731
                else:
                    call = lambda row=row: run(row)  # noqa: E731
                result = guarded(row, call, timed=True)
                if result is None:
                    continue
                seconds, sampled[row["label"]] = result
                times[row["label"]].append(seconds)
                if device.startswith("cuda"):
                    peak[row["label"]] = max(peak[row["label"]] or 0.0, torch.cuda.max_memory_allocated() / 2**30)
        if graphs:
            for row in active:
                if row["label"] not in failed and times[row["label"]]:
                    check = guarded(
                        row, lambda row=row: fresh_input_check(pipe, inputs, schedulers[row["label"]], batch, device)
                    )
                    if check is not None:
                        checks[row["label"]] = check
    except KeyboardInterrupt:  # gpu.sh's deadline: keep the rounds this block finished
        interrupted = True
    records = []
    for row in rows:
        t = times[row["label"]]
        if not t:
            why = failed.get(row["label"]) or (
                "time budget spent" if row in skipped else "interrupted" if interrupted else "no timed round"
            )
            records.append(
                {**row, "median_s": None, "min_s": None, "max_s": None, "peak_gib": None, "repeats": 0, "skipped": why}
            )
            continue
        note = "; ".join(filter(None, [row.get("note"), failed.get(row["label"])]))
        records.append(
            {
                **row,
                "min_s": min(t),
                "median_s": statistics.median(t),
                "max_s": max(t),
                "peak_gib": peak[row["label"]],
                "peak_measure": "cuda max_memory_allocated" if device.startswith("cuda") else "live tensor bytes",
                "repeats": len(t),
                "sampled_with": sampled.get(row["label"]),
                **(
                    {
                        "passes_captured": captures[row["label"]][0],
                        "passes_replayed": captures[row["label"]][1],
                        "fresh_input_check": checks.get(row["label"]),
                    }
                    if graphs
                    else {}
                ),
                **({"note": note} if note else {}),
            }
        )
    if interrupted:
        raise BlockInterrupted(records)
    return records


class BlockInterrupted(KeyboardInterrupt):
    """An interrupt inside a block, carrying the records of the rows (finished rounds kept)."""

    def __init__(self, records: List[Dict[str, Any]]):
        super().__init__("interrupted")
        self.records = records


# -- the table -----------------------------------------------------------------------------------------------------
def captured_while_timed(record: Dict[str, Any]) -> bool:
    """Whether a graph row's timed calls captured passes (after its warm-up): a bug, not a number."""
    return bool(record.get("passes_captured"))


def how_it_ran(block: Dict[str, Any], record: Dict[str, Any]) -> str:
    """``eager``, ``graphs (N replays)``, ``BUG: N captured while timed`` or ``-`` (no timed call)."""
    if record.get("median_s") is None:
        return "-"
    if block["mode"] == "eager":
        return "eager"
    if captured_while_timed(record):
        return f"BUG: {record['passes_captured']} captured while timed"
    return f"graphs ({record.get('passes_replayed') or 0} replays)"


def add_speedups(blocks: List[Dict[str, Any]]) -> None:
    """Set ``speedup_vs_eager`` / ``speedup_vs_graphs`` of every record from the baselines of the same (model, batch);
    a graph row that captured while timed is left out of ``vs graphs`` (and is no graph baseline)."""
    base: Dict[Tuple[str, int, str], float] = {}
    for b in blocks:
        for r in b["records"]:
            if r["label"] == "baseline" and r.get("median_s") and not captured_while_timed(r):
                base[(b["model"], b["batch_size"], b["mode"])] = r["median_s"]
    for b in blocks:
        for r in b["records"]:
            for mode in MODES:
                ref = base.get((b["model"], b["batch_size"], mode))
                usable = r.get("median_s") and not (mode == "graphs" and captured_while_timed(r))
                r[f"speedup_vs_{mode}"] = ref / r["median_s"] if ref and usable else None


def _check_cell(record: Dict[str, Any]) -> str:
    check = record.get("fresh_input_check")
    if not check:
        return "-"
    return f"{'equal' if check['tokens_equal'] else 'DIFFER'} {check['latent_max_abs_diff']:.1e}"


def format_table(blocks: List[Dict[str, Any]], header: str) -> str:
    """The one table: a row per (model, batch, mode, method)."""

    def cell(value, fmt, width):
        return f"{'n/a' if value is None else format(value, fmt):>{width}}"

    lines = [
        header,
        f"{'model':<12} {'batch':>5} {'mode':<7} {'method':<16} {'median s':>9} {'s/image':>9} {'vs eager':>9} "
        f"{'vs graphs':>9} {'loop TF':>8} {'FLOPs x':>8} {'peak GiB':>9} {'ran':<22} {'fresh check':<14} note",
    ]
    for b in blocks:
        tflops = b["tflops_per_image"]
        base_tflops = tflops.get("baseline")
        for r in b["records"]:
            # a capturable variant (label "stagevar*") runs other FLOPs than its method: not counted
            t = None if r["label"].endswith("*") else tflops.get(r["method"])
            median = r.get("median_s")
            per_image = median / b["batch_size"] if median is not None else None
            vs_eager = f"{r['speedup_vs_eager']:.2f}x" if r.get("speedup_vs_eager") else "n/a"
            vs_graphs = f"{r['speedup_vs_graphs']:.2f}x" if r.get("speedup_vs_graphs") else "n/a"
            ratio = f"{base_tflops / t:.2f}x" if t and base_tflops else "-"
            call_tflops = f"{t * b['batch_size']:.2f}" if t is not None else "-"
            note = (
                r.get("skipped")
                or r.get("note")
                or (f"sampling: {r['sampled_with']}" if r.get("sampled_with") else "")
            )
            lines.append(
                f"{b['model']:<12} {b['batch_size']:>5} {b['mode']:<7} {r['label']:<16} {cell(median, '.4f', 9)} "
                f"{cell(per_image, '.4f', 9)} {vs_eager:>9} {vs_graphs:>9} "
                f"{call_tflops:>8} {ratio:>8} "
                f"{cell(r.get('peak_gib'), '.3f', 9)} {how_it_ran(b, r):<22} {_check_cell(r):<14} {note}".rstrip()
            )
    return "\n".join(lines)


# -- the run -------------------------------------------------------------------------------------------------------
def _graphs_switch(pipe, enable: bool, capture: str = "cuda", max_workspaces: int = 4) -> Optional[str]:
    """``pipe.enable_cuda_graphs(capture, max_workspaces)`` / ``disable_cuda_graphs()``; returns why the rows are
    n/a, or ``None`` (graphs on)."""
    if not hasattr(pipe, "enable_cuda_graphs"):
        return "n/a: the pipeline has no enable_cuda_graphs()"
    if not enable:
        pipe.disable_cuda_graphs()
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if pipe.enable_cuda_graphs(capture=capture, max_workspaces=max_workspaces) is False:
            return f"n/a: enable_cuda_graphs(capture={capture!r}) needs CUDA (--capture trace runs anywhere)"
    return None


def versions(device: str) -> Dict[str, Any]:
    """What the run found: Python, torch, CUDA, diffusers, the device."""
    import diffusers

    found = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "cuda": torch.version.cuda,
    }
    if device.startswith("cuda"):
        found["device"] = torch.cuda.get_device_name()
        found["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    else:
        found["device"] = f"CPU ({torch.get_num_threads()} threads)"
    return found


#: The tiny models (``tiny``, ``tiny-hart``: the real architectures at width 32 and depth 2; at ``--size 1024`` the
#: Infinity schedule is the real 13-scale one, HART's always its real 14) run the presets with the settings that name
#: layers or chunks of the real depth fitted to 2 blocks (the dry run); every other setting is the preset's.
TINY_DEPTH, TINY_WIDTH = 2, 32
TINY_PRESET_FITS: Dict[Tuple[str, str], Dict[str, Any]] = {
    ("fastvar", "infinity"): {"pruned_layers": (1, 2)},
    ("stagevar", "infinity"): {"num_chunks": 2, "rank_ratios": ((0.13648282097649195, 0.2502819846292948),)},
    ("stagevar", "hart"): {"num_chunks": 2, "rank_ratios": ((0.2074957426329037, 0.2366069362690658),)},
}


def load_row_scheduler(method: str, family: str, tiny: bool):
    """The scheduler of a row: ``method``'s (``load_acceleration``), fitted to the tiny models' depth for ``tiny``."""
    scheduler = load_acceleration(method, family)
    fit = TINY_PRESET_FITS.get((method, family)) if tiny else None
    if fit:
        scheduler = type(scheduler).from_config({**scheduler.to_dict(), **fit})
    return scheduler


def _build(model: str, args, methods: List[str], flops_table: Dict[str, Any]):
    """The pipeline of ``model`` in its timed dtype and its block metadata; raises what building raised."""
    tiny = model in TINY_MODELS
    pipe = build_pipeline(
        model, args.device, torch.float32, tiny_depth=TINY_DEPTH, seed_device=args.device, tiny_width=TINY_WIDTH
    )
    family = pipe.model_family
    dtype = (
        FAMILY_DTYPES[family]
        if args.dtype == "auto" and args.device.startswith("cuda")
        else (torch.float32 if args.dtype == "auto" else getattr(torch, args.dtype))
    )
    if dtype != torch.float32:
        pipe = pipe.to(dtype=dtype)
    for m in methods:
        load_row_scheduler(m, family, tiny)  # a bad spec fails before anything is timed
    height = width = pipe.default_size if family == "hart" else args.size
    counted = flops_table.get(f"{model}@{height}x{width}", {})
    tflops = {m: (counted.get(m) or {}).get("loop_tflops") for m in methods}
    return pipe, {
        "family": family,
        "dtype": str(dtype).replace("torch.", ""),
        "height": height,
        "width": width,
        "tflops": tflops,
        "tiny": tiny,
        "num_scales": len(pipe.scale_schedule_for(height, width)[0])
        if family != "hart"
        else len(pipe.transformer.config.patch_nums),
    }


def _run_blocks(order, args, methods, pipes, info, blocks, skipped, out_of_time, write_json, flops_table) -> None:
    """Run the ``(model, batch, mode)`` blocks of ``order`` in turn, appending to ``blocks`` / ``skipped``."""
    broken: Dict[str, str] = {}
    for model, batch, mode in order:
        if model in broken:
            skipped.append(f"{model} batch {batch} {mode}: failed: {broken[model]}")
            continue
        if out_of_time():
            skipped.append(f"{model} batch {batch} {mode}: time budget spent")
            continue
        if model not in pipes:
            built = time.perf_counter()
            try:
                pipes[model], info[model] = _build(model, args, methods, flops_table)
            except Exception as err:  # noqa: BLE001 - one model's failure must not lose the other's blocks
                broken[model] = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
                print(f"error: building {model} failed ({broken[model]}); its blocks are skipped", flush=True)
                skipped.append(f"{model} batch {batch} {mode}: failed: {broken[model]}")
                write_json()
                continue
            pipe = pipes[model]
            print(
                f"built {model} ({info[model]['family']}, {len(pipe.transformer.blocks)} blocks, "
                f"{info[model]['num_scales']} scales, "
                f"{sum(p.numel() for p in pipe.transformer.parameters()) / 1e6:.0f}M transformer parameters, "
                f"{info[model]['dtype']}) in {time.perf_counter() - built:.1f} s",
                flush=True,
            )
        pipe, meta = pipes[model], info[model]
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        rows = _rows_for(mode, methods)
        block = {
            "model": model,
            "family": meta["family"],
            "height": meta["height"],
            "width": meta["width"],
            "batch_size": batch,
            "mode": mode,
            "dtype": meta["dtype"],
            "tflops_per_image": meta["tflops"],
        }
        unavailable = _graphs_switch(pipe, True, args.capture, len(rows)) if mode == "graphs" else None
        if unavailable:
            records = [
                {
                    **r,
                    "median_s": None,
                    "min_s": None,
                    "max_s": None,
                    "peak_gib": None,
                    "repeats": 0,
                    "skipped": unavailable,
                }
                for r in rows
            ]
        else:
            interrupted = None
            try:
                records = measure_rows(
                    pipe,
                    rows,
                    batch,
                    meta["height"],
                    meta["width"],
                    args.repeats,
                    args.graph_warmup if mode == "graphs" else args.warmup,
                    args.device,
                    out_of_time,
                    graphs=mode == "graphs",
                    tiny=meta["tiny"],
                )
            except BlockInterrupted as stop:
                records, interrupted = stop.records, stop
            finally:
                if mode == "graphs":
                    _graphs_switch(pipe, False)
            if interrupted is not None:
                blocks.append({**block, "records": records, "interrupted": True})
                add_speedups(blocks)
                write_json()
                raise interrupted
        if args.count_memory:
            add_counted_peaks(records, model, batch, meta)
        blocks.append({**block, "records": records})
        add_speedups(blocks)
        done = [f"{r['label']} {r['median_s']:.4f} s" for r in records if r.get("median_s") is not None]
        print(f"{model} batch {batch} {mode}: {', '.join(done) or records[0].get('skipped')}", flush=True)
        print(format_table(blocks, "so far:"), flush=True)
        write_json()


_COUNTED_PEAKS: Dict[Tuple[str, str, int, int, int, str], Tuple[Optional[float], Optional[str]]] = {}


def add_counted_peaks(records: List[Dict[str, Any]], model: str, batch: int, meta: Dict[str, Any]) -> None:
    """``--count-memory``: each record gets ``counted_peak_gib``, the memory meter's count (``var-accel memory``, on
    the meta device) of the same model, method, batch, size and dtype, beside ``peak_gib`` (on CUDA
    ``torch.cuda.max_memory_allocated``), so a GPU run checks the meter; ``None`` with ``counted_peak_note`` where the
    meter does not know the model (the dry run's tiny widths) or the setting. Counted once per setting."""
    from .memory import MemorySettings, count_memory

    for record in records:
        method = record["method"]
        key = (model, method, batch, meta["height"], meta["width"], meta["dtype"])
        if key not in _COUNTED_PEAKS:
            accel = None if method.lower() in ("baseline", "none") else method
            settings = MemorySettings(
                model, accel=accel, height=meta["height"], width=meta["width"], batch_size=batch, dtype=meta["dtype"]
            )
            try:
                _COUNTED_PEAKS[key] = (count_memory(settings)["peak_bytes"] / 2**30, None)
            except ValueError as err:
                _COUNTED_PEAKS[key] = (None, str(err).splitlines()[0])
        record["counted_peak_gib"], note = _COUNTED_PEAKS[key]
        if note:
            record["counted_peak_note"] = note


def _count_missing_flops(blocks, info, methods, out_of_time) -> List[str]:
    """Count, while time is left, the FLOPs of the models the committed table lacks; what was not counted."""
    missing = []
    for model, meta in info.items():
        if all(meta["tflops"].get(m) is not None for m in methods) or meta["tiny"]:
            continue
        if out_of_time():
            missing.append(model)
            continue
        meta["tflops"] = count_tflops_per_image(model, meta["family"], methods, meta["height"], meta["width"])
        for b in blocks:
            if b["model"] == model:
                b["tflops_per_image"] = meta["tflops"]
    return missing


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help="comma-separated latency.py models (default infinity-2b,hart-0.7b; tiny, tiny-hart (width 32, depth 2) for the dry "
        "run, with --size 1024 on the real 13-scale schedule)",
    )
    parser.add_argument(
        "--methods",
        default=DEFAULT_METHODS,
        help=f"comma-separated methods, baseline first (default {DEFAULT_METHODS})",
    )
    parser.add_argument("--batch-sizes", default="1,4", help="comma-separated batch sizes (default 1,4)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: eager, graphs (default both)")
    parser.add_argument(
        "--size", type=int, default=1024, help="Infinity image side (default 1024; HART makes its one size)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed interleaved rounds per block (default 3)")
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed rounds of every method first, eager (default 1)"
    )
    parser.add_argument(
        "--graph-warmup",
        type=int,
        default=2,
        help="untimed rounds of every method first with graphs: capture and first replay (default 2)",
    )
    parser.add_argument(
        "--capture",
        choices=["cuda", "trace"],
        default="cuda",
        help="how graph rows capture their passes: cuda (CUDA graphs) or trace (the CPU stand-in; the dry run)",
    )
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="default: cuda if available, else cpu (only tiny widths are practical on a CPU)",
    )
    parser.add_argument(
        "--count-memory",
        action="store_true",
        help="also record each row's counted peak (var-accel memory's meter on the meta device, about 10-60 s of CPU "
        "per setting) as counted_peak_gib beside the measured peak_gib",
    )
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="auto: bfloat16 for Infinity and float16 for HART on CUDA, float32 on the CPU",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=300.0,
        help="start no new block, nor a new method's warm-up, after this many seconds (default 300; gpu.sh's header)",
    )
    parser.add_argument(
        "--flops",
        choices=["table", "count", "none"],
        default="table",
        help="table: read the committed counts, counting what they lack after the last block if time is left "
        "(default); count: count on this host; none: no FLOP column",
    )
    parser.add_argument(
        "--no-flops", dest="flops", action="store_const", const="none", help="the same as --flops none"
    )
    parser.add_argument(
        "--write-flops-table",
        action="store_true",
        help=f"count every model and method here (on a CPU) into {FLOPS_TABLE.relative_to(FLOPS_TABLE.parents[2])} "
        "and exit",
    )
    parser.add_argument("--json", help="also write every record to this JSON file (rewritten after every block)")
    args = parser.parse_args(argv)
    methods = split_acceleration_specs(args.methods)
    if not methods or methods[0] != "baseline":
        print(f"error: --methods must start with baseline (the speed-up reference), got {methods}", file=sys.stderr)
        return 2
    try:
        batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        print(
            f"error: --batch-sizes {args.batch_sizes!r}: expected comma-separated integers such as 1,4",
            file=sys.stderr,
        )
        return 2
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        print(f"error: --modes {args.modes!r}: allowed {', '.join(MODES)} (comma-separated)", file=sys.stderr)
        return 2
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.write_flops_table:
        write_flops_table(FLOPS_TABLE, models, methods, args.size)
        print(f"wrote {FLOPS_TABLE}")
        return 0
    start = time.perf_counter()
    out_of_time = lambda: time.perf_counter() - start > args.max_seconds  # noqa: E731
    found = versions(args.device)
    print(
        "GPU runner: "
        + ", ".join(f"{k} {v}" for k, v in found.items())
        + "; random weights, real configurations, no download",
        flush=True,
    )
    flops_table = read_flops_table() if args.flops == "table" else {}
    pipes: Dict[str, Any] = {}
    info: Dict[str, Dict[str, Any]] = {}
    blocks: List[Dict[str, Any]] = []
    skipped: List[str] = []

    def write_json() -> None:
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        **found,
                        "capture": args.capture,
                        "repeats": args.repeats,
                        "warmup": args.warmup,
                        "graph_warmup": args.graph_warmup,
                        "total_seconds": time.perf_counter() - start,
                        "skipped": skipped,
                        "blocks": blocks,
                    },
                    indent=2,
                )
            )

    order = block_order(models, batch_sizes, modes)
    try:
        _run_blocks(order, args, methods, pipes, info, blocks, skipped, out_of_time, write_json, flops_table)
        if args.flops != "none":
            for model in _count_missing_flops(
                blocks, info, methods, out_of_time if args.flops == "table" else lambda: False
            ):
                skipped.append(f"{model} FLOPs: not in the committed table and no time left to count them")
    except KeyboardInterrupt:  # gpu.sh's timeout sends SIGINT: keep and print what was measured
        done = {(b["model"], b["batch_size"], b["mode"]) for b in blocks}
        skipped.extend(f"{m} batch {bs} {mode}: interrupted" for m, bs, mode in order if (m, bs, mode) not in done)
    total = time.perf_counter() - start
    add_speedups(blocks)
    print()
    print(
        format_table(
            blocks,
            f"{', '.join(models)} on {found['device']}, torch {found['torch']}; Infinity "
            f"{args.size}x{args.size}, HART its one size; {args.repeats} interleaved repeats after "
            f"{args.warmup} warm-up ({args.graph_warmup} with graphs, capture {args.capture}); output_type latent",
        )
    )
    for line in skipped:
        print(f"skipped {line}")
    print(f"total {total:.1f} s")
    write_json()
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
