"""Checkpoint directories: `model.safetensors` + `config.json` + `labels.json` or `tokenizer.json`.

The format (docs/formats.md) is what training writes, `gmlp convert-timm` writes and
`gmlp export` reads. Weights are safetensors only: nothing a user hands us is unpickled.

timm's gMLP checkpoints (`timm/models/mlp_mixer.py`, gmlp_*16_224) load with a pure key rename
(`gmlp_from_timm`), timm's key names and ours being:

    stem.proj.*                          -> patch_embed.proj.*
    blocks.N.norm.*                      -> blocks.N.norm.*
    blocks.N.mlp_channels.fc1.*          -> blocks.N.proj_in.*         (U)
    blocks.N.mlp_channels.gate.norm.*    -> blocks.N.sgu.norm.*
    blocks.N.mlp_channels.gate.proj.*    -> blocks.N.sgu.spatial_proj.* (W, b)
    blocks.N.mlp_channels.fc2.*          -> blocks.N.proj_out.*        (V)
    norm.*, head.*                       -> unchanged

timm applies the gate as `proj(v.transpose(-1, -2)).transpose(-1, -2)`, which is `W @ v + b[:, None]`:
the same W as ours, so no tensor is transposed on the way.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from contract.errors import UserError
from contract.formats import CHECKPOINT_FORMAT, CONFIG_FILE, TASKS
from contract.json_file import read_json_file, read_json_object

from .configs import GMLPConfig, GMLPMaskedLMConfig, GMLPVisionConfig, config_from_dict, get_config
from .mlm import GMLPForMaskedLM
from .sizes import Shapes, check_count, check_memory, count_at_depth, header_shapes, meta_shapes, shapes_of
from .vision import GMLPVisionClassifier

FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
LABELS_FILE = "labels.json"
TOKENIZER_FILE = "tokenizer.json"


# Either of the two model families; both carry `config` and `checkpoint_info`.
GMLPModel = GMLPVisionClassifier | GMLPForMaskedLM


class CheckpointError(UserError):
    """A checkpoint that cannot be used as it is; the message says what is wrong and where."""


def build_model(config: GMLPConfig) -> GMLPModel:
    """A freshly initialised model for `config` (vision classifier or masked LM)."""
    if isinstance(config, GMLPVisionConfig):
        return GMLPVisionClassifier(config)
    if isinstance(config, GMLPMaskedLMConfig):
        return GMLPForMaskedLM(config)
    raise TypeError(f"no model for config type {type(config).__name__}")


def file_sha256(path: str | Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def save_checkpoint(
    model: GMLPModel,
    path: str | Path,
    *,
    labels: list[str] | None = None,
    tokenizer: str | Path | None = None,
    preprocessing: dict[str, Any] | None = None,
    name: str | None = None,
) -> Path:
    """Write `model` as a checkpoint directory and return its path.

    A classifier needs `labels` (one per class); a masked LM needs `tokenizer`, the path of a
    `tokenizers` JSON file whose vocabulary size matches the model's.
    """
    config = model.config
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    if isinstance(config, GMLPVisionConfig):
        if labels is None or len(labels) != config.num_classes:
            raise CheckpointError(
                f"a classifier needs {config.num_classes} labels, got {labels and len(labels)}"
            )
        (out / LABELS_FILE).write_text(json.dumps(list(labels), indent=1))
        named = {"labels": LABELS_FILE}
        default = {
            "crop_size": config.img_size,
            "resize_size": config.img_size,
            "crop_pct": 1.0,
            "interpolation": "bicubic",
            "mean": [0.5, 0.5, 0.5],
            "std": [0.5, 0.5, 0.5],
        }
    else:
        if tokenizer is None:
            raise CheckpointError("a masked LM checkpoint needs its tokenizer.json")
        if Path(tokenizer).resolve() != (out / TOKENIZER_FILE).resolve():
            shutil.copyfile(tokenizer, out / TOKENIZER_FILE)
        named = {"tokenizer": TOKENIZER_FILE}
        default = {
            "max_length": config.n,
            "pad_token_id": config.pad_token_id,
            "mask_token_id": config.mask_token_id,
        }
    info = {
        "format": CHECKPOINT_FORMAT,
        "format_version": FORMAT_VERSION,
        "name": name or out.resolve().name,
        "task": config.task,
        "seq_len": config.seq_len,
        "model": config.to_dict(),
        "preprocessing": preprocessing or default,  # recorded when the caller gives none
        **named,
    }
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, out / WEIGHTS_FILE, metadata={"format": "pt", "task": config.task})
    (out / CONFIG_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return out


def check_state_shapes(expected: Shapes, held: Shapes, source: str) -> None:
    """Raise naming every missing, unexpected or mis-shaped key of `held` against `expected`."""
    problems = [f"missing key {k!r}" for k in expected if k not in held]
    problems += [f"unexpected key {k!r}" for k in held if k not in expected]
    problems += [
        f"key {k!r} has shape {held[k]}, the model expects {shape}"
        for k, shape in expected.items()
        if k in held and held[k] != shape
    ]
    if problems:
        shown = "; ".join(problems[:10]) + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise CheckpointError(f"{source} does not fit the model: {shown}")


def load_state_dict_strict(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load `state` into `model` or raise naming every missing, unexpected or mis-shaped key."""
    check_state_shapes(shapes_of(model.state_dict()), shapes_of(state), source)
    model.load_state_dict(state, strict=True)


