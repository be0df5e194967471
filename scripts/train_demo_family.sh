#!/usr/bin/env bash
# Trains the demo family (target + two drafts) in one go, as done once on a lent GPU
# (NVIDIA H200) and committed under checkpoints/demo/. Usage:
#   bash scripts/train_demo_family.sh [OUT_DIR] [BUDGETS]   # e.g. /tmp/export 300,110,70
# Writes OUT_DIR/<model>/checkpoint_<step>/ (T5X native, bf16) + config.json, and the
# training logs under runs/demo/<model>/log.jsonl. Resumes if runs/demo exists.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-checkpoints/demo}
BUDGETS=${2:-300,110,70}
python3 scripts/train.py --model demo_target,demo_draft_m,demo_draft_s \
  --data data/corpus/npz --workdir runs/demo --steps auto --max_seconds "$BUDGETS" \
  --batch_size 256 --learning_rate 2e-3,3e-3,5e-3 --dtype bfloat16 --warmup_steps 300 \
  --eval_every 400 --save_every 100000 --no_progress --final_export "$OUT" \
  --vocab data/vocab/demo_spm.model
