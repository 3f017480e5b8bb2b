#!/usr/bin/env bash
# Live test of deploy/swarm/stack.yml on a single-node swarm: build the real images, deploy, check
# that both replicas become healthy and both answer requests sent through the published port,
# kill a replica under load (it must be replaced; few requests may fail), run a rolling update
# under load (no request may fail), tear down. Initialises a swarm when there is none, and leaves
# it again at the end. Needs a Docker engine with Compose v2 (here: ../shared/tools/docker-standin.sh).
#
# Environment: GMLP_PUBLISH_PORT (8000), GMLP_REPLICAS (2), SWARM_TEST_STACK (gmlp-swarm-test),
# SWARM_TEST_KILL_MAX_FAILURES (3): failed requests tolerated across the kill.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export PYTHONPATH=.
export GMLP_REPLICAS=${GMLP_REPLICAS:-2}
STACK=${SWARM_TEST_STACK:-gmlp-swarm-test}
URL=http://127.0.0.1:${GMLP_PUBLISH_PORT:-8000}
KILL_MAX_FAILURES=${SWARM_TEST_KILL_MAX_FAILURES:-3}
FILE=deploy/swarm/stack.yml
work=$(mktemp -d)
initialised_swarm=
load_pid=

api_containers() {  # running containers of the API service; --healthy: only healthy ones
  docker ps -q --no-trunc --filter "label=com.docker.swarm.service.name=${STACK}_api" \
    ${1:+--filter health=healthy} | sort
}

cleanup() {
  status=$?
  [[ -n $load_pid ]] && kill "$load_pid" 2>/dev/null
  if [[ $status -ne 0 ]]; then
    docker service ps --no-trunc "${STACK}_api" "${STACK}_lb" || true
    docker service logs --tail 40 "${STACK}_api" || true
    docker service logs --tail 40 "${STACK}_lb" || true
  fi
  docker stack rm "$STACK" >/dev/null 2>&1 || true
  for _ in $(seq 60); do  # the stack's containers and network go away asynchronously
    [[ -z $(docker ps -aq --filter "label=com.docker.stack.namespace=$STACK") ]] &&
      [[ -z $(docker network ls -q --filter "label=com.docker.stack.namespace=$STACK") ]] && break
    sleep 2
  done
  if [[ -n $initialised_swarm ]]; then docker swarm leave --force >/dev/null || true; fi
  rm -rf "$work"
  exit $status
}
trap cleanup EXIT

# Waits until GMLP_REPLICAS healthy API containers run, none of them in $1 (IDs to see replaced).
wait_healthy() {
  local gone=${1:-} ids
  for _ in $(seq 150); do
    ids=$(api_containers --healthy)
    if [[ $(wc -w <<<"$ids") -eq $GMLP_REPLICAS && $(api_containers | wc -w) -eq $GMLP_REPLICAS ]] &&
      ! grep -qxF -f <(tr ' ' '\n' <<<"$gone" | grep .) <<<"$ids" 2>/dev/null; then
      return 0
    fi
    sleep 2
  done
  echo "replicas did not become healthy: $(api_containers --healthy | wc -w) of $GMLP_REPLICAS" >&2
  return 1
}

start_load() {  # $1: name; runs until $work/$1.stop exists (or 240 s / 40000 requests)
  "$PY" scripts/swarm_probe.py load --url "$URL" --workers 4 --duration 240 --max-requests 40000 \
    --stop-file "$work/$1.stop" --out "$work/$1.json" &
  load_pid=$!
}

stop_load() {  # $1: name; sets $requests and $failed
  touch "$work/$1.stop"
  wait "$load_pid"
  load_pid=
  read -r requests failed < <("$PY" -c 'import json, sys; d = json.load(open(sys.argv[1]))
print(d["requests"], d["failed"])
for f in d["failures"][:10]: print("  failed:", f, file=sys.stderr)' "$work/$1.json")
}

if [[ $(docker info --format '{{.Swarm.LocalNodeState}}') != active ]]; then
  echo "-- docker swarm init (single node)"
  docker swarm init --advertise-addr 127.0.0.1 >/dev/null
  initialised_swarm=1
fi

echo "-- build the images the stack runs, deploy $GMLP_REPLICAS replicas"
docker compose -f "$FILE" build --quiet
docker stack deploy --detach=true -c "$FILE" "$STACK"
wait_healthy
for _ in $(seq 30); do curl -sf "$URL/health/ready" >/dev/null && break; sleep 1; done
curl -sS --fail-with-body "$URL/health/ready"
echo

echo "-- requests through the published port reach every replica"
"$PY" scripts/swarm_probe.py load --url "$URL" --workers 4 --duration 60 --max-requests 200 \
  --out "$work/spread.json"
"$PY" - "$work/spread.json" "$GMLP_REPLICAS" $(api_containers) <<'PYEOF'
import json, subprocess, sys
summary = json.load(open(sys.argv[1]))
assert summary["requests"] == 200 and summary["failed"] == 0, summary
counts = json.loads(subprocess.run([sys.executable, "scripts/swarm_probe.py", "replicas", *sys.argv[3:]],
                                   check=True, capture_output=True, text=True).stdout)
print("POSTs answered per replica:", {c[:12]: n for c, n in counts.items()})
assert len(counts) == int(sys.argv[2]) and all(n > 0 for n in counts.values()), counts
assert sum(counts.values()) >= 200, counts  # warm-up does not go through HTTP: these are ours
PYEOF

echo "-- kill a replica under load: swarm replaces it, the service keeps answering"
before=$(api_containers)
start_load kill
sleep 5
victim=$(head -n1 <<<"$before")
docker kill "$victim" >/dev/null
wait_healthy "$victim"
sleep 3  # a few requests for the replacement too
stop_load kill
kill_requests=$requests kill_failed=$failed
echo "kill: $kill_failed of $kill_requests requests failed (at most $KILL_MAX_FAILURES allowed)"
[[ $kill_requests -gt 100 && $kill_failed -le $KILL_MAX_FAILURES ]]

echo "-- rolling update (start-first) under load: no request may fail"
before=$(api_containers)
start_load update
timeout 600 docker service update --force --detach=false --quiet "${STACK}_api"
for _ in $(seq 90); do  # the update is over once its monitoring window has passed
  state=$(docker service inspect -f '{{.UpdateStatus.State}}' "${STACK}_api")
  [[ $state != updating ]] && break
  sleep 2
done
stop_load update
update_requests=$requests update_failed=$failed
echo "rolling update: state $state, $update_failed of $update_requests requests failed"
[[ $state == completed && $update_requests -gt 100 && $update_failed -eq 0 ]]
wait_healthy "$before"

echo "swarm test passed: kill $kill_failed/$kill_requests failed, rolling update $update_failed/$update_requests failed"
