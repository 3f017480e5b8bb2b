"""The PyTorch gMLP: shapes, exact sizes, the paper's init property, batch independence, padding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import perturbed, tiny_mlm_config, tiny_vision_config
from model import (
    GMLPForMaskedLM,
    GMLPVisionClassifier,
    build_model,
    get_config,
    load_checkpoint,
    save_checkpoint,
)
from model.layers import GMLPBlock


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("name", "expected"),
    [("gmlp_ti16_224", 5_867_328), ("gmlp_s16_224", 19_422_656), ("gmlp_b16_224", 73_075_392)],
)
def test_named_vision_configs_match_timm_parameter_counts(name, expected):
    with torch.device("meta"):  # no memory or init time for the 73M model
        model = build_model(get_config(name))
    assert n_params(model) == expected


@pytest.mark.parametrize(("img", "patch", "n"), [(32, 4, 64), (32, 8, 16), (48, 16, 9), (224, 16, 196)])
def test_vision_shapes(img, patch, n):
    config = tiny_vision_config(img_size=img, patch_size=patch, num_classes=7)
    assert config.seq_len == n
    model = build_model(config)
    x = torch.randn(3, 3, img, img)
    assert model.forward_features(x).shape == (3, n, config.d_model)
    assert model(x).shape == (3, 7)


def test_vision_rejects_other_image_sizes():
    model = build_model(tiny_vision_config())
    with pytest.raises(ValueError, match="32x32"):
        model(torch.randn(1, 3, 64, 64))


@pytest.mark.parametrize("attn_dim", [None, 16])
def test_mlm_shapes(attn_dim):
    config = tiny_mlm_config(attn_dim=attn_dim)
    model = build_model(config)
    ids = torch.randint(1, config.vocab_size, (2, config.n))
    assert model(ids).shape == (2, config.n, config.vocab_size)
    positions = torch.tensor([[0, 5, 7], [1, 2, 31]])
    assert model(ids, positions=positions).shape == (2, 3, config.vocab_size)


def test_mlm_logits_at_positions_equal_full_logits():
    config = tiny_mlm_config()
    model = perturbed(build_model(config))
    ids = torch.randint(1, config.vocab_size, (3, config.n))
    positions = torch.tensor([[0, 4, 4], [31, 2, 9], [5, 6, 7]])
    with torch.no_grad():
        full = model(ids)
        selected = model(ids, positions=positions)
    expected = torch.stack([full[b, positions[b]] for b in range(3)])
    torch.testing.assert_close(selected, expected, rtol=0, atol=1e-5)


def test_block_is_plain_ffn_at_init():
    """Paper section 2: with W ~ 0 and b = 1 the SGU passes z1 through, so a block is an FFN."""
    torch.manual_seed(0)
    block = GMLPBlock(d_model=32, d_ffn=64, seq_len=16)
    block.init_weights()
    x = torch.randn(4, 16, 32)
    with torch.no_grad():
        z = F.gelu(block.proj_in(block.norm(x)))
        z1 = z[..., :32]
        ffn = x + block.proj_out(z1)
        assert torch.allclose(block.sgu(z), z1, atol=1e-5)
        assert (block(x) - ffn).abs().max() < 5e-5  # ~1e-5: |W| ~ 1e-6 summed over n tokens
    torch.testing.assert_close(block.sgu.spatial_proj.bias, torch.ones(16))


@pytest.mark.parametrize("batch", [1, 3])
def test_sgu_matches_the_token_linear_formulation(batch):
    """The SGU's batched GEMM against the paper's formula written independently, as timm writes it:
    a Linear over the transposed tokens (with padding rows zeroed and a gate residual added), in
    the forward and in the gradients of W, b and the input."""
    torch.manual_seed(0)
    block = GMLPBlock(d_model=8, d_ffn=12, seq_len=10)
    sgu = block.sgu
    with torch.no_grad():
        sgu.spatial_proj.weight.normal_(std=0.3)
        sgu.spatial_proj.bias.normal_()
    z = torch.randn(batch, 10, 12, requires_grad=True)
    mask = torch.ones(batch, 10, 1)
    mask[0, 7:] = 0.0
    residual = torch.randn(batch, 10, 6)

    z1, z2 = z[..., :6], z[..., 6:]
    z2 = F.layer_norm(z2, (6,), sgu.norm.weight, sgu.norm.bias, sgu.norm.eps) * mask
    gate = F.linear(z2.transpose(1, 2), sgu.spatial_proj.weight, sgu.spatial_proj.bias).transpose(1, 2)
    expected = z1 * (gate + residual)
    grads_expected = torch.autograd.grad(
        expected.square().sum(), [z, sgu.spatial_proj.weight, sgu.spatial_proj.bias]
    )

    actual = sgu(z, token_mask=mask, gate_residual=residual)
    grads_actual = torch.autograd.grad(
        actual.square().sum(), [z, sgu.spatial_proj.weight, sgu.spatial_proj.bias]
    )
    torch.testing.assert_close(actual, expected)
    for got, want in zip(grads_actual, grads_expected, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("make", [tiny_vision_config, tiny_mlm_config, lambda: tiny_mlm_config(attn_dim=8)])
def test_no_leakage_across_the_batch(make):
    """Changing sample j must never change sample i's output (W mixes tokens, never samples)."""
    config = make()
    model = perturbed(build_model(config))
    if isinstance(model, GMLPVisionClassifier):
        x = torch.randn(4, 3, config.img_size, config.img_size)
        y = x.clone()
        y[2] = torch.randn_like(y[2])
    else:
        x = torch.randint(1, config.vocab_size, (4, config.n))
        y = x.clone()
        y[2] = torch.randint(1, config.vocab_size, (config.n,))
    with torch.no_grad():
        a, b = model(x), model(y)
    keep = [0, 1, 3]
    torch.testing.assert_close(a[keep], b[keep], rtol=0, atol=1e-6)
    assert (a[2] - b[2]).abs().max() > 1e-4


