"""deploy/swarm: the stack file and the HAProxy config agree with each other and with the service.

The live behaviour (replicas healthy, traffic spread, kill and rolling update under load) is
tested by scripts/swarm-test.sh on a real swarm; these checks need no Docker.
"""

from __future__ import annotations

import re

import yaml
from manifests import DEPLOY, setting_env_names, shutdown_budget_s

STACK = yaml.safe_load((DEPLOY / "swarm" / "stack.yml").read_text())
HAPROXY = (DEPLOY / "swarm" / "haproxy.cfg").read_text()
DEFAULT = re.compile(r"^\$\{(\w+):?-([^}]*)\}$")


def default_of(value: str) -> str:
    """`${NAME:-default}` -> default (what the stack gets when NAME is not set)."""
    match = DEFAULT.match(str(value))
    return match.group(2) if match else str(value)


def directive(name: str) -> list[str]:
    """The arguments of every `name ...` line of haproxy.cfg."""
    lines = (line.strip() for line in HAPROXY.splitlines())
    return [line[len(name) :].strip() for line in lines if line.startswith(name + " ")]


def seconds(duration: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(ms|s|m)", duration).groups()
    return float(value) * {"ms": 0.001, "s": 1, "m": 60}[unit]


def test_api_service():
    api = STACK["services"]["api"]
    env = {k: default_of(v) for k, v in api["environment"].items()}
    assert not set(env) - setting_env_names(), "every variable is a service setting"
    assert api["healthcheck"]["test"] == ["CMD", "python", "-m", "service.healthcheck"]
    deploy = api["deploy"]
    assert default_of(deploy["replicas"]) == "2" and deploy["endpoint_mode"] == "dnsrr"
    assert deploy["update_config"]["order"] == "start-first"
    assert deploy["update_config"]["failure_action"] == "rollback"
    assert deploy["restart_policy"]["condition"] == "any"
    limits, reservations = deploy["resources"]["limits"], deploy["resources"]["reservations"]
    assert float(default_of(reservations["cpus"])) < float(default_of(limits["cpus"])), "room for start-first"
    assert seconds(api["stop_grace_period"]) > shutdown_budget_s(env)


def test_load_balancer_service():
    lb = STACK["services"]["lb"]
    (port,) = lb["ports"]
    assert port["mode"] == "host" and port["target"] == 8000
    assert default_of(port["published"]) == "8000"
    assert lb["deploy"]["mode"] == "global" and lb["deploy"]["update_config"]["order"] == "stop-first"
    assert set(lb["networks"]) == set(STACK["services"]["api"]["networks"])
    host, _, backend_port = lb["environment"]["GMLP_LB_BACKEND"].partition(":")
    assert host == "tasks.api" and backend_port == str(
        STACK["services"]["api"]["environment"].get("GMLP_PORT", 8000)
    )


def test_haproxy_retries_connection_failures_only():
    (retry_on,) = directive("retry-on")
    assert set(retry_on.split()) == {"conn-failure", "empty-response"}, "never 5xx or response timeouts"
    assert directive("option redispatch"), "a retry goes to another replica"
    assert directive("http-check send") == ["meth GET uri /health/ready"]
    assert directive("http-check expect") == ["status 200"]
    (template,) = directive("server-template")
    assert "${GMLP_LB_BACKEND" in template
    (timeout_server,) = directive("timeout server")
    lb_timeout = default_of(STACK["services"]["lb"]["environment"]["GMLP_LB_TIMEOUT"])
    request_timeout = float(default_of(STACK["services"]["api"]["environment"]["GMLP_REQUEST_TIMEOUT_S"]))
    assert seconds(lb_timeout) > request_timeout and "${GMLP_LB_TIMEOUT" in timeout_server
