"""The PyTorch gMLP: shapes, exact sizes, the paper's init property, batch independence, padding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model import (
    GMLPForMaskedLM,
    GMLPVisionClassifier,
    build_model,
    get_config,
    load_checkpoint,
    save_checkpoint,
)
from model.layers import GMLPBlock
from support.helpers import perturbed, tiny_mlm_config, tiny_vision_config

# g-mlp-pytorch's options together: a multi-head SGU, a gate activation, a token shift, an untied decoder.
OPTIONS = {"heads": 4, "shift_tokens": 1, "gate_act": "gelu", "tie_embeddings": False}
MLM_VARIANTS = [{"attn_dim": None}, {"attn_dim": 8}, {"attn_dim": 8, **OPTIONS}]


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


@pytest.mark.parametrize(("batch", "length"), [(1, 10), (3, 10), (3, 8), (2, 1)])
def test_sgu_matches_the_token_linear_formulation(batch, length):
    """The SGU's batched GEMM against the paper's formula written independently, as timm writes it:
    a Linear over the transposed tokens (with padding rows zeroed and a gate residual added), in
    the forward and in the gradients of W, b and the input. A sequence shorter than n = 10 is a
    Linear with W's top-left length x length block, so the rest of W gets no gradient."""
    torch.manual_seed(0)
    block = GMLPBlock(d_model=8, d_ffn=12, seq_len=10)
    sgu = block.sgu
    with torch.no_grad():
        sgu.spatial_proj.weight.normal_(std=0.3)
        sgu.spatial_proj.bias.normal_()
    z = torch.randn(batch, length, 12, requires_grad=True)
    mask = torch.ones(batch, length, 1)
    mask[0, 7:] = 0.0
    residual = torch.randn(batch, length, 6)

    z1, z2 = z[..., :6], z[..., 6:]
    z2 = F.layer_norm(z2, (6,), sgu.norm.weight, sgu.norm.bias, sgu.norm.eps) * mask
    top_left = sgu.spatial_proj.weight[:length, :length]
    gate = F.linear(z2.transpose(1, 2), top_left, sgu.spatial_proj.bias[:length]).transpose(1, 2)
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
    assert grads_actual[1][:length, :length].abs().sum() > 0


def _autograd_ops(tensor: torch.Tensor) -> set[str]:
    """Names of every backward node that produced `tensor`."""
    seen, todo = set(), [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node.name() not in seen:
            seen.add(node.name())
            todo += [next_fn for next_fn, _ in node.next_functions]
    return seen


def test_sgu_slices_w_only_for_shorter_sequences():
    """At the full length the training path is the plain baddbmm on W itself (no slice of W or
    of its gradient); a shorter sequence slices W."""
    sgu = GMLPBlock(d_model=8, d_ffn=12, seq_len=10).sgu
    full, short = sgu(torch.randn(2, 10, 12)), sgu(torch.randn(2, 6, 12))
    assert not any("Slice" in op for op in _autograd_ops(full)) and "BaddbmmBackward0" in _autograd_ops(full)
    assert "SliceBackward0" in _autograd_ops(short)


@pytest.mark.parametrize("options", MLM_VARIANTS)
def test_mlm_at_any_length_equals_the_padded_window(options):
    """A text run at its own length L (1..n), or padded only to a batch's longest text, gives the
    same logits at its masked positions as the same text padded to the full window n, for 1 to
    max_predictions positions: the top-left block of W is exact, not an approximation."""
    config = tiny_mlm_config(**options)
    model = perturbed(build_model(config))
    gen = torch.Generator().manual_seed(3)
    for length in range(1, config.n + 1):
        ids = torch.randint(1000, config.vocab_size, (3, length), generator=gen)
        real = torch.tensor([length, max(1, length // 2), 1])  # rows 1 and 2 padded inside L
        ids[torch.arange(length)[None, :] >= real[:, None]] = config.pad_token_id
        for count in (1, 1 + length % config.max_predictions, config.max_predictions):
            positions = (torch.rand(3, count, generator=gen) * real[:, None]).long()
            with torch.no_grad():
                short = model(ids, positions=positions)
                window = F.pad(ids, (0, config.n - length), value=config.pad_token_id)
                expected = model(window, positions=positions)
            assert short.shape == (3, count, config.vocab_size)
            torch.testing.assert_close(short, expected, rtol=0, atol=1e-5)
    assert expected.abs().max() > 1e-2  # not a comparison of two zero tensors


def test_mlm_refuses_more_than_n_tokens():
    config = tiny_mlm_config()
    model = build_model(config)
    with pytest.raises(ValueError, match=r"33 tokens.*n=32"):
        model(torch.ones(1, config.n + 1, dtype=torch.long))


@pytest.mark.parametrize(
    "make",
    [
        tiny_vision_config,
        lambda: tiny_vision_config(heads=2, attn_dim=8),
        tiny_mlm_config,
        lambda: tiny_mlm_config(attn_dim=8),
        lambda: tiny_mlm_config(**OPTIONS),
    ],
)
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


@pytest.mark.parametrize("options", MLM_VARIANTS)
def test_padding_takes_no_part_in_token_mixing(options):
    """Documented padding rule: what sits at the [PAD] positions cannot reach the real tokens.

    We change the [PAD] embedding itself: real-token logits stay the same, while the logits of
    a model run without the token mask do change (so the test can see a leak when there is one).
    """
    config = tiny_mlm_config(**options)
    model = perturbed(build_model(config))
    ids = torch.randint(1000, config.vocab_size, (2, config.n))
    ids[:, 12:] = config.pad_token_id
    with torch.no_grad():
        before = model(ids)[:, :12]
        unmasked_before = _logits_without_mask(model, ids)[:, :12]
        model.embed.weight[config.pad_token_id] += torch.randn(config.d_model)
        after = model(ids)[:, :12]
        unmasked_after = _logits_without_mask(model, ids)[:, :12]
    # A decoder tied to the embedding moves the [PAD] logit itself (column 0); no other moves.
    torch.testing.assert_close(before[..., 1:], after[..., 1:], rtol=0, atol=1e-5)
    assert (unmasked_before - unmasked_after).abs().max() > 1e-3


def _logits_without_mask(model: GMLPForMaskedLM, ids: torch.Tensor) -> torch.Tensor:
    x = model.embed(ids)
    for block in model.blocks:
        x = block(x, None)
    return model.forward_head(model.norm(x))


@pytest.mark.parametrize("make", [tiny_vision_config, lambda: tiny_mlm_config(attn_dim=8)])
def test_checkpoint_round_trip(tmp_path, make):
    from support.helpers import BERT_TOKENIZER, CIFAR_LABELS

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