def test_amlp_forward_backward():
    config = tiny_mlm_config(attn_dim=16)
    model = perturbed(build_model(config)).train()
    ids = torch.randint(1, config.vocab_size, (2, config.n))
    ids[:, 20:] = config.pad_token_id
    loss = F.cross_entropy(model(ids).flatten(0, 1), torch.randint(0, config.vocab_size, (2 * config.n,)))
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
    assert model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    assert model.blocks[0].sgu.spatial_proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("attn_dim", [None, 8])
def test_padding_takes_no_part_in_token_mixing(attn_dim):
    """Documented padding rule: what sits at the [PAD] positions cannot reach the real tokens.

    We change the [PAD] embedding itself: real-token logits stay the same, while the logits of
    a model run without the token mask do change (so the test can see a leak when there is one).
    """
    config = tiny_mlm_config(attn_dim=attn_dim)
    model = perturbed(build_model(config))
    ids = torch.randint(1000, config.vocab_size, (2, config.n))
    ids[:, 12:] = config.pad_token_id
    with torch.no_grad():
        before = model(ids)[:, :12]
        unmasked_before = _logits_without_mask(model, ids)[:, :12]
        model.embed.weight[config.pad_token_id] += torch.randn(config.d_model)
        after = model(ids)[:, :12]
        unmasked_after = _logits_without_mask(model, ids)[:, :12]
    # The decoder is tied to the embedding, so the [PAD] logit itself (column 0) moves; no other.
    torch.testing.assert_close(before[..., 1:], after[..., 1:], rtol=0, atol=1e-5)
    assert (unmasked_before - unmasked_after).abs().max() > 1e-3


def _logits_without_mask(model: GMLPForMaskedLM, ids: torch.Tensor) -> torch.Tensor:
    x = model.embed(ids)
    for block in model.blocks:
        x = block(x, None)
    return model.forward_head(model.norm(x))


@pytest.mark.parametrize("make", [tiny_vision_config, lambda: tiny_mlm_config(attn_dim=8)])
def test_checkpoint_round_trip(tmp_path, make):
    from gmlp.paths import BERT_TOKENIZER
    from helpers import CIFAR_LABELS

    config = make()
    model = perturbed(build_model(config))
    save_checkpoint(model, tmp_path / "ckpt", labels=CIFAR_LABELS, tokenizer=BERT_TOKENIZER)
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert "model.safetensors" in files and "config.json" in files
    assert ("labels.json" in files) == (config.task == "image-classification")
    loaded = load_checkpoint(tmp_path / "ckpt")
    assert not loaded.training and loaded.config == config
    if config.task == "image-classification":
        x = torch.randn(2, 3, config.img_size, config.img_size)
    else:
        x = torch.randint(1, config.vocab_size, (2, config.n))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_load_checkpoint_errors_name_the_problem(tmp_path, tiny_vision_checkpoint):
    import shutil

    from safetensors.torch import load_file, save_file

    from model import CheckpointError

    bad = tmp_path / "bad"
    shutil.copytree(tiny_vision_checkpoint, bad)
    state = load_file(bad / "model.safetensors")
    del state["blocks.1.sgu.spatial_proj.bias"]
    save_file(state, bad / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing key 'blocks\.1\.sgu\.spatial_proj\.bias'"):
        load_checkpoint(bad)
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_checkpoint(bad)
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(tmp_path)
