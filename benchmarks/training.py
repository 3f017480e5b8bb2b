"""What the training-step benchmarks share: the committed demo models' shapes, one optimiser step
of a model on random inputs of those shapes, and the precision option as `gmlp train-*` resolves it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.harness import REPO, add_timing_arguments, command_line, cpu_line
from model import GMLPConfig, GMLPModel, GMLPVisionConfig, config_from_dict
from model.precision import PRECISIONS, precision_label, resolve_precision

DEMOS = {"cifar10-gmlp": 128, "gutenberg-gmlp-mlm": 48}  # checkpoint -> training batch size


def demo_configs() -> list[tuple[str, GMLPConfig, int]]:
    """(name, model config, training batch size) of each committed demo checkpoint."""
    return [
        (
            name,
            config_from_dict(json.loads((REPO / "checkpoints" / name / "config.json").read_text())["model"]),
            batch,
        )
        for name, batch in DEMOS.items()
    ]


def model_step(
    model: GMLPModel,
    batch: int,
    bf16: bool,
    opt: torch.optim.Optimizer | None = None,
    forward: Callable[..., torch.Tensor] | None = None,
) -> Callable[[], None]:
    """One optimiser step of `model` on random inputs of the training shapes; `opt` defaults to a
    plain AdamW and `forward` (e.g. a compiled module) to the model itself."""
    config = model.config
    inputs: tuple[torch.Tensor, ...]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4) if opt is None else opt
    forward = model if forward is None else forward
    if isinstance(config, GMLPVisionConfig):
        inputs = (torch.randn(batch, config.in_chans, config.img_size, config.img_size),)
        y = torch.randint(0, config.num_classes, (batch,))
    else:  # a GMLPMaskedLMConfig, decoded at 15% of the positions, as `gmlp train-mlm` does
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


def parse_args(doc: str | None, repeats: int, precision: bool = True) -> argparse.Namespace:
    """The training benchmarks' command line, parsed and applied: `--threads`, `--repeats` and,
    unless the benchmark compares the precisions itself, `--precision` (default: what
    `gmlp train-*` picks on this CPU). Sets torch's threads and seed, resolves `args.bf16` and
    `args.precision_label` as the training commands do, and prints the machine's CPU line."""
    parser = command_line(doc)
    add_timing_arguments(parser, repeats)
    if precision:
        parser.add_argument("--precision", choices=PRECISIONS, default="auto")
    args = parser.parse_args()
    args.bf16 = resolve_precision(getattr(args, "precision", "auto")) == "bf16"
    args.precision_label = precision_label(args.bf16)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(cpu_line())
    return args
