#!/usr/bin/env bash
# GPU check: the CUDA exactness tests, then speed and memory of QGPM against vanilla on random-weight
# SmolLM2-135M and Llama-3-8B shapes, per-step decode, and pass 1 reused as the prefill.
# Run on a CUDA machine from the repo root: QGPM_TEST_TOKENIZER=tok bash scripts/device_check.sh
# (a saved SmolLM2 tokenizer, e.g. from
# `python -c "from qgpm.loading import *; load_tokenizer(default_model_source()).save_pretrained('tok')"`).
# Writes logs and reports to ${OUT:-gpu_out}.
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
PY=${PY:-python3}
{ nvidia-smi -L; $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee "$OUT/env.txt"
$PY -m pytest -q -p no:cacheprovider -o addopts="" -m "not real_model" tests/test_cuda.py tests/test_identity.py tests/test_relevance.py 2>&1 | tee "$OUT/pytest_cuda.log" | tail -5
# relevance=heads: the SmolLM2 shape gets the SmolLM2 preset, which ranks with MiniLM; the pass-1 cost is what is timed
$PY benchmarks/speed.py --random-arch smollm2-135m --tokenizer "$QGPM_TEST_TOKENIZER" --device cuda --dtype bfloat16 --set relevance=heads \
    --lengths 1024,2048,4096,8000 --repeats 5 --out "$OUT/speed_cuda_smollm2_arch.md" 2>&1 | tail -12
$PY benchmarks/speed.py --random-arch llama3-8b --tokenizer "$QGPM_TEST_TOKENIZER" --device cuda --dtype bfloat16 \
    --lengths 4096,16384,32768 --repeats 3 --out "$OUT/speed_cuda_llama3_8b_arch.md" 2>&1 | tail -10
# decode per step: QGPM's own work (its layer hooks) against the state a pass 1 leaves
$PY benchmarks/decode_steps.py --random-arch llama3-8b --tokenizer "$QGPM_TEST_TOKENIZER" --device cuda --dtype bfloat16 \
    --lengths 16384,32768 --rounds 4 --profile-hooks --out "$OUT/decode_steps_cuda_llama3_8b_arch.md" 2>&1 | tail -12
# pass 1 going on as the prefill (reuse_prefill): a call that falls back, and one fed in slot order
$PY benchmarks/speed.py --random-arch llama3-8b --tokenizer "$QGPM_TEST_TOKENIZER" --device cuda --dtype bfloat16 \
    --lengths 16384,32768 --repeats 2 --set remap=reorder --set split_layer=0 --compare-reuse --evidence-depth 0.5 \
    --out "$OUT/speed_cuda_llama3_8b_arch_reuse.md" 2>&1 | tail -12
