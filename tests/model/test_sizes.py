"""A config's size is known before it is built: counted from two blocks, shaped on the meta device."""

from __future__ import annotations

import dataclasses

import pytest
from safetensors.torch import save_file

from model import build_model
from model.checkpoint import load_checkpoint
from model.lucidrains_import import _key_plan, lucidrains_config
from model.sizes import SizeError, check_count, check_memory, count_at_depth, meta_shapes, shapes_of
from support.helpers import tiny_mlm_config, tiny_vision_config


@pytest.mark.parametrize("config", [tiny_vision_config(), tiny_mlm_config(attn_dim=16)])
def test_the_count_from_two_blocks_is_the_built_models(config) -> None:
    deep = dataclasses.replace(config, depth=7)
    counted = count_at_depth(lambda c: len(meta_shapes(build_model, c)), deep)
    assert counted == len(build_model(deep).state_dict())
    assert meta_shapes(build_model, deep) == shapes_of(build_model(deep).state_dict())


def test_the_lucidrains_plan_is_counted_without_listing_it() -> None:
    args = {"num_tokens": 50, "dim": 8, "depth": 5, "seq_len": 4, "circulant_matrix": True, "attn_dim": 4}
    config = lucidrains_config(args)
    assert count_at_depth(lambda c: len(_key_plan(c, True)), config) == len(_key_plan(config, True))


def test_a_count_out_of_proportion_is_refused_a_near_miss_is_not() -> None:
    config = tiny_vision_config()
    check_count(2 * 10 + 64, 10, "w", config)  # a few keys missing: named one by one later
    with pytest.raises(SizeError, match=r"w holds 10 tensors, its config declares 85 \(depth"):
        check_count(2 * 10 + 65, 10, "w", config)


def test_sizes_beyond_any_tensor_or_memory_are_refused() -> None:
    huge = dataclasses.replace(tiny_vision_config(), d_model=10**10, d_ffn=8 * 10**10)
    with pytest.raises(SizeError, match="larger than any tensor"):
        meta_shapes(build_model, huge)
    with pytest.raises(SizeError, match=r"needs 3,725.3 GiB as float32"):
        check_memory({"w": (10**12,)}, "w")


def test_a_checkpoint_is_checked_against_its_header(tmp_path, tiny_vision_checkpoint) -> None:
    """A header that declares no data (a [10**9, 0] tensor) is a shape mismatch, not a 10**9 row head."""
    import shutil

    import torch
    from safetensors.torch import load_file

    bad = tmp_path / "bad"
    shutil.copytree(tiny_vision_checkpoint, bad)
    state = load_file(bad / "model.safetensors")
    state["head.weight"] = torch.zeros(10**9, 0)
    save_file(state, bad / "model.safetensors")
    with pytest.raises(ValueError, match=r"key 'head.weight' has shape \(1000000000, 0\)"):
        load_checkpoint(bad)
