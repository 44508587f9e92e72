#!/usr/bin/env bash
# Why Reorder leads QGPM on the 4K test grid's NoLiMa direct-question task, nolima_direct (contents 0-5: Reorder 9 of
# 30, the shipped preset 4; contents 0-11: Reorder 12 of 60, the heads 10, 8 / 10 discordant).
# What the committed test answers show (docs/tuning/nolima.md): every relevance source ranks the
# needle first and the query-term filter moves it alone, right before the question; Reorder also
# puts its best chunk right before the question (qgpm.editing.reorder_edit), so the placement is
# the same. What differs is the unit: Reorder moves a 128-token chunk (the needle with the text
# around it) and sorts every other chunk by relevance; QGPM moves one sentence. QGPM's answer is
# nearly the same at every depth of a needle content (the moved needle sits in the same place),
# so the test grid's 60 samples are 12 contents answered 5 times each.
#
# Stage dev (dev split, 4K, contents 0-11 x depths 0/0.25/0.5/0.75/1 = 60 samples): vanilla, the
# shipped preset, Reorder, and the preset with lead_tokens=128 (each moved sentence takes along
# the sentences just before it, up to Reorder's chunk length). Rules, written before the rows
# (2026-12-05):
#   R1 (sample size). If the preset is right on dev at least as often as Reorder, the test gap is
#      not taken as a property of the method on this task; no NoLiMa-specific change is made.
#   R2 (the unit). If lead_tokens=128 is right on dev NoLiMa more often than the preset with
#      wins - losses >= 3 (paired), leads become a candidate for calls that move one sentence
#      only (lead_tokens=128 on every call lost dev multi-value, 1 of 9 all-four against 4), to
#      be checked on dev single needle and multi-key before any test row. Otherwise no change.
# Stage test (test split, 4K, contents 6-11): the shipped preset and the Oracle (the settings of
# its earlier test rows, series cf83ac), so both have NoLiMa on 60 samples as vanilla, the heads,
# Reorder and Top-K do. These rows choose nothing.
# Two processes (shards 0 and 1), one thread each, each folder resumable:
#   bash scripts/nolima_cause.sh dev 0 & bash scripts/nolima_cause.sh dev 1; wait
# Rows merge with python benchmarks/merge_runs.py (dev rows into
# benchmarks/results/tune_smollm2_dev_4k/nolima_cause, test rows into eval_smollm2_test).
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
stage=$1 i=$2
OUT=${OUT:-runs/nolima_cause}
PY=${PY:-.venv/bin/python}
E="$PY -m qgpm.eval.cli eval --model smollm2 --device cpu --dtype float32 --max-new-tokens 48 --no-logprob --no-progress --lengths 4096 --depths 0,0.25,0.5,0.75,1 --tasks nolima_direct --n 12 --shard $i/2"
mkdir -p "$OUT"
if [ "$stage" = dev ]; then
  $E --split dev --methods vanilla,qgpm,reorder --out "$OUT/dev_main" > "$OUT/dev_main.s$i.log" 2>&1
  $E --split dev --methods qgpm --set lead_tokens=128 --out "$OUT/dev_lead128" > "$OUT/dev_lead128.s$i.log" 2>&1
elif [ "$stage" = test ]; then
  T="$E --split test --only benchmarks/results/ids_nolima_test_6_11.jsonl"
  $T --methods qgpm --out "$OUT/test_preset" > "$OUT/test_preset.s$i.log" 2>&1
  $T --methods oracle --set relevance=heads --set split_layer=none --set term_ratio=none --set split_run_ons=false --set decisive_margin=1.3 --set pass1_dtype=none --out "$OUT/test_oracle" > "$OUT/test_oracle.s$i.log" 2>&1
else
  echo "usage: $0 dev|test SHARD" >&2; exit 2
fi
