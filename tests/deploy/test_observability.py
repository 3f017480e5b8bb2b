"""deploy/observability: the alert rules checked and unit-tested by Prometheus's own promtool, every
metric the dashboard and the rules name served by a live server, and the same files wired into
the compose profile and the Kubernetes objects.

promtool comes from Debian's `prometheus` package (.ci/run installs it); without it the promtool
tests skip, saying so, except in CI, where its absence is an error rather than a silent pass.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from manifests import DEPLOY, K8S, render, required_tool, resolve_version
from prometheus_client.parser import text_string_to_metric_families

from gmlp.server_process import gmlp_serve, http_get
from support.helpers import REPO_ROOT

OBSERVABILITY = DEPLOY / "observability"
RULES = OBSERVABILITY / "rules.yml"
DASHBOARD = OBSERVABILITY / "dashboard.json"
METRIC = re.compile(r"\b(gmlp_[a-z0-9_]+|gmlp:[a-z0-9_:]+)")
# The sample names a family of each type is exposed under.
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def promtool() -> str:
    return required_tool(
        "promtool", "check deploy/observability/rules.yml", "Debian: apt-get install prometheus"
    )


def _promtool(*args: str) -> str:
    done = subprocess.run([promtool(), *args], cwd=OBSERVABILITY, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_rules_pass_promtool_check() -> None:
    assert "SUCCESS" in _promtool("check", "rules", RULES.name)


def test_the_rules_pass_their_promtool_unit_tests() -> None:
    assert "SUCCESS" in _promtool("test", "rules", "rules_test.yml")


def _rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def test_every_alert_the_issue_names_is_there() -> None:
    alerts = {rule["alert"] for rule in _rules() if "alert" in rule}
    assert alerts == {
        "GmlpHighErrorRatio",
        "GmlpP99NearDeadline",
        "GmlpQueueSaturated",
        "GmlpShedding",
        "GmlpReadinessFlapping",
        "GmlpConfidenceDrift",
    }
    for rule in _rules():
        if "alert" in rule:
            assert rule["labels"]["severity"] in ("warning", "critical") and rule["annotations"]["summary"]


def test_every_metric_the_dashboard_and_rules_name_is_served(
    tmp_path: Path, tiny_vision_served: Path
) -> None:
    exprs = [rule["expr"] for rule in _rules()] + _dashboard_exprs()
    named = {name for expr in exprs for name in METRIC.findall(expr)}
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    assert recorded <= named, "a recording rule nothing uses"
    with gmlp_serve(tiny_vision_served.parent, log_path=tmp_path / "serve.log") as server:
        http_get(f"{server.base_url}/health/ready")
        text = http_get(f"{server.base_url}/metrics").decode()
    served = {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in SUFFIXES.get(family.type, ("",))
    }
    assert served, "the server exposes no metrics"
    missing = sorted(named - served - recorded)
    assert not missing, f"named in deploy/observability but not served: {missing}"


def test_the_prometheus_rule_is_generated_from_the_rules() -> None:
    generated = subprocess.run(
        [sys.executable, "-c", "import prometheus_rule; print(prometheus_rule.prometheus_rule(), end='')"],
        cwd=REPO_ROOT / "scripts",
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    committed = (OBSERVABILITY / "prometheusrule.yaml").read_text()
    assert committed == generated, (
        "deploy/observability/prometheusrule.yaml is stale: run scripts/prometheus_rule.py"
    )


@pytest.mark.parametrize("version", ["1.29", "latest"])
def test_the_kubernetes_objects_carry_the_same_files(version: str) -> None:
    docs = render(K8S / "observability")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "ConfigMap", "PrometheusRule"]
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    dashboard = maps["gmlp-serve-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["gmlp-serve.json"]) == json.loads(DASHBOARD.read_text())
    assert maps["gmlp-serve-rules"]["data"]["gmlp-serve-rules.yml"] == RULES.read_text()
    for doc in maps.values():
        kubernetes_validate.validate(doc, resolve_version(version), strict=True)


def test_the_compose_profile_scrapes_the_api_with_the_rules() -> None:
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    prometheus = compose["services"]["prometheus"]
    assert prometheus["profiles"] == ["observability"]
    mounts = dict(volume.rsplit(":", 1)[0].split(":", 1) for volume in prometheus["volumes"])
    for source in mounts:
        assert (REPO_ROOT / source).is_file(), source
    config = yaml.safe_load((OBSERVABILITY / "prometheus.yml").read_text())
    assert config["rule_files"] == [mounts["./deploy/observability/rules.yml"]]
    (job,) = config["scrape_configs"]
    (target,) = job["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert host in compose["services"] and job["metrics_path"] == "/metrics"
    assert any(mapping.endswith(f":{port}") for mapping in compose["services"][host]["ports"])
