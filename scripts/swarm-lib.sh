# Sourced by scripts/swarm-test.sh and scripts/swarm-sizing.sh: deploy deploy/swarm/stack.yml as
# $STACK on this node's swarm (initialised here when there is none, and left again on exit),
# wait for healthy replicas, run scripts/swarm_probe.py load in the background, tear down on exit.
PY=${PYTHON:-.venv/bin/python}
export PYTHONPATH=.
export GMLP_REPLICAS=${GMLP_REPLICAS:-2}
URL=http://127.0.0.1:${GMLP_PUBLISH_PORT:-8000}
FILE=deploy/swarm/stack.yml
work=$(mktemp -d)
initialised_swarm=
load_pid=

api_containers() {  # running containers of the API service; --healthy: only healthy ones
  docker ps -q --no-trunc --filter "label=com.docker.swarm.service.name=${STACK}_api" \
    ${1:+--filter health=healthy} | sort
}

remove_stack() {  # the stack's containers and network go away asynchronously: wait for them
  docker stack rm "$STACK" >/dev/null 2>&1 || true
  for _ in $(seq 60); do
    [[ -z $(docker ps -aq --filter "label=com.docker.stack.namespace=$STACK") ]] &&
      [[ -z $(docker network ls -q --filter "label=com.docker.stack.namespace=$STACK") ]] && return 0
    sleep 2
  done
}

cleanup() {
  status=$?
  [[ -n $load_pid ]] && kill "$load_pid" 2>/dev/null
  if [[ $status -ne 0 ]]; then
    docker service ps --no-trunc "${STACK}_api" "${STACK}_lb" || true
    docker service logs --tail 40 "${STACK}_api" || true
    docker service logs --tail 40 "${STACK}_lb" || true
  fi
  remove_stack
  if [[ -n $initialised_swarm ]]; then docker swarm leave --force >/dev/null || true; fi
  rm -rf "$work"
  exit $status
}

ensure_swarm() {
  if [[ $(docker info --format '{{.Swarm.LocalNodeState}}') != active ]]; then
    echo "-- docker swarm init (single node)"
    docker swarm init --advertise-addr 127.0.0.1 >/dev/null
    initialised_swarm=1
  fi
}

# Waits until GMLP_REPLICAS healthy API containers run, none of them in $1 (IDs to see replaced),
# and the load balancer answers /health/ready.
wait_healthy() {
  local gone=${1:-} ids
  for _ in $(seq 150); do
    ids=$(api_containers --healthy)
    if [[ $(wc -w <<<"$ids") -eq $GMLP_REPLICAS && $(api_containers | wc -w) -eq $GMLP_REPLICAS ]] &&
      ! grep -qxF -f <(tr ' ' '\n' <<<"$gone" | grep .) <<<"$ids" 2>/dev/null &&
      curl -sf "$URL/health/ready" >/dev/null; then
      return 0
    fi
    sleep 2
  done
  echo "replicas did not become healthy: $(api_containers --healthy | wc -w) of $GMLP_REPLICAS" >&2
  return 1
}

deploy_stack() {
  docker stack deploy --detach=true -c "$FILE" "$STACK"
  wait_healthy
}

start_load() {  # $1: name, then extra `swarm_probe.py load` flags; stops when $work/$1.stop exists
  local name=$1
  shift
  "$PY" scripts/swarm_probe.py load --url "$URL" --duration 240 --max-requests 40000 \
    --stop-file "$work/$name.stop" --out "$work/$name.json" "$@" &
  load_pid=$!
}

stop_load() {  # $1: name; waits for the load to end, sets $requests and $failed
  touch "$work/$1.stop"
  wait "$load_pid"
  load_pid=
  read -r requests failed < <("$PY" -c 'import json, sys; d = json.load(open(sys.argv[1]))
print(d["requests"], d["failed"])
for f in d["failures"][:10]: print("  failed:", f, file=sys.stderr)' "$work/$1.json")
}
