"""g-mlp-pytorch itself, installed from PyPI, and its models converted and exported as a user would.

The package is installed once (`pip install --no-deps --target`) into `.cache/`, beside this
interpreter's torch: the reference forward is the package's own code. Offline, its tests are
skipped with the reason; under CI (env CI set) a failed install fails them instead, so CI cannot
pass by skipping.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from gmlp.cli import main as gmlp
from support.helpers import BERT_TOKENIZER
from support.lucidrains import ALL_VARIANTS, CACHE, CASES, PACKAGE, install, reference_model


@pytest.fixture(scope="session")
def g_mlp_pytorch() -> ModuleType:
    """The installed `g_mlp_pytorch` module (gMLP, gMLPVision)."""
    error = install()
    if error is not None:
        message = f"pip could not install {PACKAGE} from PyPI: {error}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    if str(CACHE) not in sys.path:
        sys.path.insert(0, str(CACHE))
    return importlib.import_module("g_mlp_pytorch")


@pytest.fixture(scope="session")
def convert(
    g_mlp_pytorch: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., tuple[torch.nn.Module, Path]]:
    """Factory: (the package's model, our checkpoint directory converted by the CLI from its
    saved state_dict and arguments); cached by name."""
    made: dict[str, tuple[torch.nn.Module, Path]] = {}

    def make(name: str, args: dict[str, Any]) -> tuple[torch.nn.Module, Path]:
        if name not in made:
            root = tmp_path_factory.mktemp(name)
            reference = reference_model(g_mlp_pytorch, args)
            torch.save(reference.state_dict(), root / "state.pt")
            (root / "args.json").write_text(json.dumps(args))
            extra = [] if "image_size" in args else ["--tokenizer", str(BERT_TOKENIZER)]
            command = ["convert-lucidrains", str(root / "state.pt"), "--config", str(root / "args.json")]
            assert gmlp([*command, "--out", str(root / "checkpoint"), *extra]) == 0
            made[name] = reference, root / "checkpoint"
        return made[name]

    return make


@pytest.fixture(scope="session")
def served(
    convert: Callable[..., tuple[torch.nn.Module, Path]], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], tuple[torch.nn.Module, Path]]:
    """Factory: (the package's model, our served directory) for a case name; cached."""
    made: dict[str, tuple[torch.nn.Module, Path]] = {}

    def make(name: str) -> tuple[torch.nn.Module, Path]:
        if name not in made:
            reference, checkpoint = convert(name, CASES[name])
            out = tmp_path_factory.mktemp("served") / name
            variants = "fp32,int8,fp16" if name in ALL_VARIANTS else "fp32"
            assert gmlp(["export", str(checkpoint), "--out", str(out), "--variants", variants]) == 0
            made[name] = reference, out
        return made[name]

    return make
