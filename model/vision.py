"""gMLP image classifier (paper section 3): patches -> gMLP blocks -> LayerNorm -> mean -> linear head."""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from .configs import GMLPVisionConfig
from .layers import GMLPBlock, build_blocks


class PatchEmbed(nn.Module):
    """Non-overlapping patches projected to d_model by a convolution with stride = patch size."""

    def __init__(self, img_size: int, patch_size: int, in_chans: int, d_model: int) -> None:
        super().__init__()
        self.img_size = img_size
        self.proj = nn.Conv2d(in_chans, d_model, kernel_size=patch_size, stride=patch_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if pixel_values.shape[-2:] != (self.img_size, self.img_size):
            # n is fixed by the spatial projection, so the input size is too.
            raise ValueError(
                f"expected images of {self.img_size}x{self.img_size}, got {tuple(pixel_values.shape[-2:])}"
            )
        return self.proj(pixel_values).flatten(2).transpose(1, 2)  # [batch, n, d_model]


class GMLPVisionClassifier(nn.Module):
    """The paper's image classifier (section 3.1, table 1): the timm layout, so timm weights load.

    Images are cut into non-overlapping patches, each projected to `d_model`; `depth` gMLP blocks
    mix channels and, through the Spatial Gating Unit, tokens; a LayerNorm, the mean over tokens
    and a linear head give class logits. The token count n = (img_size / patch_size)^2 is fixed by
    the SGU's n x n projection, so the input size is too. Split as timm splits its models:
    `forward_features` returns the normalised tokens and `forward_head` pools and classifies.

    `checkpoint_info` holds the parsed config.json when the model came from a checkpoint.
    """

    config: GMLPVisionConfig
    checkpoint_info: dict[str, Any]

    def __init__(self, config: GMLPVisionConfig) -> None:
        super().__init__()
        self.config = config
        self.checkpoint_info = {}
        self.patch_embed = PatchEmbed(config.img_size, config.patch_size, config.in_chans, config.d_model)
        self.blocks = build_blocks(config)
        self.norm = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.head = nn.Linear(config.d_model, config.num_classes)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        # LeCun-normal patch projection and a zero head, as timm's MLP-Mixer family does.
        fan_in = self.patch_embed.proj.in_channels * self.config.patch_size**2
        nn.init.trunc_normal_(self.patch_embed.proj.weight, std=fan_in**-0.5)
        nn.init.zeros_(cast(torch.Tensor, self.patch_embed.proj.bias))
        for block in cast("list[GMLPBlock]", self.blocks):
            block.init_weights()
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(pixel_values)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward_head(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(features.mean(dim=1))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Class logits [batch, num_classes] for `pixel_values` [batch, 3, H, W]."""
        return self.forward_head(self.forward_features(pixel_values))
