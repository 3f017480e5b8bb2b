"""PyTorch gMLP (Liu et al. 2021): vision classifier, masked LM, aMLP, checkpoints, timm import."""

from .checkpoint import CheckpointError, GMLPModel, build_model, load_checkpoint, save_checkpoint
from .configs import GMLPConfig, GMLPMaskedLMConfig, GMLPVisionConfig, get_config
from .mlm import GMLPForMaskedLM
from .vision import GMLPVisionClassifier

__all__ = [
    "CheckpointError",
    "GMLPConfig",
    "GMLPForMaskedLM",
    "GMLPMaskedLMConfig",
    "GMLPModel",
    "GMLPVisionClassifier",
    "GMLPVisionConfig",
    "build_model",
    "get_config",
    "load_checkpoint",
    "save_checkpoint",
]
