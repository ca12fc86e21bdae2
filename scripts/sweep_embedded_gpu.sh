#!/usr/bin/env bash
# The sweep that chose the embedded model's training settings (docs/embedded.md): short runs of
# scripts/train_embedded.py in parallel on one GPU, each with the step counts a 2-core CPU affords in about an hour
# (or more, to see what more compute would buy). Every run prints its VAE's scorer accuracy on decoded ground truth
# and, for full runs, the validation accuracy (heldout_prompts(120, seed=1), never the held-out set).
#   OUT=sweep_logs bash scripts/sweep_embedded_gpu.sh
set -u
OUT=${OUT:-sweep_logs}
mkdir -p "$OUT"
DEV=${DEVICE:-cuda}
COMMON="--device $DEV --num-images 20000 --codebook-dim 16 --vae-lr 2e-3 --log-every 250 --time-limit-minutes 0"
EVAL="--eval-prompts 120 --eval-settings 3:1:0,3:0.5:0,5:0.7:0,2:0.3:0"
VAE_A="--vae-base-ch 32 --vae-ch-mult 1,2,2 --vae-steps 2000 --vae-edge-weight 1"
run() {  # name, threads, flags...
  local name=$1 threads=$2; shift 2
  timeout ${RUN_TIMEOUT:-500} python scripts/train_embedded.py $COMMON --threads "$threads" --output "/tmp/sweep_$name" "$@" \
    > "$OUT/$name.log" 2>&1 &
}
if [ "${PHASE:-1}" = 1 ]; then
# Phase 1. Tokenizer only: size, steps, edge loss and bits per token.
run v_32_122_e0 1 --vae-only --vae-base-ch 32 --vae-ch-mult 1,2,2 --vae-steps 2000
run v_32_122_e1 1 --vae-only $VAE_A
run v_48_112_e1 1 --vae-only --vae-base-ch 48 --vae-ch-mult 1,1,2 --vae-steps 1500 --vae-edge-weight 1
run v_32_122_e1_4k 1 --vae-only --vae-base-ch 32 --vae-ch-mult 1,2,2 --vae-steps 4000 --vae-edge-weight 1
run v_32_124_e1 1 --vae-only --vae-base-ch 32 --vae-ch-mult 1,2,4 --vae-steps 1500 --vae-edge-weight 1
run v_32_122_e1_d12 1 --vae-only $VAE_A --codebook-dim 12
# Full runs on tokenizer A: self-correction, depth, steps.
run t_6x128_1600_f0 2 $VAE_A --depth 6 --embed-dim 128 --steps 1600 $EVAL
run t_6x128_1600_f2 2 $VAE_A --depth 6 --embed-dim 128 --steps 1600 --bit-flip 0.2 $EVAL
run t_4x128_2400_f2 2 $VAE_A --depth 4 --embed-dim 128 --steps 2400 --bit-flip 0.2 $EVAL
run t_6x128_4000_f2 2 $VAE_A --depth 6 --embed-dim 128 --steps 4000 --bit-flip 0.2 $EVAL
wait
else
# Phase 2. The chosen tokenizer (base 48, multipliers 1,1,2, edge loss, 1500 steps), trained once, then transformers.
VAE_B="--vae-base-ch 48 --vae-ch-mult 1,1,2 --vae-steps 1500 --vae-edge-weight 1"
python scripts/train_embedded.py $COMMON $VAE_B --threads 4 --vae-only --output /tmp/sweep_vae_b > "$OUT/v_48_112_e1.log" 2>&1
EVAL="--eval-prompts 60 --eval-settings 3:0.5:0"
run t_6x128_1800_f0 2 --vae-path /tmp/sweep_vae_b/vae --steps 1800 $EVAL
run t_6x128_1800_f1 2 --vae-path /tmp/sweep_vae_b/vae --steps 1800 --bit-flip 0.1 $EVAL
run t_6x128_1800_f0_lr1 2 --vae-path /tmp/sweep_vae_b/vae --steps 1800 --lr 1e-3 $EVAL
wait
fi
for f in "$OUT"/*.log; do echo "== $f"; grep "scorer accuracy\|validation accuracy\|PSNR\|Traceback\|Error" "$f"; tail -2 "$f"; done
