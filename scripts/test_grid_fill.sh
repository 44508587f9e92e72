#!/usr/bin/env bash
# Cells of the SmolLM2 test grids that earlier runs left empty (docs/results.md, "What is not
# measured"), so that every method on the 4K "All tasks" table covers the same 210 samples:
#   baselines  STRING, Ms-PoE and Self-Extend (their defaults) on 4K multi-key and multi-value,
#              needle contents 6-11 (60 samples; contents 0-5 ran 2026-12-01 / 2026-12-03)
#   topk       Top-K (MiniLM, k = 5) on 4K multi-value, contents 6-11 (30 samples)
#   oracle8k   the Oracle with the shipped preset's settings on 8K multi-key (18 samples; the
#              other four 8K tasks ran with scripts/test_grid_8k.sh, stage oracle)
# Written 2026-12-06, before these rows. They choose nothing and change no setting; read them
# as the tables read the earlier rows: right answers per method and task, and each method against
# vanilla (and Reorder at 4K) on the same samples, wins / losses, two-sided exact McNemar p, with
#   python benchmarks/grid_table.py benchmarks/results/eval_smollm2_test/rows.jsonl --length 4096 --series ...
#   python benchmarks/grid_table.py benchmarks/results/eval_smollm2_test_8k/rows.jsonl --length 8192 --series ...
# Two processes (shards 0 and 1), one thread each, each folder resumable:
#   bash scripts/test_grid_fill.sh 0 & bash scripts/test_grid_fill.sh 1; wait     (stages topk, oracle8k, baselines)
# Rows merge with
#   python benchmarks/merge_runs.py --into benchmarks/results/eval_smollm2_test runs/test_fill/{baselines,topk}
#   python benchmarks/merge_runs.py --into benchmarks/results/eval_smollm2_test_8k runs/test_fill/oracle8k
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
i=$1
OUT=${OUT:-runs/test_fill}
PY=${PY:-.venv/bin/python}
E="$PY -m qgpm.eval.cli eval --model smollm2 --split test --device cpu --dtype float32 --max-new-tokens 48 --no-logprob --no-progress --shard $i/2"
E4="$E --lengths 4096 --depths 0,0.25,0.5,0.75,1 --n 12"
shift
mkdir -p "$OUT"
for stage in ${@:-topk oracle8k baselines}; do
  case $stage in
    baselines)
      $E4 --tasks niah_multikey_1 --only benchmarks/results/ids_mk_test_6_11.jsonl --methods string,ms-poe,self-extend \
        --out "$OUT/baselines" > "$OUT/baselines_mk.s$i.log" 2>&1
      $E4 --tasks niah_multivalue --only benchmarks/results/ids_mv_test_6_11.jsonl --methods string,ms-poe,self-extend \
        --out "$OUT/baselines" > "$OUT/baselines_mv.s$i.log" 2>&1 ;;
    topk) $E4 --tasks niah_multivalue --only benchmarks/results/ids_mv_test_6_11.jsonl --methods topk \
        --out "$OUT/topk" > "$OUT/topk.s$i.log" 2>&1 ;;
    oracle8k) $E --lengths 8192 --depths 0.25,0.5,0.75 --tasks niah_multikey_1 --n 6 --methods oracle \
        --out "$OUT/oracle8k" > "$OUT/oracle8k.s$i.log" 2>&1 ;;
    *) echo "unknown stage $stage (baselines, topk, oracle8k)" >&2; exit 2 ;;
  esac
done
