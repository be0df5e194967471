#!/usr/bin/env bash
# Second round of the demo family, as run once on a lent GPU (NVIDIA H200) and committed
# under checkpoints/demo/ (the first round is scripts/train_demo_family.sh):
#   1. continue training the target from its committed checkpoint (fresh warmup + cosine);
#   2. decode the training and validation inputs greedily with that target
#      (scripts/distill_data.py): sequence-level knowledge distillation data;
#   3. fine-tune both learned drafts from their committed checkpoints on that data, so they
#      learn the target's mode, which is what alpha measures.
# Usage: bash scripts/distill_demo_family.sh [EXPORT_DIR] [BUDGETS: target,draft_m,draft_s s]
# Writes EXPORT_DIR/<model>/checkpoint_<step>/ (bf16) + config.json; logs in runs/distill/.
set -euo pipefail
cd "$(dirname "$0")/.."
EXPORT=${1:-/tmp/export}
IFS=, read -r T_SEC M_SEC S_SEC <<< "${2:-200,110,60}"
DEMO=checkpoints/demo
DATA=${DATA:-data/corpus/npz}  # Env overrides, for a CPU smoke run on a slice.
TARGET_BATCH=${TARGET_BATCH:-512} DRAFT_BATCH=${DRAFT_BATCH:-256} DISTILL_BATCH=${DISTILL_BATCH:-2048}
latest() { ls -d "$1"/checkpoint_* | sort -t_ -k2 -n | tail -1; }

python3 scripts/train.py --model demo_target --data $DATA \
  --workdir runs/distill/demo_target --steps auto --max_seconds "$T_SEC" \
  --batch_size $TARGET_BATCH --learning_rate 6e-4 --warmup_steps 200 --dtype bfloat16 \
  --eval_every 1000 --save_every 100000 --no_progress \
  --init_from "$(latest $DEMO/demo_target)" --final_export "$EXPORT"

python3 scripts/distill_data.py --target "$EXPORT/demo_target" --data $DATA \
  --out data/corpus/distill_npz --batch_size $DISTILL_BATCH --no_progress

python3 scripts/train.py --model demo_draft_m,demo_draft_s --data data/corpus/distill_npz \
  --workdir runs/distill --steps auto --max_seconds "$M_SEC,$S_SEC" \
  --batch_size $DRAFT_BATCH --learning_rate 1e-3,2e-3 --warmup_steps 100 --dtype bfloat16 \
  --eval_every 500 --save_every 100000 --no_progress \
  --init_from "$(latest $DEMO/demo_draft_m),$(latest $DEMO/demo_draft_s)" \
  --final_export "$EXPORT"
