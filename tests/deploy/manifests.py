"""Shared by the deploy tests: render the kustomizations, load the schemas kubernetes-validate ships.

Rendering uses `kubectl kustomize` (the same renderer `kubectl apply -k` uses). Without kubectl the
tests skip, except in CI, where a missing kubectl is an error rather than a silently empty check.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.settings import ServiceSettings
from support.helpers import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"
K8S = DEPLOY / "k8s"
# The oldest Kubernetes minor still widely run, and the newest kubernetes-validate knows.
K8S_VERSIONS = ("1.29", "latest")


def required_tool(name: str, needed_for: str, install: str) -> str:
    """The path of the command `name`; without it the test skips saying why, except in CI, where
    its absence is an error rather than a silently empty check."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is needed to {needed_for} and is not installed ({install})")
        pytest.skip(f"{name} is not installed ({install}): cannot {needed_for}")
    return path


def kubectl() -> str:
    return required_tool("kubectl", "render the kustomizations", "kubectl with kustomize")


@cache
def render(directory: Path) -> tuple[dict[str, Any], ...]:
    """The documents `kubectl kustomize <directory>` renders."""
    out = subprocess.run(
        [kubectl(), "kustomize", str(directory)], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def by_kind(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def resolve_version(version: str) -> str:
    import kubernetes_validate.utils as kv

    return kv.major_minor(kv.latest_version() if version == "latest" else version)


@cache
def k8s_definitions(version: str) -> dict[str, Any]:
    """The strict (no unknown fields) OpenAPI definitions of Kubernetes `version`, as JSON schema."""
    minor = resolve_version(version)
    path = f"kubernetes-json-schema/v{minor}.0-local-strict/_definitions.json"
    return json.loads(resources.files("kubernetes_validate").joinpath(path).read_text())


def setting_env_names() -> set[str]:
    """Every environment variable the service reads (`GMLP_` + a ServiceSettings field)."""
    return {f"GMLP_{name.upper()}" for name in ServiceSettings.model_fields}


def env_of(container: dict[str, Any], config_maps: list[dict[str, Any]]) -> dict[str, Any]:
    """The container's environment: its `env` entries over the ConfigMaps it takes `envFrom`."""
    env: dict[str, Any] = {}
    for source in container.get("envFrom", []):
        (cm,) = [c for c in config_maps if c["metadata"]["name"] == source["configMapRef"]["name"]]
        env.update(cm["data"])
    for item in container.get("env", []):
        env[item["name"]] = item.get("value", item.get("valueFrom"))
    return env


def shutdown_budget_s(env: dict[str, Any]) -> float:
    """Seconds the service may take to stop after SIGTERM: deadline + drain + 1 (service/server.py)."""
    settings = ServiceSettings(
        request_timeout_s=env.get("GMLP_REQUEST_TIMEOUT_S", ServiceSettings().request_timeout_s),
        drain_timeout_s=env.get("GMLP_DRAIN_TIMEOUT_S", ServiceSettings().drain_timeout_s),
    )
    return settings.request_timeout_s + settings.drain_timeout_s + 1


def pre_stop_sleep_s(container: dict[str, Any]) -> float:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep", command
    return float(command[1])
