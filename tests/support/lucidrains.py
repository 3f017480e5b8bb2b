"""The g-mlp-pytorch models the parity tests build: their constructor arguments, and the
package's model with every weight perturbed."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

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
