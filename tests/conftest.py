"""Shared fixtures: tiny real models (random weights), saved and exported as the product does it,
the committed sample data, and the `shared_data` marker's skip for tests that need the full data sets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The suite's servers (in-process and the `gmlp serve` processes, which inherit this) run ONNX
# Runtime on every machine: the default `auto` picks OpenVINO on a CPU with bf16 instructions, and
# the tests' expectations (variants, providers, exact scores) are ONNX Runtime's. `auto`'s choice
# and OpenVINO itself have tests of their own that set the backend they test.
os.environ["GMLP_BACKEND"] = "onnxruntime"

# The shared helpers assert too: rewrite their asserts as pytest does the tests' own.
pytest.register_assert_rewrite("support")

from support.helpers import (  # noqa: E402 - after the rewrite hook, which must come first
    BERT_TOKENIZER,
    CIFAR_LABELS,
    CIFAR_SAMPLE_NPZ,
    SHARED_DATA_ENV,
    perturbed,
    shared_data_dir,
    tiny_mlm_config,
    tiny_vision_config,
)

# Each test's kind follows from where it lives, so that no test needs to be marked by hand:
# `unit` runs code in-process (a session, a pipeline, a parser: seconds), `integration` starts real
# servers on 127.0.0.1, `e2e` runs the product's processes, containers and third-party programs.
KINDS = (
    ("e2e", ("deploy", "gmlp", "loadtests", "benchmarks")),
    ("integration", ("service/http", "service/v2", "service/access", "lucidrains")),
    ("unit", ("",)),
)
TESTS_ROOT = Path(__file__).resolve().parent


def test_kind(path: Path) -> str:
    """`unit`, `integration` or `e2e` for a test file under tests/, by its folder."""
    where = path.resolve().relative_to(TESTS_ROOT).as_posix()
    return next(kind for kind, folders in KINDS if any(where.startswith(f) for f in folders))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its kind; skip the `shared_data` tests where the full data sets are
    absent (asked for by name, `-m shared_data`, their absence is an error instead, so that CI
    cannot pass by skipping them)."""
    for item in items:
        item.add_marker(test_kind(item.path))
    try:
        if shared_data_dir() is not None:
            return
    except FileNotFoundError as exc:  # GMLP_SHARED_DATA names no folder
        raise pytest.UsageError(str(exc)) from None
    if config.getoption("markexpr", "") == "shared_data":
        raise pytest.UsageError(f"-m shared_data: no full data sets here (set {SHARED_DATA_ENV})")
    skip = pytest.mark.skip(reason=f"needs the full data sets (CIFAR-10, Gutenberg): set {SHARED_DATA_ENV}")
    for item in items:
        if "shared_data" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder holding the full data sets (the tests using it are skipped without one)."""
    root = shared_data_dir()
    if root is None:
        pytest.skip(f"needs the full data sets: set {SHARED_DATA_ENV}")
    return root


def _checkpoint(tmp_path_factory, name: str, config) -> Path:
    import torch

    from model import build_model, save_checkpoint

    # Seeded: the int8 export checks a tiny random model's top-1 agreement (>= 80 %), which an
    # unlucky unseeded draw can miss, and a fixture must be the same model in every run.
    torch.manual_seed(0)
    model = perturbed(build_model(config))
    path = tmp_path_factory.mktemp("checkpoints") / name
    if config.task == "image-classification":
        save_checkpoint(model, path, labels=CIFAR_LABELS[: config.num_classes])
    else:
        save_checkpoint(model, path, tokenizer=BERT_TOKENIZER)
    return path


@pytest.fixture(scope="session")
def tiny_vision_checkpoint(tmp_path_factory) -> Path:
    return _checkpoint(tmp_path_factory, "tiny-vision", tiny_vision_config())


@pytest.fixture(scope="session")
def tiny_mlm_checkpoint(tmp_path_factory) -> Path:
    return _checkpoint(tmp_path_factory, "tiny-mlm", tiny_mlm_config())


@pytest.fixture(scope="session")
def tiny_amlp_checkpoint(tmp_path_factory) -> Path:
    return _checkpoint(tmp_path_factory, "tiny-amlp", tiny_mlm_config(attn_dim=16))


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory, tiny_vision_checkpoint, tiny_mlm_checkpoint) -> Path:
    """A served-model repository holding a tiny classifier and a tiny MLM (fp32 + int8 each)."""
    from export import export_served_model

    repo = tmp_path_factory.mktemp("repository")
    export_served_model(tiny_vision_checkpoint, repo / "tiny-vision", ["fp32", "int8"])
    export_served_model(tiny_mlm_checkpoint, repo / "tiny-mlm", ["fp32", "int8"])
    return repo


@pytest.fixture(scope="session")
def tiny_vision_served(model_repository) -> Path:
    return model_repository / "tiny-vision"


@pytest.fixture(scope="session")
def tiny_mlm_served(model_repository) -> Path:
    return model_repository / "tiny-mlm"


@pytest.fixture(scope="session")
def cifar_images() -> list[bytes]:
    """20 CIFAR-10 test images as JPEG files (from the committed sample)."""
    import numpy as np

    data = np.load(CIFAR_SAMPLE_NPZ)
    jpeg, offsets = data["test_jpeg"], data["test_offsets"]
    return [jpeg[offsets[i] : offsets[i + 1]].tobytes() for i in range(20)]
