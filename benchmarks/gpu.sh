#!/usr/bin/env bash
# One-GPU runner (no download): Infinity-2B (bf16) and HART-0.7B (fp16) with random weights at their real
# configurations, 1024x1024, batch 1 and 4, eager and CUDA graphs, baseline vs every preset plus the official-style
# eager row; prints ONE table (speed-ups from the same run, TFLOPs, peak memory) and writes gpu_results.json.
# Extra arguments go to benchmarks/gpu.py (see its --help). PYTHON picks the interpreter (default: python).
# The whole run is capped at 8 minutes: gpu.py starts no new block after --max-seconds (420 s); at 480 s timeout sends
# SIGINT, on which gpu.py stops and prints the table of what it measured (SIGKILL 20 s later if it does not exit).
set -euo pipefail
cd "$(dirname "$0")/.."
exec timeout -s INT -k 20 480 "${PYTHON:-python}" benchmarks/gpu.py --json "${GPU_RESULTS:-gpu_results.json}" "$@"
