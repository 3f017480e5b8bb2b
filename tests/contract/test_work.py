"""The MAC counts of `contract.work` against torch's own FLOP counter on the paper's modules: a
whole vision classifier (tiny and gMLP-S/16), and single blocks with and without aMLP's tiny
attention and with a multi-head Spatial Gating Unit."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from contract.work import block_macs, vision_macs
from model import build_model, get_config
from model.layers import GMLPBlock
from support.helpers import tiny_vision_config


def _flops(module: torch.nn.Module, *inputs: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(*inputs)
    return int(counter.get_total_flops())


@pytest.mark.parametrize("config", [tiny_vision_config(), get_config("gmlp_s16_224")], ids=["tiny", "s16"])
def test_vision_macs_are_what_torch_counts(config) -> None:
    """Every matrix product of a forward pass (patch conv, channel and spatial projections, head),
    as torch's FLOP counter sees them, is 2 x the MACs the config's shapes imply, per image."""
    shape = config.to_dict()
    model = build_model(config).eval()
    images = torch.zeros(2, shape["in_chans"], shape["img_size"], shape["img_size"])
    assert _flops(model, images) == 2 * 2 * vision_macs(shape)


@pytest.mark.parametrize(("attn_dim", "heads"), [(None, 1), (16, 1), (None, 4)])
def test_block_macs_are_what_torch_counts(attn_dim: int | None, heads: int) -> None:
    shape = {"d_model": 32, "d_ffn": 96, "n": 24, "attn_dim": attn_dim}
    block = GMLPBlock(32, 96, 24, attn_dim=attn_dim, heads=heads).eval()
    assert _flops(block, torch.zeros(3, 24, 32)) == 3 * 2 * block_macs(shape)


@pytest.mark.parametrize(
    "model",
    [
        {},
        {"d_model": 32, "d_ffn": 64},  # no tokens
        {"d_model": 32, "d_ffn": 64, "n": True},  # a bool is not a size
        {"d_model": 32.0, "d_ffn": 64, "n": 8},
        {"d_model": 32, "d_ffn": -64, "n": 8},
        {"d_model": 32, "d_ffn": 64, "img_size": 2, "patch_size": 4},  # no whole patch
    ],
)
def test_a_config_without_sound_shapes_counts_nothing(model: dict) -> None:
    assert block_macs(model) is None and vision_macs(model) is None
