"""PyTorch gMLP (Liu et al. 2021): vision classifier, masked LM, aMLP, checkpoints, timm import."""

from .checkpoint import (
    CheckpointError,
    GMLPModel,
    build_model,
    load_checkpoint,
    read_checkpoint_info,
    read_labels,
    save_checkpoint,
)
from .configs import (
    MLM_TASK,
    NAMED_CONFIGS,
    VISION_TASK,
    GMLPConfig,
    GMLPMaskedLMConfig,
    GMLPVisionConfig,
    config_from_dict,
    get_config,
)
from .layers import GMLPBlock, SpatialGatingUnit, TinyAttention
from .mlm import GMLPForMaskedLM
from .vision import GMLPVisionClassifier

__all__ = [
    "CheckpointError",
    "GMLPBlock",
    "GMLPConfig",
    "GMLPForMaskedLM",
    "GMLPMaskedLMConfig",
    "GMLPModel",
    "GMLPVisionClassifier",
    "GMLPVisionConfig",
    "MLM_TASK",
    "NAMED_CONFIGS",
    "SpatialGatingUnit",
    "TinyAttention",
    "VISION_TASK",
    "build_model",
    "config_from_dict",
    "get_config",
    "load_checkpoint",
    "read_checkpoint_info",
    "read_labels",
    "save_checkpoint",
]
