"""Helpers shared by the tests (a plain module, so no conftest.py name clash across folders)."""

from __future__ import annotations

CIFAR_LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def perturbed(model):
    """A model whose weights are moved away from the init (zero head, W ~ 0), so outputs differ per input."""
    import torch

    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.05)
    return model.eval()


def tiny_vision_config(**overrides):
    from model import get_config

    return get_config("gmlp_cifar_p4", **{"depth": 2, "d_model": 32, "d_ffn": 64, **overrides})


def tiny_mlm_config(**overrides):
    from model import get_config

    return get_config("gmlp_mlm_small", **{"depth": 2, "d_model": 32, "d_ffn": 64, "n": 32, **overrides})
