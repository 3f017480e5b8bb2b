"""deploy/k8s/kserve: the ServingRuntime and InferenceService match KServe's CRD schemas and each other."""

from __future__ import annotations

import jsonschema
import kubernetes_validate
import pytest
from kserve_schema import inference_service, serving_runtime
from manifests import (
    K8S,
    K8S_VERSIONS,
    by_kind,
    env_of,
    k8s_definitions,
    pre_stop_sleep_s,
    render,
    resolve_version,
    setting_env_names,
    shutdown_budget_s,
)


def _docs():
    return render(K8S / "kserve")


def _runtime():
    return by_kind(_docs(), "ServingRuntime")


def _isvc():
    return by_kind(_docs(), "InferenceService")


def _container():
    (container,) = _runtime()["spec"]["containers"]
    return container


def _env():
    return env_of(_container(), [d for d in _docs() if d["kind"] == "ConfigMap"])


def _errors(schema, doc):
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_resources_match_the_crd_schemas(version):
    defs = k8s_definitions(version)
    assert not _errors(serving_runtime(defs), _runtime())
    assert not _errors(inference_service(defs), _isvc())
    config_map = by_kind(_docs(), "ConfigMap")
    kubernetes_validate.validate(config_map, resolve_version(version), strict=True)
    assert {d["kind"] for d in _docs()} == {"ConfigMap", "ServingRuntime", "InferenceService"}


def test_schema_rejects_what_kserve_would_drop():
    """The check can fail: an unknown field, a wrong type or protocol, a bad container all count."""
    defs = k8s_definitions("latest")
    bad = [
        {**_isvc(), "spec": {"predictor": {**_isvc()["spec"]["predictor"], "minReplica": 2}}},
        {**_isvc(), "spec": {"predictor": {"model": {"protocolVersion": "v3"}}}},
        {**_isvc(), "spec": {"predictor": {"maxReplicas": "10"}}},
    ]
    for doc in bad:
        assert _errors(inference_service(defs), doc), doc["spec"]
    container = {**_container(), "readinessProbe": {"httpGet": {"path": "/", "prot": 1}}}
    runtime = {**_runtime(), "spec": {**_runtime()["spec"], "containers": [container]}}
    assert _errors(serving_runtime(defs), runtime)


def test_inference_service_selects_this_runtime_with_v2():
    runtime, model = _runtime(), _isvc()["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["protocolVersion"] == "v2" and "v2" in runtime["spec"]["protocolVersions"]
    annotations = _isvc()["metadata"]["annotations"]
    assert annotations["serving.kserve.io/deploymentMode"] == "RawDeployment"


def test_container_serves_on_the_predictor_port():
    container, env = _container(), _env()
    assert container["name"] == "kserve-container"  # the container KServe merges `model` into
    assert {p["containerPort"] for p in container["ports"]} == {int(env["GMLP_PORT"])}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["port"] == int(env["GMLP_PORT"]) and get["path"].startswith("/v2/health/"), probe
    assert _isvc()["metadata"]["annotations"]["prometheus.kserve.io/port"] == env["GMLP_PORT"]


def test_runtime_settings_threads_and_shutdown():
    container, env = _container(), _env()
    assert not set(env) - setting_env_names()
    ref = env["GMLP_CPUS"]["resourceFieldRef"]
    assert (ref["containerName"], ref["resource"]) == (container["name"], "limits.cpu")
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and security["runAsNonRoot"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    grace = _isvc()["spec"]["predictor"]["terminationGracePeriodSeconds"]
    assert grace > pre_stop_sleep_s(container) + shutdown_budget_s(env)
