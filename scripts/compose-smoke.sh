#!/usr/bin/env bash
# Compose smoke test: build the real images, start the stack, call the real endpoints with a
# CIFAR-10 test JPEG and a masked sentence, check status and response schema, tear down.
# Needs a Docker engine with Compose v2.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/compose-lib.sh

echo "-- compose files validate (default and gpu profile)"
docker compose config -q
docker compose --profile gpu config -q
docker compose --profile loadtest config -q
docker compose --profile observability config -q

trap compose_cleanup EXIT

echo "-- build and start (waits for the healthcheck on /health/ready)"
compose_up
curl -sS --fail-with-body "$URL/health/ready"
echo
docker image ls gmlp-serve:cpu --format 'runtime image gmlp-serve:cpu: {{.Size}}'

tmp=$(mktemp -d)
"$PY" - "$tmp/cifar.jpg" <<'PYEOF'
import sys
import numpy as np
data = np.load("tests/data/cifar10-test-300.npz")  # the committed CIFAR-10 test sample
i = 7  # a fixed test image
start, end = data["test_offsets"][i], data["test_offsets"][i + 1]
open(sys.argv[1], "wb").write(data["test_jpeg"][start:end].tobytes())
print("test image label:", data["classes"][data["test_labels"][i]])
PYEOF

echo "-- POST /classify"
curl -sS --fail-with-body -F "file=@$tmp/cifar.jpg;type=image/jpeg" "$URL/classify?top_k=3" | tee "$tmp/classify.json"
echo
echo "-- POST /fill-mask"
curl -sS --fail-with-body -H 'content-type: application/json' \
  -d '{"text": "the cat sat on the [MASK].", "top_k": 3}' "$URL/fill-mask" | tee "$tmp/fill.json"
echo

"$PY" - "$tmp/classify.json" "$tmp/fill.json" <<'PYEOF'
import json, sys
classify = json.load(open(sys.argv[1]))
assert isinstance(classify["model"], str), classify
preds = classify["predictions"]
assert len(preds) == 3 and all(isinstance(p["label"], str) and 0 <= p["score"] <= 1 for p in preds), preds
assert [p["score"] for p in preds] == sorted((p["score"] for p in preds), reverse=True)
fill = json.load(open(sys.argv[2]))
assert isinstance(fill["model"], str), fill
(masks,) = [fill["predictions"]]
assert len(masks) == 1 and len(masks[0]) == 3, masks
for p in masks[0]:
    assert {"score", "token", "token_str", "sequence"} <= set(p), p
    assert isinstance(p["token"], int) and "[MASK]" not in p["sequence"]
print("compose smoke test: responses have the documented schema")
PYEOF
curl -sS --fail-with-body "$URL/models" >/dev/null

echo "-- the api container is locked down (and still served everything above)"
cid=$(docker compose ps -q api)
docker inspect -f '{{.HostConfig.ReadonlyRootfs}} {{.HostConfig.CapDrop}} {{.HostConfig.SecurityOpt}} {{.HostConfig.PidsLimit}} {{.Config.User}}' "$cid" | tee "$tmp/inspect.txt"
grep -q '^true \[ALL\] \[no-new-privileges:true\] 512 gmlp$' "$tmp/inspect.txt"
# Writing outside /tmp fails; /tmp is the one writable place.
docker compose exec -T api python -c "
import pathlib
try:
    pathlib.Path('/app/probe').write_text('x')
except OSError as exc:
    print('root filesystem is read-only:', exc.strerror)
else:
    raise SystemExit('the root filesystem is writable')
pathlib.Path('/tmp/probe').write_text('x')
"

echo "-- the loadtest profile against the running api (short: proves the suite runs in compose)"
report=$(mktemp -d)
LOADTEST_USERS=2,4 LOADTEST_DURATION=8s LOADTEST_REPORT_DIR="$report" \
  timeout 600 docker compose --profile loadtest run --rm --build loadtest
"$PY" - "$report/results.json" <<'PYEOF'
import json, sys
results = json.load(open(sys.argv[1]))
assert [s["users"] for s in results["steps"]] == [2, 4], results["steps"]
assert results["total_failures"] == 0, results["total_failures"]
for step in results["steps"]:
    assert {"/classify", "/fill-mask"} <= set(step["endpoints"]), step["endpoints"]
    assert step["total"]["requests"] > 0
print("compose loadtest profile: both endpoints, no failures")
PYEOF
echo "compose smoke test passed"
