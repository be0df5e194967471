#!/usr/bin/env bash
# Trains the demo family (target + two drafts), as done on a lent GPU (NVIDIA H200) and
# committed under checkpoints/demo/, in two rounds:
#   bash scripts/demo_family.sh train [OUT_DIR] [BUDGETS]     # e.g. /tmp/export 300,110,70
#   bash scripts/demo_family.sh distill [EXPORT_DIR] [SECONDS: target,seqkd_m,seqkd_s,
#                                        tokkd_m,tokkd_s]     # e.g. /tmp/export 190,100,55
# train (round 1): all three from scratch; writes OUT_DIR/<model>/checkpoint_<step>/ (T5X
# native, bf16) + config.json, and the training logs under runs/demo/<model>/log.jsonl.
# Resumes if runs/demo exists.
# distill (round 2), in stages:
#   target: continue training the target from its checkpoint (fresh warmup + cosine);
#   data:   decode the training and validation inputs greedily with that target
#           (scripts/build_data.py distill): sequence-level knowledge distillation data;
#   seqkd:  fine-tune both learned drafts on that data (they learn the target's mode);
#   tokkd:  fine-tune them further on it with token-level KD (0.5 CE + 0.5 KL(p || q) from
#           the target's logits), so q matches p beyond the argmax (alpha at temperature 1).
# Each stage starts from EXPORT_DIR's model when the stage before wrote it there, else from
# checkpoints/demo. STAGES=data,tokkd runs a subset. Writes EXPORT_DIR/<model>/
# checkpoint_<step>/ (bf16) + config.json; logs in runs/distill*/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUND=${1:-}
shift || true

if [ "$ROUND" = train ]; then
  OUT=${1:-checkpoints/demo}
  BUDGETS=${2:-300,110,70}
  python3 scripts/train.py --model demo_target,demo_draft_m,demo_draft_s \
    --data data/corpus/npz --workdir runs/demo --steps auto --max_seconds "$BUDGETS" \
    --batch_size 256 --learning_rate 2e-3,3e-3,5e-3 --dtype bfloat16 --warmup_steps 300 \
    --eval_every 400 --save_every 100000 --no_progress --final_export "$OUT" \
    --vocab data/vocab/demo_spm.model
  exit 0
fi
if [ "$ROUND" != distill ]; then
  echo "usage: bash scripts/demo_family.sh train|distill [DIR] [BUDGETS]" >&2
  exit 2
fi

EXPORT=${1:-/tmp/export}
IFS=, read -r T_SEC M_SEC S_SEC KM_SEC KS_SEC <<< "${2:-190,100,55,190,45}"
STAGES=${STAGES:-target,data,seqkd,tokkd}
DATA=${DATA:-data/corpus/npz}  # Env overrides, for a CPU smoke run on a slice.
TARGET_BATCH=${TARGET_BATCH:-512} DRAFT_BATCH=${DRAFT_BATCH:-256} DISTILL_BATCH=${DISTILL_BATCH:-2048}
# The export's model when an earlier stage wrote it, else the committed one; its highest
# complete checkpoint_<step> is what --init_from / --teacher / --target load.
model_dir() { [ -d "$EXPORT/$1" ] && echo "$EXPORT/$1" || echo "checkpoints/demo/$1"; }
has() { [[ ",$STAGES," == *",$1,"* ]]; }

if has target; then
  python3 scripts/train.py --model demo_target --data $DATA \
    --workdir runs/distill/demo_target --steps auto --max_seconds "$T_SEC" \
    --batch_size $TARGET_BATCH --learning_rate 6e-4 --warmup_steps 200 --dtype bfloat16 \
    --eval_every 1000 --save_every 100000 --no_progress \
    --init_from "$(model_dir demo_target)" --final_export "$EXPORT" \
    --vocab data/vocab/demo_spm.model
fi
if has data; then
  python3 scripts/build_data.py distill --target "$(model_dir demo_target)" --data $DATA \
    --out data/corpus/distill_npz --batch_size $DISTILL_BATCH --no_progress
fi
if has seqkd; then
  python3 scripts/train.py --model demo_draft_m,demo_draft_s --data data/corpus/distill_npz \
    --workdir runs/distill --steps auto --max_seconds "$M_SEC,$S_SEC" \
    --batch_size $DRAFT_BATCH --learning_rate 1e-3,2e-3 --warmup_steps 100 --dtype bfloat16 \
    --eval_every 500 --save_every 100000 --no_progress \
    --init_from "$(model_dir demo_draft_m),$(model_dir demo_draft_s)" --final_export "$EXPORT" \
    --vocab data/vocab/demo_spm.model
fi
if has tokkd; then
  python3 scripts/train.py --model demo_draft_m,demo_draft_s --data data/corpus/distill_npz \
    --workdir runs/distill_kd --steps auto --max_seconds "$KM_SEC,$KS_SEC" \
    --batch_size $DRAFT_BATCH --learning_rate 5e-4,1e-3 --warmup_steps 100 --dtype bfloat16 \
    --eval_every 500 --save_every 100000 --no_progress \
    --teacher "$(model_dir demo_target)" --kd_weight 0.5 \
    --init_from "$(model_dir demo_draft_m),$(model_dir demo_draft_s)" --final_export "$EXPORT" \
    --vocab data/vocab/demo_spm.model
fi
