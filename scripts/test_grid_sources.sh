#!/usr/bin/env bash
# The shipped SmolLM2 preset with its sentence relevance from a reranker instead of the heads
# (QGPMConfig.relevance): MiniLM, BM25, and the heads fused with BM25, on the test grids the
# README reports (2K: five tasks x 3 contents x 5 depths, 75 samples; 4K: multi-key and
# multi-value needle contents 0-11, single needle, NoLiMa and QA contents 0-5, depths 0-1,
# 210 samples). The heads' own rows are the preset's series (921a8e) already in
# benchmarks/results/eval_smollm2_test. Order: every source at 2K, then MiniLM and BM25 at 4K,
# then the fused source at 4K. Two processes (shards 0 and 1), one thread each, each folder resumable:
#   bash scripts/test_grid_sources.sh 0 & bash scripts/test_grid_sources.sh 1; wait
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
i=$1
OUT=${OUT:-runs/test_sources}
PY=${PY:-.venv/bin/python}
E="$PY -m qgpm.eval.cli eval --model smollm2 --split test --device cpu --dtype float32 --max-new-tokens 48 --no-logprob --no-progress --methods qgpm --shard $i/2"
D="--depths 0,0.25,0.5,0.75,1"
mkdir -p "$OUT"
run() {  # run SOURCE STAGE ARGS...: one stage of one source into its own folder
  local src=$1 stage=$2; shift 2
  local o="$OUT/$(echo "$src" | tr '+' '_')"
  $E --set relevance=$src "$@" --out "$o/$stage" > "$o.$stage.s$i.log" 2>&1
}
for src in minilm bm25 heads+bm25; do
  run $src 2k --lengths 2048 $D --tasks niah_single_2,niah_multikey_1,niah_multivalue,nolima_direct,qa_1 --n 3
done
for src in minilm bm25 heads+bm25; do
  run $src 4k_mk_mv --lengths 4096 $D --tasks niah_multikey_1,niah_multivalue --n 12
  run $src 4k_guards --lengths 4096 $D --tasks niah_single_2,nolima_direct,qa_1 --n 6
done
