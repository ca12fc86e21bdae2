#!/usr/bin/env bash
# One-GPU runner (no download): Infinity-2B (bf16) and HART-0.7B (fp16) with random weights at their real
# configurations, 1024x1024, batch 1 then 4; eager rows of both models first, then CUDA-graph rows (baseline, LazyVAR,
# the rest while time lasts); baseline vs every preset plus the official-style eager row. Prints the table after every
# block and at the end, and writes gpu_results.json (under $OUT when set, else the repository root) and gpu.log.
#
#   bash benchmarks/gpu.sh                  # on the GPU machine: the whole run, at most 7 minutes (below)
#   bash benchmarks/gpu.sh --dry-run        # on a CPU: the same runner on the real schedules at a tiny width, trace
#                                           # capture for the graph rows (CI runs it)
#   bash benchmarks/gpu.sh --fetch-wheels   # here, once: download the wheels the GPU image lacks into .whl/
#
# The GPU image has python3 (3.12) with torch (2.11) but no diffusers (nor importlib_metadata): their wheels travel with
# the working tree in the git-ignored .whl/ folder (device tool: carry [".whl"]) and are installed here into a private
# folder with --no-index --no-deps before the run. Extra arguments go to the runner, diffusers_var_accel/lab/bench/gpu.py (see its --help). PYTHON
# picks the interpreter (default python3). FLOPs are read from benchmarks/results/gpu_flops.json (counted on a CPU).
#
# Time, for one 9-minute device call with 2 minutes to spare (estimated for an H100 from a third-party record of
# Infinity-2B, 0.97 s eager per image with decode, and the launch model of docs/design notes; every figure is a guess
# until the first run replaces it):
#   start: wheel install 10 s + python and torch 10 s + building both models on the GPU 15 s           =  35 s
#   a block times every row after warm-up; eager: 7 rows x (1 warm-up + 3 timed); graphs: 6 rows x (2 warm-up, the
#   first a capture, + 3 timed + a fresh-input check under graphs and eagerly):
#     batch 1  Infinity eager 15 s, HART eager 11 s, Infinity graphs 24 s, HART graphs 19 s                =  69 s
#     batch 4  Infinity eager 29 s, HART eager 18 s, Infinity graphs 62 s, HART graphs 41 s                = 150 s
#   estimated total                                                                                       = 254 s
# Bounds: gpu.py starts no block after 300 s (--max-seconds), this script interrupts it at 390 s (SIGINT: it keeps the
# finished rounds, prints the table, writes the JSON and exits 0) and kills it 15 s later: at most 10 + 390 + 15 =
# 415 s, under 7 minutes (at 1.6x the estimate every block still starts before 300 s). Exit status: gpu.py's (0 after
# a clean interrupt), not timeout's 124. GPU_SH_DEADLINE (seconds, default 390) moves the interrupt (the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
WHEELS=("diffusers==0.42.1" "importlib_metadata==8.7.0")  # zipp, its one need, is on the image

if [[ "${1:-}" == "--fetch-wheels" ]]; then
    mkdir -p .whl
    for spec in "${WHEELS[@]}"; do
        "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl "$spec"
    done
    ls .whl
    exit 0
fi

OUT_DIR="${OUT:-.}"
mkdir -p "$OUT_DIR"
if ! "$PY" -c "import diffusers" 2>/dev/null; then
    if ! compgen -G ".whl/*.whl" >/dev/null; then
        echo "error: $PY has no diffusers and .whl/ holds no wheels: run 'bash benchmarks/gpu.sh --fetch-wheels' where pip" \
             "reaches PyPI, and carry .whl" >&2
        exit 2
    fi
    SITE="$(mktemp -d)"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi

ARGS=()
if [[ "${1:-}" == "--dry-run" ]]; then
    shift
    # the tiny models on the CPU, every block and row kind, one timed round: checks the runner, measures nothing
    # the real 13-scale (Infinity 1024x1024) and 14-scale (HART) schedules with the tiny models (width 32, depth 2) on
    # the CPU, graph rows through the trace stand-in: checks the runner and the capture path (every graph row replays,
    # its fresh-input check holds), measures nothing
    ARGS=(--models tiny,tiny-hart --size 1024 --device cpu --capture trace --batch-sizes 1 --repeats 1 --warmup 0
          --graph-warmup 1 --flops none)
fi
export PYTHONUNBUFFERED=1
set +e
# --preserve-status: gpu.py's own status (0 after the interrupt it handles), 137 if it had to be killed
timeout --preserve-status -s INT -k 15 "${GPU_SH_DEADLINE:-390}" "$PY" -m diffusers_var_accel.lab.bench.gpu --json "$OUT_DIR/gpu_results.json" "${ARGS[@]}" \
    "$@" 2>&1 | tee "$OUT_DIR/gpu.log"
status=${PIPESTATUS[0]}
exit "$status"
