"""Training-step cost of the SGU's spatial projection on CPU: `W @ z2 + b` vs the model's baddbmm.

    .venv/bin/python -m benchmarks.train_step [--threads 2] [--repeats 7]

For each demo shape this times forward + backward in the precision `gmlp train-*` picks (bf16
autocast where the CPU has native bf16, else fp32; `--precision` overrides) of
(a) the plain formulation `torch.matmul(W, z2) + b` and (b) the SGU as the model computes it, first
for the SGU alone and then for a whole optimiser step of the demo model with every SGU swapped.
Figures are medians over `--repeats` timed runs, the two variants timed in turn; the ratio
(a)/(b) is what stays comparable on a shared, noisy machine. It is the measurement behind the
model's `baddbmm` form (model/layers.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch

from benchmarks import training
from benchmarks.harness import interleaved_ms
from model import GMLPMaskedLMConfig, GMLPModel, build_model, get_config
from model.layers import GMLPBlock, SpatialGatingUnit


class MatmulSGU(SpatialGatingUnit):
    """The same unit with the spatial projection written as `torch.matmul(W, z2) + b` (the
    formulation the model replaced)."""

    def spatial_projection(self, z2: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.spatial_proj.weight, z2) + self.spatial_proj.bias[:, None]


def _sgu_step(sgu: SpatialGatingUnit, batch: int, n: int, d_ffn: int, bf16: bool) -> Callable[[], None]:
    z = torch.randn(batch, n, d_ffn, requires_grad=True)

    def run() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = sgu(z)
        out.float().square().mean().backward()

    return run


def _swap_sgus(model: GMLPModel, cls: type[SpatialGatingUnit]) -> None:
    for block in cast("list[GMLPBlock]", model.blocks):
        block.sgu.__class__ = cls


def main() -> None:
    args = training.parse_args(__doc__, repeats=7)
    cifar = get_config("gmlp_cifar_p4", depth=10, d_model=128, d_ffn=512, num_classes=10)
    mlm = GMLPMaskedLMConfig(depth=6, d_model=256, d_ffn=1024, attn_dim=64, vocab_size=30522, n=128)
    cases = [
        ("CIFAR demo (B 128, n 64, d_ffn 512)", cifar, 128),
        ("MLM demo (B 48, n 128, d_ffn 1024)", mlm, 48),
    ]
    print(f"threads {args.threads}, {args.precision_label}, median of {args.repeats}\n")
    print("| shape | what | W @ z2 + b (ms) | baddbmm (ms) | ratio |")
    print("|---|---|---:|---:|---:|")
    for name, config, batch in cases:
        n = config.seq_len
        plain, ours = MatmulSGU(config.d_ffn, n), SpatialGatingUnit(config.d_ffn, n)
        ours.load_state_dict(plain.state_dict())
        sgu = interleaved_ms(
            {
                "plain": _sgu_step(plain, batch, n, config.d_ffn, args.bf16),
                "ours": _sgu_step(ours, batch, n, config.d_ffn, args.bf16),
            },
            args.repeats,
        )
        models = {"plain": build_model(config).train(), "ours": build_model(config).train()}
        models["ours"].load_state_dict(models["plain"].state_dict())
        _swap_sgus(models["plain"], MatmulSGU)
        step = interleaved_ms(
            {key: training.model_step(model, batch, args.bf16) for key, model in models.items()}, args.repeats
        )
        for what, times in (("one SGU fwd+bwd", sgu), ("whole AdamW step", step)):
            ratio = times["plain"] / times["ours"]
            print(f"| {name} | {what} | {times['plain']:.1f} | {times['ours']:.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
