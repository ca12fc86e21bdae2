#!/usr/bin/env bash
# One-GPU runner (no download): Infinity-2B and HART-0.7B with random weights at their real configurations, baseline
# vs every preset at 1024x1024, batch 1 and 4; prints speed-up, TFLOPs and peak memory and writes gpu_results.json.
# Extra arguments go to benchmarks/gpu.py (see its --help). PYTHON picks the interpreter (default: python).
# The whole run is capped at 8 minutes; gpu.py itself stops starting new blocks after --max-seconds (450 s).
set -euo pipefail
cd "$(dirname "$0")/.."
exec timeout 480 "${PYTHON:-python}" benchmarks/gpu.py --json "${GPU_RESULTS:-gpu_results.json}" "$@"
