"""g-mlp-pytorch itself, from PyPI: installed once (`pip install --no-deps --target`) into `.cache/`,
beside this interpreter's torch, so that the reference forward is the package's own code."""

from __future__ import annotations

import shutil
import subprocess
import sys
from types import ModuleType
from typing import Any

import torch

from support.helpers import REPO_ROOT

PACKAGE = "g-mlp-pytorch==0.1.5"
REQUIREMENTS = [PACKAGE, "einops==0.8.2"]
CACHE = REPO_ROOT / ".cache" / "g-mlp-pytorch-0.1.5"
VOCAB = 30522  # the test tokenizer's (BERT's) vocabulary; gMLP's num_tokens must match it

# The constructor arguments tested, tiny (the suite runs on 2 cores).
VISION = {"image_size": 16, "patch_size": 4, "num_classes": 5, "dim": 16, "depth": 2}
LANGUAGE = {"num_tokens": VOCAB, "dim": 16, "depth": 2, "seq_len": 8}
CASES = {
    "vision": VISION,
    "vision-heads-attn": {**VISION, "heads": 4, "attn_dim": 8},
    "lm": LANGUAGE,
    "lm-heads": {**LANGUAGE, "heads": 4},
    "lm-circulant": {**LANGUAGE, "heads": 2, "circulant_matrix": True},
    "lm-attn": {**LANGUAGE, "attn_dim": 8},
    "lm-shift-act": {**LANGUAGE, "shift_tokens": 1, "act": "Tanh"},
}
# These are exported in every variant; the others in fp32 only (the export checks each variant).
ALL_VARIANTS = {"vision-heads-attn", "lm-circulant", "lm-shift-act"}


def install() -> str | None:
    """Install into CACHE unless it is there; the error text when pip fails."""
    if (CACHE / "g_mlp_pytorch" / "g_mlp_pytorch.py").is_file():
        return None
    staging = CACHE.with_name(CACHE.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(staging)]
    done = subprocess.run([*command, *REQUIREMENTS], capture_output=True, text=True, timeout=600)
    if done.returncode:
        return done.stderr[-2000:]
    staging.rename(CACHE)
    return None


def reference_model(g_mlp_pytorch: ModuleType, args: dict[str, Any], seed: int = 0) -> torch.nn.Module:
    """The package's model for JSON constructor `args`, every weight perturbed (its init leaves W
    near 0 and b = 1, an SGU close to the identity, which would make parity weak)."""
    kwargs = dict(args)
    if "act" in kwargs:
        kwargs["act"] = getattr(torch.nn, kwargs["act"])()
    torch.manual_seed(seed)
    cls = g_mlp_pytorch.gMLPVision if "image_size" in args else g_mlp_pytorch.gMLP
    model = cls(**kwargs).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.1)
    return model
