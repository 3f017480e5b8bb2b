"""Keys and certificates reach the service from secrets only: the Kubernetes component mounts Secret
volumes and probes over HTTPS, the compose and swarm overlays use Docker secrets, and no committed
file holds key or certificate material."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from manifests import DEPLOY, K8S, K8S_VERSIONS, by_kind, render, resolve_version, setting_env_names

ROOT = DEPLOY.parent


def _with_access(tmp_path: Path) -> tuple[dict, ...]:
    """The base rendered with the access component, as a user's overlay would include it."""
    base = os.path.relpath(K8S, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {base}\ncomponents:\n  - {base}/access\n"
    )
    return render(tmp_path)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_k8s_access_component_is_valid(tmp_path: Path, version: str) -> None:
    for doc in _with_access(tmp_path):
        kubernetes_validate.validate(doc, resolve_version(version), strict=True)


def test_the_k8s_access_component_reads_secret_volumes_and_probes_https(tmp_path: Path) -> None:
    pod = by_kind(_with_access(tmp_path), "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {"GMLP_API_KEYS_FILE", "GMLP_TLS_CERT", "GMLP_TLS_KEY", "GMLP_CPUS"} <= set(env)
    assert set(env) <= setting_env_names()
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"api-keys": "gmlp-serve-api-keys", "tls": "gmlp-serve-tls"}
    for name, variable in (
        ("api-keys", "GMLP_API_KEYS_FILE"),
        ("tls", "GMLP_TLS_CERT"),
        ("tls", "GMLP_TLS_KEY"),
    ):
        assert env[variable].startswith(mounts[name] + "/")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
        assert container[probe]["httpGet"]["path"].startswith("/health/")  # open routes: no key
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]
    # The base stays as it was: plain HTTP, no secrets needed to try it.
    base = by_kind(render(K8S), "Deployment")["spec"]["template"]["spec"]
    assert "volumes" not in base or not any("secret" in v for v in base["volumes"])


def _compose_config(*files: Path) -> dict:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker is not installed")
    # A Docker client without the Compose plugin says so in its own words (which differ between
    # client versions): ask for the plugin's version first.
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"docker compose is not installed: {probe.stderr.strip()[:200]}")
    args = [docker, "compose", "--project-directory", str(ROOT)]
    for file in files:
        args += ["-f", str(file)]
    run = subprocess.run([*args, "config"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return yaml.safe_load(run.stdout)


@pytest.mark.parametrize(
    "files",
    [
        (ROOT / "docker-compose.yml", DEPLOY / "compose" / "access.yml"),
        (DEPLOY / "swarm" / "stack.yml", DEPLOY / "swarm" / "access.yml"),
    ],
    ids=["compose", "swarm"],
)
def test_the_docker_overlays_read_docker_secrets(files: tuple[Path, Path]) -> None:
    config = _compose_config(*files)
    api = config["services"]["api"]
    targets = {s["source"]: s.get("target", s["source"]) for s in api["secrets"]}
    for variable, value in api["environment"].items():
        if variable in ("GMLP_API_KEYS_FILE", "GMLP_TLS_CERT", "GMLP_TLS_KEY"):
            source = value.rsplit("/", 1)[-1]
            assert value == f"/run/secrets/{source}" and source in targets
    assert "GMLP_API_KEYS_FILE" in api["environment"]
    assert api["healthcheck"]["test"] == ["CMD", "python", "-m", "service.healthcheck"]


def test_no_committed_file_holds_keys_or_certificates() -> None:
    material = re.compile(r"-----BEGIN [A-Z ]*(PRIVATE KEY|CERTIFICATE)-----|sha256:[0-9a-f]{64}")
    files = [
        ROOT / "docker-compose.yml",
        ROOT / "Dockerfile",
        *sorted(p for p in DEPLOY.rglob("*") if p.is_file()),
    ]
    found = [str(p.relative_to(ROOT)) for p in files if material.search(p.read_text(errors="replace"))]
    assert not found
