#!/usr/bin/env bash
# Live test of deploy/swarm/stack.yml on a single-node swarm: build the real images, deploy, check
# that both replicas become healthy and both answer requests sent through the published port,
# kill a replica under load (it must be replaced; few requests may fail), run a rolling update
# under load (no request may fail), tear down. Initialises a swarm when there is none, and leaves
# it again at the end. Needs a Docker engine with Compose v2.
#
# Environment: GMLP_PUBLISH_PORT (8000), GMLP_REPLICAS (2), SWARM_TEST_STACK (gmlp-swarm-test),
# SWARM_TEST_KILL_MAX_FAILURES (3): failed requests tolerated across the kill.
set -euo pipefail
cd "$(dirname "$0")/.."
STACK=${SWARM_TEST_STACK:-gmlp-swarm-test}
KILL_MAX_FAILURES=${SWARM_TEST_KILL_MAX_FAILURES:-3}
source scripts/swarm-lib.sh
trap cleanup EXIT
ensure_swarm

echo "-- build the images the stack runs, deploy $GMLP_REPLICAS replicas"
docker compose -f "$FILE" build --quiet
deploy_stack
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
posts = {c[:12]: n["posts"] for c, n in counts.items()}
print("POSTs answered per replica:", posts)
assert len(posts) == int(sys.argv[2]) and all(n > 0 for n in posts.values()), posts
assert sum(posts.values()) == 200, posts  # warm-up does not go through HTTP: these are ours
PYEOF

echo "-- kill a replica under load: swarm replaces it, the service keeps answering"
before=$(api_containers)
start_load kill --workers 4
sleep 5
victim=$(head -n1 <<<"$before")
docker kill "$victim" >/dev/null
wait_healthy "$victim"
sleep 5  # the balancer checks the replacement (about 2 s) and sends it requests
stop_load kill
kill_requests=$requests kill_failed=$failed
echo "kill: $kill_failed of $kill_requests requests failed (at most $KILL_MAX_FAILURES allowed)"
[[ $kill_requests -gt 100 && $kill_failed -le $KILL_MAX_FAILURES ]]
replacement=$(comm -13 <(echo "$before") <(api_containers))
"$PY" scripts/swarm_probe.py replicas $replacement | "$PY" -c 'import json, sys
counts = json.load(sys.stdin)
print("POSTs answered by the replacement:", [n["posts"] for n in counts.values()])
assert len(counts) == 1 and all(n["posts"] > 0 for n in counts.values()), counts'

echo "-- rolling update (start-first) under load: no request may fail"
before=$(api_containers)
start_load update --workers 4
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
