#!/usr/bin/env bash
# The measured QGPM evaluation, in three resumable steps (see docs/results.md):
#   1. head calibration (calibration split)   -> $QGPM_HOME/heads/<model>.json
#   2. hyperparameter search (dev split)      -> $OUT/tune/best_config.json
#   3. the test grid with the chosen config   -> $OUT/test/report.md
#
#   scripts/run_eval.sh                        # GPU defaults below
#   STEPS=3 N=20 scripts/run_eval.sh           # only the test grid, more samples (resumes)
#   NPROC=4 scripts/run_eval.sh                # data-parallel over 4 GPUs (accelerate launch)
#
# Every step can be stopped and restarted: finished answers are skipped.
set -euo pipefail

MODEL=${MODEL:-smollm2}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
OUT=${OUT:-runs/$(echo "$MODEL" | tr '/' '_')}
STEPS=${STEPS:-123}
NPROC=${NPROC:-1}
HEADS=${HEADS:-}                       # empty = the stored head set of the model
# dev tuning (step 2)
TUNE_TASKS=${TUNE_TASKS:-niah_multikey_1,nolima_direct,kv_retrieval,qa_1}
TUNE_LENGTHS=${TUNE_LENGTHS:-4096,8192}
TUNE_N=${TUNE_N:-4}
TUNE_TRIALS=${TUNE_TRIALS:-24}
TUNE_OBJECTIVE=${TUNE_OBJECTIVE:-guarded}
# test grid (step 3)
TASKS=${TASKS:-all}
LENGTHS=${LENGTHS:-2048,4096,8192}
DEPTHS=${DEPTHS:-0,0.25,0.5,0.75,1}
N=${N:-10}
METHODS=${METHODS:-vanilla,qgpm,oracle,topk,reorder}
RERANKER=${RERANKER:-minilm}                # the engine default (benchmarks/results/rerank_mrr.md)

QGPM=(python -m qgpm.eval.cli)        # the same subcommands as `qgpm calibrate|tune|eval`
COMMON=(--model "$MODEL" --device "$DEVICE" --dtype "$DTYPE")
HEAD_ARGS=()
[[ -n "$HEADS" ]] && HEAD_ARGS=(--heads "$HEADS")
export TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"

if [[ "$STEPS" == *1* ]]; then
  "${QGPM[@]}" calibrate "${COMMON[@]}" --n 36 --holdout 18 --top 8 --lengths 1024,2048 | tee "$OUT/calibrate.log"
fi

if [[ "$STEPS" == *2* ]]; then
  "${QGPM[@]}" tune "${COMMON[@]}" "${HEAD_ARGS[@]}" --tasks "$TUNE_TASKS" --lengths "$TUNE_LENGTHS" --depths "$DEPTHS" \
    --n "$TUNE_N" --trials "$TUNE_TRIALS" --objective "$TUNE_OBJECTIVE" --out "$OUT/tune"
fi

if [[ "$STEPS" == *3* ]]; then
  CONFIG_ARGS=()
  [[ -f "$OUT/tune/best_config.json" ]] && CONFIG_ARGS=(--config "$OUT/tune/best_config.json")
  EVAL=(-m qgpm.eval.cli eval "${COMMON[@]}" "${HEAD_ARGS[@]}" "${CONFIG_ARGS[@]}" --split test --tasks "$TASKS" \
        --lengths "$LENGTHS" --depths "$DEPTHS" --n "$N" --methods "$METHODS" --reranker "$RERANKER" --out "$OUT/test")
  if [[ "$NPROC" -gt 1 ]]; then
    accelerate launch --multi_gpu --num_processes "$NPROC" --num_machines 1 --mixed_precision no --dynamo_backend no "${EVAL[@]}"
  else
    python "${EVAL[@]}"
  fi
  echo "report: $OUT/test/report.md"
fi