def build_for(config: GMLPConfig, held: Shapes, source: str) -> GMLPModel:
    """A fresh model for `config`, built only once the weights' shapes `held` fit it: first the
    count of tensors, then every shape, both without allocating the model (`model.sizes`), so a
    config out of proportion with its weights is refused before it costs memory."""
    declared = count_at_depth(lambda c: len(meta_shapes(build_model, c)), config)
    check_count(declared, len(held), source, config)
    expected = meta_shapes(build_model, config)
    check_state_shapes(expected, held, source)
    check_memory(expected, source)
    return build_model(config)


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a PyTorch checkpoint (.pt, .pth, .pth.tar, .bin or .safetensors), never
    unpickling objects (`torch.load(weights_only=True)`).

    Training checkpoints wrap the weights as {"state_dict": ...}, {"model": ...} or
    {"state_dict_ema": ...}; those are unwrapped, and a `module.` prefix from DataParallel dropped.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    state: Any
    try:
        if path.suffix == ".safetensors":
            state = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt or non-tensor files
        raise CheckpointError(f"cannot read {path} as a weights-only checkpoint: {exc}") from exc
    if isinstance(state, dict):
        for wrapper in ("state_dict_ema", "state_dict", "model"):
            if isinstance(state.get(wrapper), dict):
                state = state[wrapper]
                break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} does not hold a state dict of tensors")
    return {k.removeprefix("module."): v for k, v in state.items()}


_TIMM_KEY_MAP = [
    (r"^stem\.proj\.", "patch_embed.proj."),
    (r"^blocks\.(\d+)\.mlp_channels\.fc1\.", r"blocks.\1.proj_in."),
    (r"^blocks\.(\d+)\.mlp_channels\.gate\.norm\.", r"blocks.\1.sgu.norm."),
    (r"^blocks\.(\d+)\.mlp_channels\.gate\.proj\.", r"blocks.\1.sgu.spatial_proj."),
    (r"^blocks\.(\d+)\.mlp_channels\.fc2\.", r"blocks.\1.proj_out."),
]
# timm's data config for gmlp_*16_224 (timm.data defaults with mean = std = 0.5).
TIMM_PREPROCESSING = {
    "crop_size": 224,
    "resize_size": 256,
    "crop_pct": 0.875,
    "interpolation": "bicubic",
    "mean": [0.5, 0.5, 0.5],
    "std": [0.5, 0.5, 0.5],
}


def gmlp_from_timm(
    state: dict[str, torch.Tensor], arch: str = "gmlp_s16_224", source: str = "timm checkpoint"
) -> GMLPVisionClassifier:
    """Our classifier for named config `arch` with timm's weights; strict about every key and shape.

    The number of classes is read from `head.weight`, so fine-tuned timm models load too.
    """
    head = state.get("head.weight")
    if head is None:
        raise CheckpointError(f"{source}: missing key 'head.weight' (is this a timm gMLP checkpoint?)")
    config = get_config(arch, num_classes=head.shape[0])
    if not isinstance(config, GMLPVisionConfig):
        raise CheckpointError(f"{arch} is not a vision config")
    renamed = {}
    for key, value in state.items():
        for pattern, replacement in _TIMM_KEY_MAP:
            key = re.sub(pattern, replacement, key)
        renamed[key] = value  # the tensors are the same
    model = build_for(config, shapes_of(renamed), source)
    model.load_state_dict(renamed, strict=True)
    return cast(GMLPVisionClassifier, model.eval())


def read_checkpoint_config(path: str | Path) -> tuple[dict[str, Any], GMLPConfig]:
    """Checkpoint directory `path`'s parsed config.json and its model config, checked for the
    fields we rely on (CheckpointError or UserError, one line, otherwise)."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"{root} is not a directory (expected a checkpoint directory)")
    cfg_path = root / CONFIG_FILE
    if not cfg_path.is_file():
        raise CheckpointError(f"{root} has no {CONFIG_FILE}; is it a checkpoint directory?")
    info = read_json_object(cfg_path)  # bounded and deep-safe
    if info.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{cfg_path}: format is {info.get('format')!r}, expected {CHECKPOINT_FORMAT!r}")
    for key in ("task", "model"):
        if key not in info:
            raise CheckpointError(f"{cfg_path} lacks {key!r}")
    if info["task"] not in TASKS:
        raise CheckpointError(f"{cfg_path}: unknown task {info['task']!r}")
    try:
        config = config_from_dict(info["model"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{cfg_path}: bad model config: {exc}") from exc
    return info, config


def load_checkpoint(path: str | Path) -> GMLPModel:
    """The model stored in checkpoint directory `path`, in eval mode.

    Its `forward` takes `pixel_values` [batch, 3, H, W] (vision) or `input_ids` [batch, L] with
    L <= n (MLM) and returns logits. `model.checkpoint_info` holds the parsed config.json, checked
    for the fields we rely on.
    """
    root = Path(path)
    info, config = read_checkpoint_config(root)
    weights = root / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"{root} has no {WEIGHTS_FILE}")
    try:  # the header first: the config's sizes are checked against it before anything is built
        held = header_shapes(weights)
        model = build_for(config, held, str(weights))
        state = load_file(weights)
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{weights} is not a readable safetensors file: {exc}") from exc
    model.load_state_dict(state, strict=True)
    model.checkpoint_info = info
    return model.eval()


def read_labels(path: str | Path) -> list[str]:
    """Class names from a JSON list, or from the ImageNet class-index form {"0": [wnid, name]}."""
    data = read_json_file(path)
    if isinstance(data, list):
        return [str(x) for x in data]
    if isinstance(data, dict) and all(
        key.isdecimal() and (not isinstance(v, list) or v) for key, v in data.items()
    ):
        return [
            str(v[-1] if isinstance(v, list) else v)
            for _, v in sorted(data.items(), key=lambda kv: int(kv[0]))
        ]
    raise CheckpointError(
        f'{path}: labels must be a JSON list or an index -> name object ({{"0": [wnid, name], ...}})'
    )
