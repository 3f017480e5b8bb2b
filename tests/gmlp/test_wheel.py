"""The wheel, installed with `[serve]` into a fresh venv and run from another directory, serves a
model repository: nothing it needs is left in the checkout, and no default points into it or into
site-packages.

The wheel is built from a copy of only what pyproject.toml packages (as the Docker images copy
it), so a file the package reads but does not ship fails here. The venv has no torch (what the
serving image installs); pip's cache keeps the install to seconds after the first run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from contract.image import ImageTransform
from contract.spec import read_spec
from gmlp.server_process import free_port
from service.http.playground import STATIC
from support.helpers import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# What the installed package must find on its own: its data files, and the defaults it resolves.
PROBE = """
import importlib.util, json
import service
from gmlp.paths import IMAGENET_CLASS_INDEX
from loadtests.workload import LoadConfig, load_images, load_sentences
from service.settings import ServiceSettings
from service.http.playground import STATIC

settings = ServiceSettings()
print(json.dumps({
    "package": service.__file__,
    "torch": importlib.util.find_spec("torch") is not None,
    "imagenet_labels": len(json.loads(IMAGENET_CLASS_INDEX.read_text(encoding="utf-8"))),
    "bundled_images": len(load_images()[0]),
    "bundled_sentences": len(load_sentences(LoadConfig())[0]),
    "playground": sorted(p.relative_to(STATIC).as_posix() for p in STATIC.rglob("*") if p.is_file()),
    "model_repository": str(settings.model_repository.resolve()),
    "checkpoint_dir": str(settings.checkpoint_dir.resolve()),
}))
"""


def _run(*cmd: str | Path, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _clean_env() -> dict[str, str]:
    """This process's environment without what would let the venv see the checkout or our settings."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("GMLP_")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv (no torch) with the freshly built wheel installed as `gmlp-serve[serve]`."""
    import tomllib

    root = tmp_path_factory.mktemp("wheel")
    env = _clean_env()
    src = root / "src"
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    for name in sorted(packages):
        shutil.copytree(REPO_ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", pyproject["project"]["readme"]):
        shutil.copy2(REPO_ROOT / name, src / name)
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", src, "-w", root / "dist", cwd=root, env=env)
    (wheel,) = (root / "dist").glob("gmlp_serve-*.whl")
    venv = root / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=root, env=env)
    python = venv / "bin" / "python"
    constraints = REPO_ROOT / "constraints.txt"
    _run(python, "-m", "pip", "install", "-q", "-c", constraints, f"{wheel}[serve]", cwd=root, env=env)
    return venv


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory outside the checkout, with no models/ or checkpoints/ of its own."""
    return tmp_path_factory.mktemp("elsewhere")


def test_the_installed_package_carries_its_data_and_defaults_to_the_working_directory(
    installed: Path, elsewhere: Path
) -> None:
    facts = json.loads(_run(installed / "bin" / "python", "-c", PROBE, cwd=elsewhere, env=_clean_env()))
    assert Path(facts["package"]).is_relative_to(installed)  # the wheel's copy, not the checkout's
    assert not facts["torch"]
    assert facts["imagenet_labels"] == 1000
    assert facts["bundled_images"] >= 1 and facts["bundled_sentences"] >= 1
    shipped = sorted(p.relative_to(STATIC).as_posix() for p in STATIC.rglob("*") if p.is_file())
    assert facts["playground"] == shipped
    assert facts["model_repository"] == str((elsewhere / "models").resolve())
    assert facts["checkpoint_dir"] == str((elsewhere / "checkpoints").resolve())


@pytest.fixture(scope="module")
def served(installed: Path, elsewhere: Path, model_repository: Path) -> Iterator[str]:
    """`gmlp serve --model-repository DIR` of the installed wheel, run from `elsewhere`; its URL."""
    port = free_port()
    log_path = elsewhere / "serve.log"
    cmd = [installed / "bin" / "gmlp", "serve", "--model-repository", model_repository]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--grpc-port", "0"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(c) for c in cmd], cwd=elsewhere, env=_clean_env(), stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"gmlp serve exited:\n{log_path.read_text(errors='replace')}"
            try:
                if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"not ready:\n{log_path.read_text(errors='replace')}"
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_gmlp_serve_from_the_wheel_classifies(
    served: str, tiny_vision_served: Path, cifar_images: list[bytes]
) -> None:
    image = cifar_images[3]
    models = {m["name"]: m for m in httpx.get(f"{served}/models", timeout=10).json()["models"]}
    variant = models["tiny-vision"]["variant"]
    answer = httpx.post(
        f"{served}/classify",
        params={"model": "tiny-vision", "top_k": 3},
        files={"file": ("cifar.jpg", image, "image/jpeg")},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    top = answer.json()["predictions"][0]
    # The same model file run here, in the checkout's environment, without the service.
    spec = read_spec(tiny_vision_served)
    assert spec is not None
    pixels = ImageTransform.for_model(spec.config, 10**8)(image)
    session = ort.InferenceSession(
        str(tiny_vision_served / spec.variants[variant]), providers=["CPUExecutionProvider"]
    )
    logits = session.run(None, {"pixel_values": pixels[None]})[0][0].astype(np.float64)
    labels = json.loads((tiny_vision_served / "labels.json").read_text())
    assert top["label"] == labels[int(logits.argmax())]
    probs = np.exp(logits - logits.max())
    assert top["score"] == pytest.approx(float(probs.max() / probs.sum()), abs=1e-5)


def test_the_wheel_serves_the_playground_and_offline_docs(served: str) -> None:
    page = httpx.get(served, headers={"accept": "text/html"}, timeout=10)
    assert page.status_code == 200 and "ui/app.js" in page.text
    for path in ("/ui/app.js", "/ui/style.css", "/ui/samples/cat.jpg", "/ui/vendor/swagger-ui-bundle.js"):
        assert httpx.get(served + path, timeout=10).status_code == 200, path
