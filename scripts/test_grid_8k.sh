#!/usr/bin/env bash
# The 8K test grid on SmolLM2-135M-Instruct beyond multi-key: multi-value, single needle, NoLiMa
# and QA at 8,192 tokens (depths 0.25 / 0.5 / 0.75, needle contents 0-5: 18 samples per task),
# for vanilla, the shipped preset (qgpm: the SmolLM2 preset, relevance MiniLM; series 5b41b7 as on the 8K multi-key rows)
# and Top-K (MiniLM, k = 5). Reorder is not run: its chunk separators put an 8K prompt past
# SmolLM2's 8,192-token window, and every call is refused (ContextTooLongError).
#
# These rows choose nothing and change no setting (written 2026-12-06, before the rows). Read:
# right answers per method and task, and each method against vanilla on the same samples
# (wins / losses, two-sided exact McNemar p), with
#   python benchmarks/grid_table.py benchmarks/results/eval_smollm2_test_8k/rows.jsonl --length 8192 \
#     --series vanilla=6cbe99679449,minilm=5b41b7289667,topk=afacc4e2ce2f
# Two processes (shards 0 and 1), one thread each, each folder resumable:
#   bash scripts/test_grid_8k.sh 0 & bash scripts/test_grid_8k.sh 1; wait     (stages main, then topk)
# Rows merge into benchmarks/results/eval_smollm2_test_8k with
#   python benchmarks/merge_runs.py --into benchmarks/results/eval_smollm2_test_8k runs/test8k_tasks/{main,topk}
# Stage oracle (decided 2026-12-06 after the rows above, before its own): the Oracle with the
# shipped preset's settings (no --set), which moves the gold sentences where the preset moves its
# top-ranked ones. Read per task: where the Oracle answers more than the preset, the preset's gap
# (to Top-K) there is its ranking; where it does not, the placement or the model at 8K bounds it.
#   bash scripts/test_grid_8k.sh 0 oracle & bash scripts/test_grid_8k.sh 1 oracle; wait
# Stage heads (decided 2026-12-06 after the oracle rows, before its own): the shipped preset with
# relevance=heads (what a model without a preset ranked with until 2026-12-06), reported per task beside the preset
# (MiniLM) with wins / losses; it chooses nothing.
#   bash scripts/test_grid_8k.sh 0 heads & bash scripts/test_grid_8k.sh 1 heads; wait
# Multi-key at 8K has its vanilla and qgpm rows from the earlier 8K grid (docs/results.md); Top-K
# there, for the five-task comparison (decided 2026-12-06 after these rows, as a baseline row that
# chooses nothing), ran as one process:
#   OMP_NUM_THREADS=1 .venv/bin/python -m qgpm.eval.cli eval --model smollm2 --split test --device cpu --dtype float32 \
#     --max-new-tokens 48 --no-logprob --no-progress --lengths 8192 --depths 0.25,0.5,0.75 --tasks niah_multikey_1 --n 6 \
#     --methods topk --out runs/test8k_tasks/topk_mk
# Stage baselines (decided 2026-12-06, before its rows; they choose nothing): STRING and
# Self-Extend at their defaults on all five tasks at 8K, a task at a time (multi-key, NoLiMa, QA,
# multi-value, single needle) so that a stopped run leaves whole tasks. Ms-PoE is not run: on dev
# at 2K it answers nothing from ratio 1.5 up (docs/results.md, "Ms-PoE on SmolLM2"). Read per task:
# right answers, each against vanilla and against the shipped preset (wins / losses, two-sided
# exact McNemar p), with
#   python benchmarks/grid_table.py benchmarks/results/eval_smollm2_test_8k/rows.jsonl --length 8192 \
#     --series vanilla=6cbe99679449,minilm=5b41b7289667,string=c80442869011,selfext=c254262db28c [--against minilm]
#   bash scripts/test_grid_8k.sh 0 baselines & bash scripts/test_grid_8k.sh 1 baselines; wait
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
i=$1
OUT=${OUT:-runs/test8k_tasks}
PY=${PY:-.venv/bin/python}
E="$PY -m qgpm.eval.cli eval --model smollm2 --split test --device cpu --dtype float32 --max-new-tokens 48 --no-logprob --no-progress --lengths 8192 --depths 0.25,0.5,0.75 --tasks niah_multivalue,niah_single_2,nolima_direct,qa_1 --n 6 --shard $i/2"
shift
mkdir -p "$OUT"
for stage in ${@:-main topk}; do
  case $stage in
    main) $E --methods vanilla,qgpm --out "$OUT/main" > "$OUT/main.s$i.log" 2>&1 ;;
    topk) $E --methods topk --out "$OUT/topk" > "$OUT/topk.s$i.log" 2>&1 ;;
    oracle) $E --methods oracle --out "$OUT/oracle" > "$OUT/oracle.s$i.log" 2>&1 ;;
    heads) $E --methods qgpm --set relevance=heads --out "$OUT/heads" > "$OUT/heads.s$i.log" 2>&1 ;;
    baselines)
      for task in niah_multikey_1 nolima_direct qa_1 niah_multivalue niah_single_2; do
        ${E/--tasks niah_multivalue,niah_single_2,nolima_direct,qa_1/--tasks $task} --methods string,self-extend \
          --out "$OUT/baselines" > "$OUT/baselines_$task.s$i.log" 2>&1
      done ;;
    *) echo "unknown stage $stage (main, topk, oracle, heads, baselines)" >&2; exit 2 ;;
  esac
done
