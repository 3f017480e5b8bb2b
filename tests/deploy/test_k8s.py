"""deploy/k8s renders to valid Kubernetes objects that agree with each other and with the service."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml
from manifests import (
    K8S,
    K8S_VERSIONS,
    by_kind,
    env_of,
    pre_stop_sleep_s,
    render,
    resolve_version,
    setting_env_names,
    shutdown_budget_s,
)

from service.telemetry.metrics import ServiceMetrics

CORE_KINDS = {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"}


def _base():
    return render(K8S)


def _container():
    (container,) = by_kind(_base(), "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def _config_maps():
    return [d for d in _base() if d["kind"] == "ConfigMap"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_base_passes_kubernetes_validate_strict(version):
    docs = _base()
    assert {d["kind"] for d in docs} == CORE_KINDS
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, resolve_version(version), strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")


def test_selectors_and_references_agree():
    docs = _base()
    deployment = by_kind(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selectors = [
        deployment["spec"]["selector"]["matchLabels"],
        by_kind(docs, "Service")["spec"]["selector"],
        by_kind(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
    ]
    for selector in selectors:
        assert selector.items() <= pod_labels.items(), (selector, pod_labels)
    target = by_kind(docs, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    port_names = {p["name"] for p in _container()["ports"]}
    assert by_kind(docs, "Service")["spec"]["ports"][0]["targetPort"] in port_names


def test_environment_names_are_service_settings():
    env = env_of(_container(), _config_maps())
    unknown = set(env) - setting_env_names()
    assert not unknown, f"not read by the service: {sorted(unknown)}"


def test_threads_follow_the_cpu_limit():
    container = _container()
    ref = env_of(container, _config_maps())["GMLP_CPUS"]["resourceFieldRef"]
    assert ref == {"containerName": container["name"], "resource": "limits.cpu", "divisor": "1"}
    resources = container["resources"]
    assert resources["requests"] == resources["limits"], "Guaranteed QoS: requests equal limits"
    assert float(resources["limits"]["cpu"]).is_integer(), "whole CPUs per pod"


def test_probes_and_graceful_shutdown():
    container = _container()
    assert container["startupProbe"]["httpGet"]["path"] == "/health/ready"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"
    pod = by_kind(_base(), "Deployment")["spec"]["template"]["spec"]
    budget = pre_stop_sleep_s(container) + shutdown_budget_s(env_of(container, _config_maps()))
    assert pod["terminationGracePeriodSeconds"] > budget


def test_hardened_pod():
    container = _container()
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and security["runAsNonRoot"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    pod = by_kind(_base(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 10001  # the image's user (Dockerfile)
    volumes = {v["name"]: v for v in pod["volumes"]}
    (tmp,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert "emptyDir" in volumes[tmp["name"]]


def test_hpa_metric_is_served_and_adapted():
    hpa = by_kind(_base(), "HorizontalPodAutoscaler")["spec"]
    kinds = {m["type"] for m in hpa["metrics"]}
    assert kinds == {"Resource", "Pods"}
    (pods,) = [m["pods"] for m in hpa["metrics"] if m["type"] == "Pods"]
    name = pods["metric"]["name"]
    assert f"\n{name} " in ServiceMetrics(16).render().decode(), f"the service exports no {name}"
    values = yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text())
    adapted = {rule["name"]["as"]: rule for rule in values["rules"]["custom"]}
    assert name in adapted, f"no Prometheus adapter rule serves {name}"
    assert adapted[name]["seriesQuery"].startswith(name + "{")
    assert set(adapted[name]["resources"]["overrides"]) == {"namespace", "pod"}


def test_scrape_annotations_point_at_metrics():
    annotations = by_kind(_base(), "Deployment")["spec"]["template"]["metadata"]["annotations"]
    ports = {str(p["containerPort"]) for p in _container()["ports"]}
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert annotations["prometheus.io/port"] in ports
