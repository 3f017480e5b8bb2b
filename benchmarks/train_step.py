"""Training-step cost of the SGU's spatial projection on CPU: `W @ z2 + b` vs the model's baddbmm.

    python scripts/bench_train_step.py [--threads 2] [--repeats 7]

For each demo shape this times forward + backward in the precision `gmlp train-*` picks (bf16
autocast where the CPU has native bf16, else fp32; `--precision` overrides) of
(a) the plain formulation `torch.matmul(W, z2) + b` and (b) the SGU as the model computes it, first
for the SGU alone and then for a whole optimiser step of the demo model with every SGU swapped.
Figures are medians over `--repeats` timed runs, the two variants timed in turn; the ratio
(a)/(b) is what stays comparable on a shared, noisy machine. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model import GMLPMaskedLMConfig, build_model, get_config  # noqa: E402
from model.layers import SpatialGatingUnit  # noqa: E402
from model.precision import PRECISIONS, precision_label, resolve_precision  # noqa: E402


class MatmulSGU(SpatialGatingUnit):
    """The same unit with the spatial projection written as `torch.matmul(W, z2) + b` (the
    formulation the model replaced)."""

    def spatial_projection(self, z2: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.spatial_proj.weight, z2) + self.spatial_proj.bias[:, None]


def _interleaved_ms(variants: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median ms per variant, timing them in turn (A, B, A, B, ...) so drift in the machine's speed
    hits both alike."""
    for fn in variants.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(ts) for name, ts in times.items()}


def _sgu_step(sgu: SpatialGatingUnit, batch: int, n: int, d_ffn: int, bf16: bool) -> Callable[[], None]:
    z = torch.randn(batch, n, d_ffn, requires_grad=True)

    def run() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = sgu(z)
        out.float().square().mean().backward()

    return run


def _model_step(
    model: torch.nn.Module,
    batch: int,
    bf16: bool,
    opt: torch.optim.Optimizer | None = None,
    forward: Callable[..., torch.Tensor] | None = None,
) -> Callable[[], None]:
    """One optimiser step of `model` on random inputs of the training shapes; `opt` defaults to a
    plain AdamW and `forward` (e.g. a compiled module) to the model itself."""
    config = model.config
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4) if opt is None else opt
    forward = model if forward is None else forward
    if hasattr(config, "img_size"):
        inputs = (torch.randn(batch, config.in_chans, config.img_size, config.img_size),)
        y = torch.randint(0, config.num_classes, (batch,))
    else:  # decoded at 15% of the positions, as `gmlp train-mlm` does
        picks = max(1, round(0.15 * config.n))
        inputs = (
            torch.randint(1, config.vocab_size, (batch, config.n)),
            torch.randint(0, config.n, (batch, picks)),
        )
        y = torch.randint(0, config.vocab_size, (batch, picks))

    def run() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = forward(*inputs).float()
        loss = F.cross_entropy(logits.flatten(0, -2), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return run


def _swap_sgus(model: torch.nn.Module, cls: type[SpatialGatingUnit]) -> None:
    for block in model.blocks:
        block.sgu.__class__ = cls


def bench_args(
    doc: str,
    repeats: int,
    precision: bool = True,
    configure: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """The benchmarks' shared command line (`--threads`, `--repeats`, `--precision`), applied:
    threads set, seeded, `args.bf16` resolved for this CPU as the training commands resolve it
    (`precision=False` for a benchmark that compares the precisions itself). `configure` adds a
    benchmark's own options to the parser."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=repeats)
    if precision:
        parser.add_argument("--precision", choices=PRECISIONS, default="auto")
    if configure is not None:
        configure(parser)
    args = parser.parse_args()
    args.bf16 = resolve_precision(getattr(args, "precision", "auto")) == "bf16"
    args.precision_label = precision_label(args.bf16)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    return args


def main() -> None:
    args = bench_args(__doc__, repeats=7)
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
        sgu = _interleaved_ms(
            {
                "plain": _sgu_step(plain, batch, n, config.d_ffn, args.bf16),
                "ours": _sgu_step(ours, batch, n, config.d_ffn, args.bf16),
            },
            args.repeats,
        )
        models = {"plain": build_model(config).train(), "ours": build_model(config).train()}
        models["ours"].load_state_dict(models["plain"].state_dict())
        _swap_sgus(models["plain"], MatmulSGU)
        step = _interleaved_ms(
            {key: _model_step(model, batch, args.bf16) for key, model in models.items()}, args.repeats
        )
        for what, times in (("one SGU fwd+bwd", sgu), ("whole AdamW step", step)):
            ratio = times["plain"] / times["ours"]
            print(f"| {name} | {what} | {times['plain']:.1f} | {times['ours']:.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
