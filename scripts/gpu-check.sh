#!/usr/bin/env bash
# One prepared GPU check (< 8 minutes) for an NVIDIA machine with only Python 3.10+ and the driver:
#  1. export the demo checkpoints with the fp16 variant (CPU torch, in its own venv),
#  2. CUDA-EP parity against CPU and throughput of CPU vs CUDA fp32 vs CUDA fp16 (IO binding) at
#     batch 1/8/64 (python -m benchmarks.gpu, in a venv with onnxruntime-gpu),
#  3. the service with GMLP_DEVICE=cuda and a 20 s load test against it.
# Everything is written under OUT (default ./gpu-check-out). Usage: scripts/gpu-check.sh [OUT]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-gpu-check-out}}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
TORCH_INDEX_URL=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}
PORT=${PORT:-18765}
exec > >(tee "$OUT/gpu-check.log") 2>&1
step() { echo; echo "== $(date +%T) $*"; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || echo "nvidia-smi not found"
$PY --version

step "export venv (CPU torch) and demo models with fp16"
$PY -m venv /tmp/gmlp-export && /tmp/gmlp-export/bin/pip install -q \
  ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} -c constraints.txt ".[export,serve]" || exit 1
for m in cifar10-gmlp gutenberg-gmlp-mlm; do
  /tmp/gmlp-export/bin/gmlp export "checkpoints/$m" --out "$OUT/models/$m" --variants fp32,int8,fp16 || exit 1
done

step "serving venv with the gpu extra (onnxruntime-gpu)"
$PY -m venv /tmp/gmlp-gpu && /tmp/gmlp-gpu/bin/pip install -q ".[gpu,loadtest]" || exit 1
/tmp/gmlp-gpu/bin/python -c "import onnxruntime as o; print(o.__version__, o.get_available_providers())"

step "CUDA-EP parity and throughput"
timeout 240 /tmp/gmlp-gpu/bin/python -m benchmarks.gpu --models "$OUT/models" --out "$OUT" \
  --batches 1,8,64 --seconds 2

step "service on CUDA and a 20 s load test"
GMLP_DEVICE=cuda GMLP_MODEL_REPOSITORY="$OUT/models" GMLP_CHECKPOINT_DIR= \
  timeout 150 /tmp/gmlp-gpu/bin/gmlp serve --host 127.0.0.1 --port "$PORT" >"$OUT/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 90); do curl -sf "http://127.0.0.1:$PORT/health/ready" >/dev/null && break; sleep 1; done
curl -sS "http://127.0.0.1:$PORT/models" | tee "$OUT/models.json"; echo
timeout 90 /tmp/gmlp-gpu/bin/gmlp loadtest --url "http://127.0.0.1:$PORT" --users 16 --duration 20s \
  --out "$OUT/loadtest" --allow-failures
curl -sS "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics.txt"
kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null
grep -i "provider" "$OUT/serve.log" | head -5

step "done: results in $OUT (gpu-bench.md, loadtest/report.md, serve.log)"
