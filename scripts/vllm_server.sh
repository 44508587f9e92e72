#!/usr/bin/env bash
# Serve a model for qgpm's vLLM generator (qgpm.serving.VLLMServer): vLLM's OpenAI-compatible
# server from .venv-vllm (bash scripts/setup_vllm.sh), in the foreground, on 127.0.0.1.
#   bash scripts/vllm_server.sh --port 8000                    # the embedded SmolLM2
#   bash scripts/vllm_server.sh --port 8000 --model PATH_OR_GGUF [more vLLM server arguments]
# Ready when http://127.0.0.1:PORT/v1/models answers; SIGTERM (or Ctrl-C) stops it.
# The model is served from the folder qgpm loads it from (qgpm.loading.model_folder: for a GGUF
# file, qgpm's de-quantized cache entry), under the name qgpm gives it, in float32 on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=8000
MODEL=smollm2
MAX_LEN=${QGPM_VLLM_MAX_LEN:-8192}
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --port) PORT=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    *) EXTRA+=("$1"); shift ;;
  esac
done
if [ ! -x .venv-vllm/bin/python ]; then
  echo "vllm_server.sh: .venv-vllm is missing; build it with: bash scripts/setup_vllm.sh" >&2
  exit 2
fi
read -r DIR NAME < <(.venv/bin/python - "$MODEL" <<'PY'
import sys
from qgpm.loading import model_folder, resolve_source
src = resolve_source(sys.argv[1])
print(model_folder(src), src.name)
PY
)
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
exec .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --model "$DIR" --served-model-name "$NAME" \
  --host 127.0.0.1 --port "$PORT" --dtype float32 --max-model-len "$MAX_LEN" --enforce-eager "${EXTRA[@]}"
