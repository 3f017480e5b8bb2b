# Sourced by scripts/compose-smoke.sh and scripts/compose-chaos.sh: the project's settings, a
# cleanup trap that shows the api's log on failure and removes the stack, and start-up of the api
# service from freshly built images with a bounded wait for readiness.
# Set COMPOSE_PROJECT_NAME and GMLP_PUBLISH_PORT to run beside another stack on the same engine.
PY=${PYTHON:-.venv/bin/python}
URL=http://127.0.0.1:${GMLP_PUBLISH_PORT:-8000}
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-gmlp-smoke}

# Runs on exit: `compose_on_exit` (if the sourcing script defines it), the api's log when the
# script failed, then `docker compose down`; the script's exit status is kept.
compose_cleanup() {
  local status=$?
  if declare -F compose_on_exit >/dev/null; then compose_on_exit || true; fi
  if [[ $status -ne 0 ]]; then docker compose logs --tail 80 api || true; fi
  docker compose down -v --remove-orphans || true
  exit $status
}

# Polls /health/ready on the published port until 200, at most $1 seconds (default 120).
wait_ready() {
  local limit=${1:-120} start=$SECONDS
  while ((SECONDS - start < limit)); do
    curl -sf "$URL/health/ready" >/dev/null && return 0
    sleep 0.5
  done
  echo "the api was not ready on $URL within $limit s" >&2
  return 1
}

# Builds the images and starts the api service; returns once it answers /health/ready.
compose_up() {
  docker compose up -d --build --wait --wait-timeout 600 api
  # `--wait` has returned 0 on an unhealthy container with some Compose builds: check ourselves.
  wait_ready 120
}
