#!/usr/bin/env bash
# One-GPU runner (no download): Infinity-2B (bf16) and HART-0.7B (fp16) with random weights at their real
# configurations, 1024x1024, batch 1 then 4; eager rows of both models first, then CUDA-graph rows (baseline, LazyVAR,
# the rest while time lasts); baseline vs every preset plus the official-style eager row. Prints the table after every
# block and at the end, and writes gpu_results.json (under $OUT when set, else the repository root) and gpu.log.
#
#   bash benchmarks/gpu.sh                  # on the GPU machine: the whole run, at most 9 minutes
#   bash benchmarks/gpu.sh --dry-run        # on a CPU: the same runner with the tiny models, in seconds (CI runs it)
#   bash benchmarks/gpu.sh --fetch-wheels   # here, once: download the wheels the GPU image lacks into .whl/
#
# The GPU image has python3 with torch but no diffusers (nor importlib_metadata): their wheels travel with the working
# tree in the git-ignored .whl/ folder (device tool: carry [".whl"]) and are installed here into a private folder
# with --no-index --no-deps before the run. Extra arguments go to benchmarks/gpu.py (see its --help). PYTHON picks the
# interpreter (default python3).
#
# Time: gpu.py starts no new block, nor a new row's warm-up, after --max-seconds (default 420 s); at 500 s timeout sends
# SIGINT, on which gpu.py keeps every finished row (also of the block in progress) and prints the table (SIGKILL 20 s
# later if it does not exit). With the wheel install that fits one 9-minute device call.
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
    ARGS=(--models tiny,tiny-hart --device cpu --size 256 --batch-sizes 1,2 --repeats 1 --warmup 0 --graph-warmup 0
          --no-flops)
fi
export PYTHONUNBUFFERED=1
set +e
timeout -s INT -k 20 500 "$PY" benchmarks/gpu.py --json "$OUT_DIR/gpu_results.json" "${ARGS[@]}" "$@" 2>&1 \
    | tee "$OUT_DIR/gpu.log"
status=${PIPESTATUS[0]}
exit "$status"
