#!/usr/bin/env bash
# NoLiMa (nolima_direct) on the 4K test grid with needle contents 6-11 added to contents 0-5
# (n = 60 per method: 12 contents x 5 depths), for the methods the README compares: vanilla,
# the shipped preset (qgpm), Reorder, Top-K (MiniLM, k = 5) and the Oracle (the reorder remap
# without the split / term filter / run-on settings, as its earlier test rows, series cf83ac; decisive_margin
# and pass1_dtype do not act on the Oracle but are part of that series's fingerprint).
# Two processes (shards 0 and 1), one thread each, each folder resumable:
#   bash scripts/test_grid_nolima12.sh 0 & bash scripts/test_grid_nolima12.sh 1; wait
# Rows merge into benchmarks/results/eval_smollm2_test with
#   python benchmarks/merge_runs.py --into benchmarks/results/eval_smollm2_test runs/test4k_nolima12/{main,oracle12,topk}
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
i=$1
OUT=${OUT:-runs/test4k_nolima12}
PY=${PY:-.venv/bin/python}
E="$PY -m qgpm.eval.cli eval --model smollm2 --split test --device cpu --dtype float32 --max-new-tokens 48 --no-logprob --no-progress --lengths 4096 --depths 0,0.25,0.5,0.75,1 --tasks nolima_direct --n 12 --only benchmarks/results/ids_nolima_test_6_11.jsonl --shard $i/2"
mkdir -p "$OUT"
$E --methods vanilla,qgpm,reorder --out "$OUT/main" > "$OUT/main.s$i.log" 2>&1
$E --methods oracle --set split_layer=none --set term_ratio=none --set split_run_ons=false --set decisive_margin=1.3 --set pass1_dtype=none --out "$OUT/oracle12" > "$OUT/oracle.s$i.log" 2>&1
$E --methods topk --out "$OUT/topk" > "$OUT/topk.s$i.log" 2>&1
