#!/usr/bin/env bash
# Compose chaos test: SIGKILL the api's server process under load and check that Docker's restart
# policy (`restart: unless-stopped`) brings it back and that it is ready again within a bound.
#
#   1. build and start the api (scripts/compose-lib.sh), as the smoke test does;
#   2. bounded load: scripts/swarm_probe.py workers alternate /classify and /fill-mask;
#   3. SIGKILL the container's PID 1 from the host (`docker kill` or `docker stop` would count as
#      a manual stop, which `unless-stopped` does not restart), then poll /health/ready;
#   4. stop the load, then a second short load must see no failure at all.
# Prints the time from the kill to ready and the requests that failed meanwhile (refused or reset
# connections while no server listens). Set GMLP_PUBLISH_PORT and COMPOSE_PROJECT_NAME to run
# beside another stack. Needs a Docker engine with Compose v2, and root (the kill is a host kill).
set -euo pipefail
cd "$(dirname "$0")/.."
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-gmlp-chaos}
source scripts/compose-lib.sh
export PYTHONPATH=.
READY_LIMIT_S=${CHAOS_READY_LIMIT_S:-120}
work=$(mktemp -d)
load_pid=

compose_on_exit() {
  [[ -n $load_pid ]] && kill "$load_pid" 2>/dev/null
  rm -rf "$work"
}
trap compose_cleanup EXIT

load() {  # $1: name, $2: seconds at most; runs in the background until $work/$1.stop exists
  "$PY" scripts/swarm_probe.py load --url "$URL" --workers 4 --pause 0.01 --duration "$2" \
    --max-requests 20000 --timeout 40 --stop-file "$work/$1.stop" --out "$work/$1.json" &
  load_pid=$!
}

finish_load() {  # $1: name; waits for it and prints its summary
  touch "$work/$1.stop"
  wait "$load_pid"
  load_pid=
}

summary() {  # $1: name, $2: python expression over the summary `d`
  "$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$work/$1.json" "$2"
}

echo "-- build and start"
compose_up
cid=$(docker compose ps -q api)
restarts_before=$(docker inspect -f '{{.RestartCount}}' "$cid")

echo "-- load, then SIGKILL of the server process (PID 1 of the container) from the host"
load chaos 150
sleep 10
pid=$(docker inspect -f '{{.State.Pid}}' "$cid")
killed_at=$(date +%s.%N)
kill -9 "$pid"
echo "killed pid $pid"
# The restart policy restarts the container; its service loads and warms up the models again.
sleep 0.5
wait_ready "$READY_LIMIT_S"
ready_at=$(date +%s.%N)
restarts=$(docker inspect -f '{{.RestartCount}}' "$cid")
sleep 5  # keep the load on the restarted server for a while
finish_load chaos

echo "-- load on the restarted server: no failures"
load after 10
wait "$load_pid"
load_pid=

time_to_ready=$("$PY" -c "print(f'{$ready_at - $killed_at:.1f}')")
echo "restarts by the policy: $((restarts - restarts_before))"
echo "time from SIGKILL to /health/ready 200: $time_to_ready s (limit $READY_LIMIT_S s)"
echo "load across the kill: $(summary chaos '"{requests} requests, {failed} failed, {ok_per_s} ok/s".format(**d)')"
summary chaos '"\n".join("  failed at %s s: %s: %s" % (f["t_s"], f["path"], f["error"][:100]) for f in d["failures"][:3])'
echo "load after the restart: $(summary after '"{requests} requests, {failed} failed".format(**d)')"
[[ $((restarts - restarts_before)) -eq 1 ]] || { echo "the container was not restarted once by its policy" >&2; exit 1; }
[[ $(summary after 'd["failed"]') -eq 0 && $(summary after 'd["requests"]') -gt 0 ]] ||
  { echo "requests failed after the restart" >&2; exit 1; }
echo "compose chaos test passed"
