#!/usr/bin/env bash
# Same CPUs, split differently: deploy deploy/swarm/stack.yml as 1 replica x 2 CPUs and as
# 2 replicas x 1 CPU (ONNX Runtime threads follow the CPU limit), drive each with the same
# closed-loop load through the load balancer, and print throughput, latency and batch sizes.
# Each layout runs $ROUNDS times, alternating, so that drift on a shared machine shows.
#
# Environment: SIZING_LAYOUTS ("1x2 2x1": replicas x CPUs), SIZING_WORKERS (8 concurrent
# requests), SIZING_SECONDS (40 measured seconds per run), ROUNDS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
STACK=${SWARM_TEST_STACK:-gmlp-sizing}
source scripts/swarm-lib.sh
trap cleanup EXIT
ensure_swarm
docker compose -f "$FILE" build --quiet

for round in $(seq "${ROUNDS:-2}"); do
  for layout in ${SIZING_LAYOUTS:-1x2 2x1}; do
    export GMLP_REPLICAS=${layout%x*} GMLP_CPUS_PER_REPLICA=${layout#*x}
    deploy_stack
    "$PY" scripts/swarm_probe.py load --url "$URL" --workers "${SIZING_WORKERS:-8}" --pause 0 \
      --duration 5 --out "$work/warm.json" >/dev/null
    "$PY" scripts/swarm_probe.py replicas $(api_containers) >"$work/before.json"
    "$PY" scripts/swarm_probe.py load --url "$URL" --workers "${SIZING_WORKERS:-8}" --pause 0 \
      --duration "${SIZING_SECONDS:-40}" --max-requests 1000000 --out "$work/run.json" >/dev/null
    "$PY" scripts/swarm_probe.py replicas $(api_containers) >"$work/after.json"
    "$PY" - "$layout" "$round" "$work" <<'PYEOF'
import json, sys
layout, rnd, work = sys.argv[1:]
run = json.load(open(f"{work}/run.json"))
before, after = (json.load(open(f"{work}/{n}.json")) for n in ("before", "after"))
batches = sum(after[c]["batches"] - before[c]["batches"] for c in after)
batched = sum(after[c]["batched_requests"] - before[c]["batched_requests"] for c in after)
print(f"{layout} round {rnd}: {run['ok_per_s']} req/s, p50 {run['p50_ms']} ms, p95 {run['p95_ms']} ms, "
      f"p99 {run['p99_ms']} ms, {run['failed']} failed, mean batch {batched / max(batches, 1):.2f}")
PYEOF
    remove_stack
  done
done
