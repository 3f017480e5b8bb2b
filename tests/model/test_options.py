"""The SGU options beyond the paper (g-mlp-pytorch's): several heads, a gate activation, a token
shift and an untied decoder, each against its definition written out independently."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from contract.errors import UserError
from model import build_model, load_checkpoint, save_checkpoint
from model.layers import GMLPBlock, shift_tokens
from support.helpers import BERT_TOKENIZER, perturbed, tiny_mlm_config


@pytest.mark.parametrize("length", [10, 6, 1])
def test_multi_head_sgu_is_one_token_mixing_per_channel_slice(length):
    """Head h mixes channels [h*e/H, (h+1)*e/H) of the normalised gate with W[h] (top-left block
    for a shorter text) and b[h]; the activation applies after the gate residual."""
    torch.manual_seed(0)
    heads, e = 3, 6
    sgu = GMLPBlock(d_model=8, d_ffn=2 * e, seq_len=10, heads=heads, gate_act="tanh").sgu
    with torch.no_grad():
        sgu.spatial_proj.weight.normal_(std=0.3)
        sgu.spatial_proj.bias.normal_()
    assert sgu.spatial_proj.weight.shape == (heads, 10, 10)
    z = torch.randn(2, length, 2 * e)
    mask = torch.ones(2, length, 1)
    mask[1, length // 2 + 1 :] = 0.0
    residual = torch.randn(2, length, e)

    z1, z2 = z[..., :e], z[..., e:]
    z2 = F.layer_norm(z2, (e,), sgu.norm.weight, sgu.norm.bias, sgu.norm.eps) * mask
    width = e // heads
    gate = torch.empty(2, length, e)
    for h in range(heads):
        weight = sgu.spatial_proj.weight[h, :length, :length]
        bias = sgu.spatial_proj.bias[h, :length]
        for i in range(length):
            mixed = (weight[i, :, None] * z2[:, :, h * width : (h + 1) * width]).sum(dim=1)
            gate[:, i, h * width : (h + 1) * width] = mixed + bias[i]
    expected = z1 * torch.tanh(gate + residual)

    with torch.no_grad():
        actual = sgu(z, token_mask=mask, gate_residual=residual)
    torch.testing.assert_close(actual, expected)


def test_token_shift_moves_channel_groups_along_the_tokens():
    """s = 1 on 7 channels: groups of 7 // 3 = 2 channels; group 0 reads token i + 1, group 1
    token i, group 2 token i - 1, the leftover channel stays; zeros come in at the ends."""
    x = torch.randn(2, 5, 7)
    out = shift_tokens(x, 1)
    for i in range(5):
        ahead = x[:, i + 1, 0:2] if i + 1 < 5 else torch.zeros(2, 2)
        behind = x[:, i - 1, 4:6] if i >= 1 else torch.zeros(2, 2)
        torch.testing.assert_close(out[:, i], torch.cat([ahead, x[:, i, 2:4], behind, x[:, i, 6:]], dim=-1))
    assert shift_tokens(x[:, :1], 1).shape == (2, 1, 7)  # a one-token text


def test_untied_decoder_and_options_survive_a_checkpoint(tmp_path):
    config = tiny_mlm_config(heads=4, shift_tokens=2, gate_act="silu", tie_embeddings=False, attn_dim=8)
    model = perturbed(build_model(config))
    assert model.decoder is not None and model.decoder.weight.data_ptr() != model.embed.weight.data_ptr()
    save_checkpoint(model, tmp_path / "ck", tokenizer=BERT_TOKENIZER)
    loaded = load_checkpoint(tmp_path / "ck")
    assert loaded.config == config
    ids = torch.randint(1000, config.vocab_size, (2, config.n))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"heads": 5}, "heads=5 must divide the gate's 32 channels"),
        ({"gate_act": "softplus"}, "gate_act 'softplus' is not one of"),
        ({"shift_tokens": 16}, "shift_tokens=16 needs"),
    ],
)
def test_configs_refuse_options_they_cannot_build(options, message):
    with pytest.raises(UserError, match=message):
        tiny_mlm_config(**options)
