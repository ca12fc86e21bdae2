"""One-GPU runner: Infinity-2B and HART-0.7B with random weights at their real configurations, 1024x1024, batch 1 and
4, eager and CUDA graphs, the baseline against every preset, with speed-ups from the same run, counted TFLOPs and
peak memory, in ONE table. Nothing is downloaded.

It reuses ``latency.py`` (``build_pipeline`` builds each model from its real config with seeded random weights;
``pipeline_inputs``: random text features of the model's shape) and ``flops.py`` (the FLOPs of one generation counted
on meta tensors, per method). The timed call is the next-scale loop: ``output_type="latent"``, so the text encoder
and the decoder are excluded (they cost the same for every method). Random weights make the token choices
meaningless but keep every shape, so the times and FLOPs are those of the real architectures. Infinity runs in
bfloat16, HART in float16 (the official inference dtypes), both under the pipelines' autocast.

**Blocks.** One block is (model, batch size, mode); its methods are timed interleaved (baseline, A, B, ..., baseline,
...), after warm-up rounds, CUDA-synchronised, with ``torch.cuda.max_memory_allocated`` per call. Modes:

* ``eager``: the pipeline as it is, plus the reference row ``official-style``: the baseline with
  ``pipe.set_sampling("official")`` (``torch.multinomial`` sampling, as the official code) when the pipeline has that
  switch, else the baseline as it samples today (which is ``torch.multinomial``).
* ``graphs``: the same methods after ``pipe.enable_cuda_graphs()`` (each pass captured once per size, batch and plan,
  then replayed; ``--graph-warmup`` rounds capture them). A pipeline without ``enable_cuda_graphs`` gives ``n/a``
  rows. On a CPU, where the call does nothing, the rows run as eager.

Speed-ups are from the same run: ``vs eager`` divides the eager baseline's median of the same (model, batch) by the
row's median, ``vs graphs`` the graph baseline's. Blocks run in order of importance: at batch 1 the eager rows of
Infinity-2B and HART-0.7B, then their graph rows (baseline, LazyVAR, then the other methods), then batch 4; after
``--max-seconds`` (default 420) no new block, and no new row's warm-up, starts (``gpu.sh`` interrupts the run at
500 s), and what was not run is listed. **Every row is guarded**: a row that fails (out of memory, a capture error)
is reported with its error and the others go on; an interrupt keeps the finished rounds of the block in progress.
The table is printed after every block and at the end; the JSON file is rewritten after every block. The ``ran``
column says how a row ran: ``eager``; ``graphs (N replays)`` (direct capture: every timed pass replayed);
``graphs: N captured`` (timed calls that captured passes: not a replay's time); ``graphs: N skips`` (``torch.compile``
route: passes CUDA-graph trees ran without replay); ``graphs`` (compiled, no skip counted); or ``eager (no CUDA)``.

Usage (an estimated 4-7 minutes on one H200; the graph capture time depends on ``enable_cuda_graphs``)::

    bash benchmarks/gpu.sh                         # = python3 benchmarks/gpu.py --json $OUT/gpu_results.json
    bash benchmarks/gpu.sh --dry-run               # the tiny models on the CPU (CI)
    python3 benchmarks/gpu.py --models infinity-2b --batch-sizes 1 --methods baseline,lazyvar --modes eager
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.latency import build_pipeline, pipeline_inputs
from diffusers_var_accel.pipelines.compiled_passes import cudagraph_skips
from diffusers_var_accel.schedulers.registry import default_method_specs
from diffusers_var_accel.schedulers.specs import load_acceleration, split_acceleration_specs

DEFAULT_MODELS = ("infinity-2b", "hart-0.7b")
DEFAULT_METHODS = ",".join(default_method_specs())
MODES = ("eager", "graphs")
#: Weights dtype per model family, as the official inference (Infinity bf16, HART fp16).
FAMILY_DTYPES = {"infinity": torch.bfloat16, "hart": torch.float16}
#: The label of the eager reference row (the baseline sampling with torch.multinomial, as the official code).
OFFICIAL_ROW = "official-style"


def count_tflops_per_image(
    model: str, family: str, methods: List[str], height: int, width: int
) -> Dict[str, Optional[float]]:
    """TFLOPs of one image per method (``flops.py`` on meta tensors, CFG on); ``None`` for models it does not know."""
    from benchmarks import flops

    out: Dict[str, Optional[float]] = {}
    for method in methods:
        accel = None if method == "baseline" else method
        if family == "infinity" and model in flops.MODEL_SPECS:
            out[method] = flops.count_infinity_flops(model, height, width, accel=accel)["total_tflops"]
        elif family == "hart" and model in flops.HART_TOKENIZER_CONFIGS:
            out[method] = flops.count_hart_flops(model, accel=accel)["total_tflops"]
        else:
            out[method] = None
    return out


def block_order(models: List[str], batch_sizes: List[int], modes: List[str]) -> List[Tuple[str, int, str]]:
    """``(model, batch, mode)`` in order of importance: at the first batch size the eager rows of every model, then
    their graph rows; then the next batch size."""
    return [(model, batch, mode) for batch in batch_sizes for mode in modes for model in models]


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
) -> List[Dict[str, Any]]:
    """Time ``rows`` (``{"method", "label", "sampling"}``) interleaved; one record per row.

    Each row is warmed up ``warmup`` times before the timed rounds; a row whose warm-up would start after the time
    budget is skipped (``"skipped"`` set, no times).
    """
    family = pipe.model_family
    schedulers = {r["method"]: load_acceleration(r["method"], family) for r in rows}
    inputs = pipeline_inputs(pipe, batch, height, width, device)
    pipe.set_progress_bar_config(disable=True)

    def run(row: Dict[str, Any]) -> Tuple[float, Optional[str]]:
        # the sampling RNG lives on the timed device, as in the official code
        generators = [torch.Generator(device).manual_seed(i) for i in range(batch)]
        restore, sampled_with = _sampling_switch(pipe, row.get("sampling"))
        try:
            _sync(device)
            start = time.perf_counter()
            pipe(**inputs, generator=generators, acceleration=schedulers[row["method"]], output_type="latent")
            _sync(device)
            return time.perf_counter() - start, sampled_with
        finally:
            restore()

    active, skipped, failed = [], [], {}
    times: Dict[str, List[float]] = {r["label"]: [] for r in rows}
    peak: Dict[str, Optional[float]] = {r["label"]: None for r in rows}
    skips: Dict[str, int] = {r["label"]: 0 for r in rows}
    sampled: Dict[str, Optional[str]] = {}
    interrupted = False

    captures: Dict[str, List[int]] = {r["label"]: [0, 0] for r in rows}  # passes (captured, replayed), timed calls

    def guarded(row: Dict[str, Any], timed: bool = False) -> Optional[Tuple[float, Optional[str]]]:
        """One call of ``row``; a failure marks the row failed (the others go on), and the CUDA-graph skips
        counted during the call are added to the row's (and, for a timed call, the passes captured / replayed)."""
        before = cudagraph_skips()
        graphs = getattr(pipe, "pass_graphs", None)
        counts = (graphs.captured_passes, graphs.replayed_passes) if graphs is not None else None
        try:
            result = run(row)
            if timed and counts is not None:
                captures[row["label"]][0] += graphs.captured_passes - counts[0]
                captures[row["label"]][1] += graphs.replayed_passes - counts[1]
            return result
        except Exception as err:  # noqa: BLE001 - an OOM or a capture error must not lose the other rows
            failed[row["label"]] = (
                f"failed: {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
            )
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            return None
        finally:
            skips[row["label"]] += cudagraph_skips() - before

    try:
        for row in rows:
            if out_of_time():
                skipped.append(row)
                continue
            if all(guarded(row) is not None for _ in range(warmup)):
                active.append(row)
        for _ in range(repeats):
            for row in active:
                if row["label"] in failed:
                    continue
                if device.startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats()
                result = guarded(row, timed=True)
                if result is None:
                    continue
                seconds, sampled[row["label"]] = result
                times[row["label"]].append(seconds)
                if device.startswith("cuda"):
                    peak[row["label"]] = max(peak[row["label"]] or 0.0, torch.cuda.max_memory_allocated() / 2**30)
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
        records.append(
            {
                **row,
                "min_s": min(t),
                "median_s": statistics.median(t),
                "max_s": max(t),
                "peak_gib": peak[row["label"]],
                "repeats": len(t),
                "sampled_with": sampled.get(row["label"]),
                "cudagraph_skips": skips[row["label"]],
                "passes_captured": captures[row["label"]][0],
                "passes_replayed": captures[row["label"]][1],
                **({"note": failed[row["label"]]} if row["label"] in failed else {}),
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


def how_it_ran(block: Dict[str, Any], record: Dict[str, Any]) -> str:
    """``eager``, ``graphs`` (replayed, no skip counted), ``graphs: N skips`` or why it ran eager."""
    if record.get("median_s") is None:
        return "-"
    if block["mode"] == "eager":
        return "eager"
    if record.get("note", "").startswith("no CUDA"):
        return "eager (no CUDA)"
    skips = record.get("cudagraph_skips") or 0
    if skips:
        return f"graphs: {skips} skips"
    captured, replayed = record.get("passes_captured") or 0, record.get("passes_replayed") or 0
    if captured:  # a timed call captured passes: its time is not a replay's
        return f"graphs: {captured} captured"
    return f"graphs ({replayed} replays)" if replayed else "graphs"


def add_speedups(blocks: List[Dict[str, Any]]) -> None:
    """Set ``speedup_vs_eager`` / ``speedup_vs_graphs`` of every record from the baselines of the same (model, batch)."""
    base: Dict[Tuple[str, int, str], float] = {}
    for b in blocks:
        for r in b["records"]:
            if r["label"] == "baseline" and r.get("median_s"):
                base[(b["model"], b["batch_size"], b["mode"])] = r["median_s"]
    for b in blocks:
        for r in b["records"]:
            for mode in MODES:
                ref = base.get((b["model"], b["batch_size"], mode))
                r[f"speedup_vs_{mode}"] = ref / r["median_s"] if ref and r.get("median_s") else None


def format_table(blocks: List[Dict[str, Any]], header: str) -> str:
    """The one table: a row per (model, batch, mode, method)."""

    def cell(value, fmt, width):
        return f"{'n/a' if value is None else format(value, fmt):>{width}}"

    lines = [
        header,
        f"{'model':<12} {'batch':>5} {'mode':<7} {'method':<16} {'median s':>9} {'s/image':>9} {'vs eager':>9} "
        f"{'vs graphs':>9} {'TFLOPs':>8} {'FLOPs x':>8} {'peak GiB':>9} {'ran':<16} note",
    ]
    for b in blocks:
        tflops = b["tflops_per_image"]
        base_tflops = tflops.get("baseline")
        for r in b["records"]:
            t = tflops.get(r["method"])
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
                f"{cell(r.get('peak_gib'), '.2f', 9)} {how_it_ran(b, r):<16} {note}".rstrip()
            )
    return "\n".join(lines)


def _graphs_switch(pipe, enable: bool) -> Tuple[Optional[str], Optional[str]]:
    """``pipe.enable_cuda_graphs()`` / ``disable_cuda_graphs()``; returns (why the rows are n/a, a note for rows
    that run anyway: graphs are off without CUDA); ``(None, None)``: graphs on."""
    if not hasattr(pipe, "enable_cuda_graphs"):
        return "n/a: the pipeline has no enable_cuda_graphs()", None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # on a CPU it says that it does nothing; the rows then run as eager
        if enable:
            if pipe.enable_cuda_graphs() is False:
                return None, "no CUDA: graphs off, ran eager"
        elif hasattr(pipe, "disable_cuda_graphs"):
            pipe.disable_cuda_graphs()
    return None, None


def _run_blocks(order, args, methods, pipes, info, blocks, skipped, out_of_time, write_json) -> int:
    """Run the ``(model, batch, mode)`` blocks of ``order`` in turn, appending to ``blocks`` / ``skipped``; 2 for a bad
    model or method (one ``error:`` line), else 0."""
    for model, batch, mode in order:
        if out_of_time():
            skipped.append(f"{model} batch {batch} {mode}: time budget spent")
            continue
        if model not in pipes:
            built = time.perf_counter()
            try:
                pipe = build_pipeline(model, args.device, torch.float32)
                family = pipe.model_family
                dtype = (
                    FAMILY_DTYPES[family]
                    if args.dtype == "auto" and args.device.startswith("cuda")
                    else (torch.float32 if args.dtype == "auto" else getattr(torch, args.dtype))
                )
                if dtype != torch.float32:
                    pipe = pipe.to(dtype=dtype)
                for m in methods:
                    load_acceleration(m, family)  # a bad spec fails before anything is timed
            except ValueError as err:
                print(f"error: {err}", file=sys.stderr)
                return 2
            height = width = pipe.default_size if family == "hart" else args.size
            pipes[model] = pipe
            info[model] = {
                "family": family,
                "dtype": str(dtype).replace("torch.", ""),
                "height": height,
                "width": width,
                "tflops": {m: None for m in methods}
                if args.no_flops
                else count_tflops_per_image(model, family, methods, height, width),
            }
            print(
                f"built {model} ({family}, {sum(p.numel() for p in pipe.transformer.parameters()) / 1e6:.0f}M transformer "
                f"parameters, {info[model]['dtype']}) in {time.perf_counter() - built:.1f} s",
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
        unavailable, graphs_note = _graphs_switch(pipe, True) if mode == "graphs" else (None, None)
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
                )
            except BlockInterrupted as stop:
                records, interrupted = stop.records, stop
            finally:
                if mode == "graphs":
                    _graphs_switch(pipe, False)
            if graphs_note:
                records = [{**r, "note": "; ".join(filter(None, [graphs_note, r.get("note")]))} for r in records]
            if interrupted is not None:
                blocks.append({**block, "records": records, "interrupted": True})
                add_speedups(blocks)
                write_json()
                raise interrupted
        blocks.append({**block, "records": records})
        add_speedups(blocks)
        done = [f"{r['label']} {r['median_s']:.4f} s" for r in records if r.get("median_s") is not None]
        print(f"{model} batch {batch} {mode}: {', '.join(done) or records[0].get('skipped')}", flush=True)
        print(format_table(blocks, "so far:"), flush=True)
        write_json()
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help="comma-separated latency.py models (default infinity-2b,hart-0.7b; tiny, tiny-hart for a smoke run)",
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
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="default: cuda if available, else cpu (only the tiny models are practical on a CPU)",
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
        default=420.0,
        help="start no new block, nor a new method's warm-up, after this many seconds (default 420)",
    )
    parser.add_argument("--no-flops", action="store_true", help="skip the FLOP counts")
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
    start = time.perf_counter()
    out_of_time = lambda: time.perf_counter() - start > args.max_seconds  # noqa: E731
    device_name = (
        torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU ({torch.get_num_threads()} threads)"
    )
    print(
        f"GPU runner on {device_name}, torch {torch.__version__}: random weights, real configurations, no download",
        flush=True,
    )
    pipes: Dict[str, Any] = {}
    info: Dict[str, Dict[str, Any]] = {}
    blocks: List[Dict[str, Any]] = []
    skipped: List[str] = []

    def write_json() -> None:
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "device": device_name,
                        "torch": torch.__version__,
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
        code = _run_blocks(order, args, methods, pipes, info, blocks, skipped, out_of_time, write_json)
    except KeyboardInterrupt:  # gpu.sh's timeout sends SIGINT: keep and print what was measured
        done = {(b["model"], b["batch_size"], b["mode"]) for b in blocks}
        skipped.extend(f"{m} batch {bs} {mode}: interrupted" for m, bs, mode in order if (m, bs, mode) not in done)
        code = 0
    if code:
        return code
    total = time.perf_counter() - start
    add_speedups(blocks)
    print()
    print(
        format_table(
            blocks,
            f"{', '.join(models)} on {device_name}, torch {torch.__version__}; Infinity "
            f"{args.size}x{args.size}, HART its one size; {args.repeats} interleaved repeats after "
            f"{args.warmup} warm-up ({args.graph_warmup} with graphs); output_type latent",
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
