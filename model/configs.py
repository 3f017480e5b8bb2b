"""Configuration dataclasses and the named gMLP configurations.

A config fully determines the architecture (and therefore the parameter count), so it is what
`config.json` stores next to the weights. The named vision configs reproduce timm's
`gmlp_{ti,s,b}16_224` exactly (Liu et al. 2021, table 1), which lets us load timm's weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from contract.errors import UserError
from contract.formats import MLM_TASK, VISION_TASK

# Gate activations (`GMLPConfig.gate_act`), applied in PyTorch and in the exported SGU function.
GATE_ACTIVATIONS = ("identity", "tanh", "sigmoid", "relu", "gelu", "silu")


@dataclass
class GMLPConfig:
    """The backbone shared by both models: `depth` gMLP blocks over a fixed sequence of n tokens.

    Attributes:
        depth: number of gMLP blocks (L in the paper).
        d_model: token width between blocks.
        d_ffn: width after the channel expansion U; the SGU halves it.
        attn_dim: size of the single-head "tiny attention" of aMLP; None for plain gMLP.
        heads: independent spatial projections, each over its own d_ffn / 2 / heads channels of
            the gate (g-mlp-pytorch's multi-head SGU; the paper's is 1).
        gate_act: activation of the gate before it multiplies z1 (one of `GATE_ACTIVATIONS`; the
            paper's is the identity).
        shift_tokens: token shift before the channel projection: the normalised input's first
            2s + 1 channel groups move by -s..s positions (g-mlp-pytorch; 0 for the paper's).
        norm_eps: eps of the pre-block and final LayerNorms (timm: 1e-6).
        sgu_norm_eps: eps of the LayerNorm on the gate half (timm: PyTorch's default 1e-5).
        drop_path_rate: stochastic depth, linearly increasing over blocks (training only).
    """

    depth: int = 30
    d_model: int = 256
    d_ffn: int = 1536
    attn_dim: int | None = None
    heads: int = 1
    gate_act: str = "identity"
    shift_tokens: int = 0
    norm_eps: float = 1e-6
    sgu_norm_eps: float = 1e-5
    drop_path_rate: float = 0.0

    task: ClassVar[str] = ""

    @property
    def seq_len(self) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def __post_init__(self) -> None:
        if self.d_ffn % 2:
            raise UserError(f"d_ffn must be even (the SGU splits it in two), got {self.d_ffn}")
        if self.depth < 1 or self.d_model < 1:
            raise UserError("depth and d_model must be positive")
        if self.heads < 1 or (self.d_ffn // 2) % self.heads:
            raise UserError(f"heads={self.heads} must divide the gate's {self.d_ffn // 2} channels")
        if self.gate_act not in GATE_ACTIVATIONS:
            raise UserError(f"gate_act {self.gate_act!r} is not one of {', '.join(GATE_ACTIVATIONS)}")
        if self.shift_tokens < 0 or self.d_model < 2 * self.shift_tokens + 1:
            raise UserError(f"shift_tokens={self.shift_tokens} needs 0 <= s and 2s + 1 <= d_model")

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, **dataclasses.asdict(self)}


@dataclass
class GMLPVisionConfig(GMLPConfig):
    """gMLP image classifier: non-overlapping patches -> blocks -> LayerNorm -> mean -> head."""

    img_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000

    task: ClassVar[str] = VISION_TASK

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.img_size % self.patch_size:
            raise UserError(f"img_size {self.img_size} is not a multiple of patch_size {self.patch_size}")

    @property
    def seq_len(self) -> int:
        return (self.img_size // self.patch_size) ** 2


@dataclass
class GMLPMaskedLMConfig(GMLPConfig):
    """gMLP masked language model over a window of up to `n` WordPiece tokens.

    `n` is the size of W; a sequence of L <= n tokens is read with W's top-left L x L block.

    `max_predictions` is the most positions the exported graph decodes per sequence (the
    vocabulary projection is only computed where it is needed); `pad_token_id` marks padding,
    which the SGU removes from the spatial mixing (see `layers.SpatialGatingUnit`).
    `tie_embeddings`: the vocabulary projection reuses the embedding matrix (BERT's layout);
    False gives it its own (g-mlp-pytorch's).
    """

    vocab_size: int = 30522
    n: int = 128
    pad_token_id: int = 0
    mask_token_id: int = 103
    max_predictions: int = 16
    tie_embeddings: bool = True

    task: ClassVar[str] = MLM_TASK

    @property
    def seq_len(self) -> int:
        return self.n


# Paper table 1 / timm: Ti 5.87M, S 19.42M, B 73.08M parameters at 224x224, patch 16.
NAMED_CONFIGS: dict[str, GMLPConfig] = {
    "gmlp_ti16_224": GMLPVisionConfig(depth=30, d_model=128, d_ffn=768),
    "gmlp_s16_224": GMLPVisionConfig(depth=30, d_model=256, d_ffn=1536),
    "gmlp_b16_224": GMLPVisionConfig(depth=30, d_model=512, d_ffn=3072),
    # small CIFAR-sized classifier used for the demo model (32x32, patch 4 -> n = 64)
    "gmlp_cifar_p4": GMLPVisionConfig(
        depth=12, d_model=192, d_ffn=768, img_size=32, patch_size=4, num_classes=10
    ),
    # masked-LM configs (paper section 4; base sizes) and the small demo one
    "gmlp_mlm_base": GMLPMaskedLMConfig(depth=48, d_model=512, d_ffn=3072),
    "amlp_mlm_base": GMLPMaskedLMConfig(depth=36, d_model=512, d_ffn=3072, attn_dim=64),
    "gmlp_mlm_small": GMLPMaskedLMConfig(depth=8, d_model=256, d_ffn=1024),
}


def get_config(name: str, **overrides: Any) -> GMLPConfig:
    """Copy of a named config with `overrides` applied (e.g. num_classes=10)."""
    if name not in NAMED_CONFIGS:
        raise KeyError(f"unknown config {name!r}; known: {', '.join(sorted(NAMED_CONFIGS))}")
    return dataclasses.replace(NAMED_CONFIGS[name], **overrides)


def config_from_dict(data: dict[str, Any]) -> GMLPConfig:
    """Inverse of `GMLPConfig.to_dict`; unknown keys are an error, not silently dropped."""
    data = dict(data)
    task = data.pop("task", None)
    classes = {cls.task: cls for cls in (GMLPVisionConfig, GMLPMaskedLMConfig)}
    if task not in classes:
        raise UserError(f"config has task {task!r}; expected one of {sorted(classes)}")
    cls = classes[task]
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise UserError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
    return cls(**data)
