"""What a config declares, counted and shaped before anything is built, against what the weights hold.

A config is a few lines of text, and what it declares costs memory in proportion: `depth: 1000000`
beside a weights file of two floats would plan ten million conversion keys (gigabytes) before the
first shape was compared, and `d_model: 4096` beside a small file would allocate the declared model
first and compare after. So the order is:

1. the weights' shapes, from the safetensors header (`header_shapes`: no tensor data is read);
2. the config's tensor count, extrapolated from one and two blocks (`count_at_depth`: every block
   is alike), refused when it is out of proportion with the weights' (`check_count`);
3. every shape the config declares, from a meta-device build (`meta_shapes`: meta tensors hold no
   data, whatever their size), compared key by key with the weights' (naming each mismatch);
4. the model's float32 size against the memory this process may use (`check_memory`), since some
   weights are smaller than the model they make (a circulant SGU's n values, an n x n matrix).

Only then is the model built for real.
"""

from __future__ import annotations

import dataclasses
import math
import os
import resource
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from contract.errors import UserError

from .configs import GMLPConfig

Shapes = dict[str, tuple[int, ...]]
# A config may declare a few tensors more than the weights hold (a key lost on the way, named as
# missing) but not out of proportion: at most twice as many, plus this many.
COUNT_SLACK = 64


class SizeError(UserError):
    """A config that declares far more than its weights hold, or more than a tensor can."""


def header_shapes(path: Path) -> Shapes:
    """The shape of every tensor of the safetensors file `path`, read from its header alone
    (SafetensorError or OSError when it is not one)."""
    with safe_open(str(path), framework="pt") as weights:
        return {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}  # noqa: SIM118


def shapes_of(state: Mapping[str, torch.Tensor]) -> Shapes:
    return {key: tuple(value.shape) for key, value in state.items()}


def meta_shapes(build: Callable[[Any], nn.Module], config: GMLPConfig) -> Shapes:
    """The state dict's shapes of `build(config)`, built on the meta device (no tensor data)."""
    try:
        with torch.device("meta"):
            return shapes_of(build(config).state_dict())
    except RuntimeError as exc:  # "Storage size calculation overflowed": beyond any tensor
        raise SizeError(f"the config declares tensors larger than any tensor can be: {exc}") from None
    except (TypeError, ValueError) as exc:  # a size that is no whole number (8.5, "8")
        raise SizeError(f"the config's sizes cannot be built: {exc}") from None


def count_at_depth(count: Callable[[GMLPConfig], int], config: GMLPConfig) -> int:
    """`count(config)` at the config's depth, from its values at depth 1 and 2 (every block alike),
    so that no more than two blocks are ever built or planned to learn it."""
    one, two = (count(dataclasses.replace(config, depth=depth)) for depth in (1, 2))
    return one + (config.depth - 1) * (two - one)


def check_count(declared: int, held: int, source: str, config: GMLPConfig) -> None:
    """Refuse a config that declares more than twice the tensors the weights hold (plus
    COUNT_SLACK): listing its keys to name the missing ones would cost memory out of proportion
    with the weights, and no near miss is that far off."""
    if declared > 2 * held + COUNT_SLACK:
        raise SizeError(
            f"{source} holds {held:,} tensors, its config declares {declared:,} (depth {config.depth}, "
            f"d_model {config.d_model}, d_ffn {config.d_ffn}): the config does not describe these weights"
        )


def memory_limit() -> int:
    """Bytes this process may hold at most: the machine's memory, or the address-space limit
    (RLIMIT_AS) when that is lower."""
    limit = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return limit if soft == resource.RLIM_INFINITY else min(limit, soft)


def check_memory(shapes: Shapes, source: str) -> None:
    """Refuse to build a model of `shapes` (float32) that cannot fit in memory: shapes can match
    weights far smaller than the model (a circulant SGU's n values become an n x n matrix)."""
    needed = 4 * sum(math.prod(shape) for shape in shapes.values())
    limit = memory_limit()
    if needed > limit:
        raise SizeError(
            f"{source}: the model it declares needs {needed / 2**30:,.1f} GiB as float32, more than "
            f"the {limit / 2**30:,.1f} GiB this process may use"
        )
