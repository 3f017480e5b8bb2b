"""Load timm's gMLP checkpoints (`timm/models/mlp_mixer.py`, gmlp_*16_224) into our models.

timm's key names, and ours:

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

import re

import torch

from .checkpoint import CheckpointError, load_state_dict_strict
from .configs import GMLPVisionConfig, get_config
from .vision import GMLPVisionClassifier

_KEY_MAP = [
    (r"^stem\.proj\.", "patch_embed.proj."),
    (r"^blocks\.(\d+)\.mlp_channels\.fc1\.", r"blocks.\1.proj_in."),
    (r"^blocks\.(\d+)\.mlp_channels\.gate\.norm\.", r"blocks.\1.sgu.norm."),
    (r"^blocks\.(\d+)\.mlp_channels\.gate\.proj\.", r"blocks.\1.sgu.spatial_proj."),
    (r"^blocks\.(\d+)\.mlp_channels\.fc2\.", r"blocks.\1.proj_out."),
]


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
        for pattern, replacement in _KEY_MAP:
            key = re.sub(pattern, replacement, key)
        renamed[key] = value  # the tensors are the same
    model = GMLPVisionClassifier(config)
    load_state_dict_strict(model, renamed, source)
    return model.eval()


# timm's data config for gmlp_*16_224 (timm.data defaults with mean = std = 0.5).
TIMM_PREPROCESSING = {
    "crop_size": 224,
    "resize_size": 256,
    "crop_pct": 0.875,
    "interpolation": "bicubic",
    "mean": [0.5, 0.5, 0.5],
    "std": [0.5, 0.5, 0.5],
}
