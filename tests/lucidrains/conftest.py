"""g-mlp-pytorch itself (the `dev` extra installs it from PyPI), and its models converted and
exported as a user would: the reference forward is the package's own code."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import g_mlp_pytorch as package
import pytest
import torch

from gmlp.cli import main as gmlp
from support.helpers import BERT_TOKENIZER
from support.lucidrains import ALL_VARIANTS, CASES, reference_model


@pytest.fixture(scope="session")
def g_mlp_pytorch() -> ModuleType:
    """The installed `g_mlp_pytorch` module (gMLP, gMLPVision)."""
    return package


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
