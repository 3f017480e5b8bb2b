"""Load models trained with g-mlp-pytorch (lucidrains, PyPI 0.1.5): constructor arguments + state_dict.

Its `gMLPVision` and `gMLP` (language model) map onto our classifier and masked LM:

    to_patch_embed.1.*  (Linear over c*p*p)   -> patch_embed.proj.*  (the same weights as a Conv2d)
    to_embed.weight                           -> embed.weight
    layers.N.fn.norm.*                        -> blocks.N.norm.*
    layers.N.fn[.fn].fn.proj_in.0.*           -> blocks.N.proj_in.*   (.fn twice in gMLP: token shift)
    ...attn.to_qkv.weight / attn.to_out.*     -> blocks.N.attn.qkv.weight (bias 0) / attn.proj.*
    ...sgu.norm.*                             -> blocks.N.sgu.norm.*
    ...sgu.weight [h, n, n], sgu.bias [h, n]  -> blocks.N.sgu.spatial_proj.* ([n, n], [n] for h = 1)
    ...sgu.weight [h, n] + circulant_pos_x/_y -> the same, the circulant matrix materialised
    ...proj_out.*                             -> blocks.N.proj_out.*
    to_logits.0.*                             -> norm.*
    to_logits.2.* (vision) / to_logits.1.*    -> head.* / decoder.weight + decoder_bias

Every LayerNorm of the package has PyTorch's default eps, 1e-5. Its options become config fields
(`heads`, `gate_act`, `shift_tokens`, untied decoder); `causal` is refused (docs/model.md,
"Public gMLP layouts").
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from contract.errors import UserError

from .checkpoint import CheckpointError, GMLPModel, build_model, check_state_shapes, load_state_dict_strict
from .configs import GATE_ACTIVATIONS, GMLPConfig, GMLPMaskedLMConfig, GMLPVisionConfig
from .sizes import check_count, check_memory, count_at_depth, meta_shapes, shapes_of

_REQUIRED = object()
# The constructors' arguments and their defaults in g-mlp-pytorch 0.1.5.
VISION_ARGS: dict[str, Any] = {
    **dict.fromkeys(("image_size", "patch_size", "num_classes", "dim", "depth"), _REQUIRED),
    **{"heads": 1, "ff_mult": 4, "channels": 3, "attn_dim": None, "prob_survival": 1.0},
}
LANGUAGE_ARGS: dict[str, Any] = {
    **dict.fromkeys(("num_tokens", "dim", "depth", "seq_len"), _REQUIRED),
    **{"heads": 1, "ff_mult": 4, "attn_dim": None, "prob_survival": 1.0},
    **{"causal": False, "circulant_matrix": False, "shift_tokens": 0, "act": "identity"},
}
LUCIDRAINS_EPS = 1e-5


def _square(value: Any, name: str, problems: list[str]) -> int:
    """An int, or a pair of equal ints (the package takes either); anything else is a problem."""
    if value is _REQUIRED:
        return 1  # already named as missing
    if isinstance(value, list | tuple) and len(value) == 2 and value[0] == value[1]:
        value = value[0]
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    problems.append(f"{name}={value!r}: only square images and patches (one positive int) are served")
    return 1


def lucidrains_config(
    args: dict[str, Any], *, pad_token_id: int = 0, mask_token_id: int = 103
) -> GMLPVisionConfig | GMLPMaskedLMConfig:
    """Our config for g-mlp-pytorch constructor `args`: `gMLPVision` when they name `image_size`,
    `gMLP` otherwise. Raises naming every argument it cannot honour."""
    vision = "image_size" in args
    spec, cls_name = (VISION_ARGS, "gMLPVision") if vision else (LANGUAGE_ARGS, "gMLP")
    problems = [f"{k!r} is not an argument of {cls_name}" for k in args if k not in spec]
    problems += [
        f"missing argument {k!r} of {cls_name}" for k, v in spec.items() if v is _REQUIRED and k not in args
    ]
    values = {**spec, **args}
    for key in ("dim", "depth", "heads", "ff_mult", "num_classes", "channels", "seq_len", "num_tokens"):
        value = values.get(key, _REQUIRED)  # absent: not an argument of this class, or named missing
        if key == "num_tokens" and value is None:
            problems.append("num_tokens=None: a gMLP without embedding and logits has nothing to serve")
        elif value is not _REQUIRED and not (isinstance(value, int) and value > 0):
            problems.append(f"{key}={value!r} must be a positive int")
    if values["attn_dim"] is not None and not (
        isinstance(values["attn_dim"], int) and values["attn_dim"] > 0
    ):
        problems.append(f"attn_dim={values['attn_dim']!r} must be a positive int or null")
    if values.get("causal"):
        problems.append(
            "causal=true: an autoregressive gMLP predicts the next token, which neither /classify "
            "nor /fill-mask answers; causal models are not converted"
        )
    # 'Tanh', 'nn.Tanh()', None ... -> our `gate_act` name (lower case, or the raw value).
    act = values.get("act")
    act = "identity" if act is None else str(act).strip().lower().removeprefix("nn.").removesuffix("()")
    if act not in GATE_ACTIVATIONS:
        problems.append(
            f"act={values.get('act')!r}: supported gate activations are {', '.join(GATE_ACTIVATIONS)}"
        )
    shift = values.get("shift_tokens", 0)
    if not isinstance(shift, int) or shift < 0:
        problems.append(f"shift_tokens={shift!r} must be an int >= 0")
    if vision:
        img_size = _square(values["image_size"], "image_size", problems)
        patch_size = _square(values["patch_size"], "patch_size", problems)
    if problems:
        raise CheckpointError(f"cannot convert this {cls_name}: " + "; ".join(problems))
    common = {
        "depth": values["depth"],
        "d_model": values["dim"],
        "d_ffn": values["dim"] * values["ff_mult"],
        "attn_dim": values["attn_dim"],
        "heads": values["heads"],
        "norm_eps": LUCIDRAINS_EPS,
        "sgu_norm_eps": LUCIDRAINS_EPS,
    }
    try:
        if vision:
            return GMLPVisionConfig(
                **common,
                img_size=img_size,
                patch_size=patch_size,
                in_chans=values["channels"],
                num_classes=values["num_classes"],
            )
        return GMLPMaskedLMConfig(
            **common,
            gate_act=act,
            shift_tokens=shift,
            vocab_size=values["num_tokens"],
            n=values["seq_len"],
            pad_token_id=pad_token_id,
            mask_token_id=mask_token_id,
            max_predictions=min(16, values["seq_len"]),
            tie_embeddings=False,
        )
    except UserError as exc:
        raise CheckpointError(f"cannot convert this {cls_name}: {exc}") from exc


Plan = list[tuple[str, str | None, tuple[int, ...]]]


def _with_bias(theirs: str, ours: str, shape: tuple[int, ...]) -> Plan:
    """A weight of `shape` and a bias of its first dimension, as Linear and LayerNorm hold them."""
    return [(theirs + "weight", ours + "weight", shape), (theirs + "bias", ours + "bias", shape[:1])]


def _key_plan(config: GMLPConfig, circulant: bool) -> Plan:
    """(g-mlp-pytorch key, our key or None when folded into another, its shape), in order."""
    d, f, n, h = config.d_model, config.d_ffn, config.seq_len, config.heads
    e = f // 2
    if isinstance(config, GMLPVisionConfig):
        plan = _with_bias(
            "to_patch_embed.1.", "patch_embed.proj.", (d, config.in_chans * config.patch_size**2)
        )
        head = _with_bias("to_logits.2.", "head.", (config.num_classes, d))
        inner = "fn."
    else:
        assert isinstance(config, GMLPMaskedLMConfig)
        vocab = config.vocab_size
        plan = [("to_embed.weight", "embed.weight", (vocab, d))]
        head = [
            ("to_logits.1.weight", "decoder.weight", (vocab, d)),
            ("to_logits.1.bias", "decoder_bias", (vocab,)),
        ]
        inner = "fn.fn."  # the token shift's wrapper
    for i in range(config.depth):
        theirs, ours = f"layers.{i}.fn.", f"blocks.{i}."
        block = theirs + inner
        plan += _with_bias(theirs + "norm.", ours + "norm.", (d,)) + _with_bias(
            block + "proj_in.0.", ours + "proj_in.", (f, d)
        )
        plan += _with_bias(block + "sgu.norm.", ours + "sgu.norm.", (e,)) + [
            (block + "sgu.weight", ours + "sgu.spatial_proj.weight", (h, n) if circulant else (h, n, n)),
            (block + "sgu.bias", ours + "sgu.spatial_proj.bias", (h, n)),
        ]
        if circulant:
            plan += [(block + f"sgu.circulant_pos_{axis}", None, (h, n)) for axis in "xy"]
        if config.attn_dim:
            plan.append((block + "attn.to_qkv.weight", ours + "attn.qkv.weight", (3 * config.attn_dim, d)))
            plan += _with_bias(block + "attn.to_out.", ours + "attn.proj.", (e, config.attn_dim))
        plan += _with_bias(block + "proj_out.", ours + "proj_out.", (d, e))
    return plan + _with_bias("to_logits.0.", "norm.", (d,)) + head


def circulant_weight(weight: torch.Tensor, pos_x: torch.Tensor, pos_y: torch.Tensor) -> torch.Tensor:
    """The SGU matrix [h, n, n] of a circulant SGU, as g-mlp-pytorch builds it in every forward.

    Its construction (pad to 2n, repeat, reshape to rows of 2n - 1, keep the last n columns) puts
    w[n - 1 + j - i] at row i, column j for j <= i and 0 above the diagonal; rows and columns are
    then scaled by pos_x and pos_y, in that order, so the values are bit for bit the package's.
    """
    n = weight.shape[-1]
    index = n - 1 + torch.arange(n)[None, :] - torch.arange(n)[:, None]  # in [0, 2n - 2]
    matrix = F.pad(weight, (0, n))[:, index]
    return matrix * pos_x[:, :, None] * pos_y[:, None, :]


def gmlp_from_lucidrains(
    args: dict[str, Any],
    state: dict[str, torch.Tensor],
    source: str = "g-mlp-pytorch state_dict",
    *,
    pad_token_id: int = 0,
    mask_token_id: int = 103,
) -> GMLPModel:
    """Our model for g-mlp-pytorch constructor `args` and its `state_dict`; strict about every
    argument, key and shape (raises naming each one)."""
    config = lucidrains_config(args, pad_token_id=pad_token_id, mask_token_id=mask_token_id)
    circulant = bool(args.get("circulant_matrix"))
    # The plan's length follows the config's depth: counted from two blocks before it is listed.
    check_count(count_at_depth(lambda c: len(_key_plan(c, circulant)), config), len(state), source, config)
    plan = _key_plan(config, circulant)
    check_state_shapes({theirs: shape for theirs, _, shape in plan}, shapes_of(state), source)
    check_memory(meta_shapes(build_model, config), source)  # a circulant SGU's n values -> n x n
    converted: dict[str, torch.Tensor] = {}
    for theirs, ours, _ in plan:
        if ours is None:
            continue
        value = state[theirs].float()
        if ours.endswith("sgu.spatial_proj.weight") and circulant:
            block = theirs.removesuffix("weight")
            value = circulant_weight(
                value, state[block + "circulant_pos_x"], state[block + "circulant_pos_y"]
            )
        if "sgu.spatial_proj" in ours and config.heads == 1:
            value = value[0]  # [n, n] and [n]: the single-head layout (timm's)
        if ours == "patch_embed.proj.weight":
            assert isinstance(config, GMLPVisionConfig)
            # The package's patches are (c, p1, p2)-ordered rows: exactly a Conv2d kernel's layout.
            value = value.reshape(config.d_model, config.in_chans, config.patch_size, config.patch_size)
        converted[ours] = value
        if ours.endswith("attn.qkv.weight"):  # the package's qkv projection has no bias
            converted[ours.removesuffix("weight") + "bias"] = value.new_zeros(value.shape[0])
    model = build_model(config)
    load_state_dict_strict(model, converted, source)
    return model.eval()
