#!/usr/bin/env bash
# Why Ms-PoE answers almost nothing on SmolLM2-135M-Instruct (test grid: 0 of 75 at 2K, 6 of 210
# at 4K; docs/results.md). Ms-PoE reads head h at positions p / r_h, r_h from 1.2 to 1.8. The
# implementation equals transformers' own rotary at fractional positions p / r when every head has
# one ratio (tests/test_baselines.py: test_uniform_ms_poe_equals_fractional_position_ids), so the
# question is the model's, not the code's: does SmolLM2 still answer when every head reads
# positions p / r, for a ratio as small as the range's lower end?
#
# Dev split (no test rows), 2,048 tokens, single needle and multi-key, depths 0 / 0.25 / 0.5 /
# 0.75 / 1, needle contents 0-2 (15 samples per task): vanilla; Ms-PoE's default (ratios 1.2-1.8
# ordered by the heads' position awareness); and Ms-PoE with one ratio r for every head,
# r = 1.05, 1.1, 1.2, 1.5, 1.8 (skip_layers 2, the default, in every setting).
# Written 2026-12-06, before these rows. They choose nothing and change no setting. Read:
# right answers per setting and task; if r = 1.2 for every head answers at most half of vanilla's
# right answers on single needle, SmolLM2-135M does not take position interpolation by Ms-PoE's
# smallest ratio, and the test grid's Ms-PoE rows measure that tolerance, not the heads' order.
# Two processes (shards 0 and 1), one thread each, each folder resumable:
#   bash scripts/ms_poe_ratios.sh 0 & bash scripts/ms_poe_ratios.sh 1; wait
# Rows merge into benchmarks/results/ms_poe_ratios_smollm2_dev with
#   python benchmarks/merge_runs.py --into benchmarks/results/ms_poe_ratios_smollm2_dev runs/ms_poe_ratios/*
# Table (each setting's config hash is in its folder's manifest.json):
#   python benchmarks/grid_table.py benchmarks/results/ms_poe_ratios_smollm2_dev/rows.jsonl --length 2048 --series vanilla=HASH,default=HASH,...
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
i=$1
OUT=${OUT:-runs/ms_poe_ratios}
PY=${PY:-.venv/bin/python}
E="$PY -m qgpm.eval.cli eval --model smollm2 --split dev --device cpu --dtype float32 --max-new-tokens 48 --no-logprob --no-progress --lengths 2048 --depths 0,0.25,0.5,0.75,1 --tasks niah_single_2,niah_multikey_1 --n 3 --shard $i/2"
mkdir -p "$OUT"
$E --methods vanilla,ms-poe --out "$OUT/default" > "$OUT/default.s$i.log" 2>&1
for r in 1.2 1.05 1.1 1.5 1.8; do
  $E --methods ms-poe --option ms-poe.min_ratio=$r --option ms-poe.max_ratio=$r --out "$OUT/r$r" > "$OUT/r$r.s$i.log" 2>&1
done
