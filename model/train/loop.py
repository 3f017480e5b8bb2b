"""The training loop both demo models share: AdamW, warm-up + cosine, bf16 autocast where the CPU
has native bf16, time budget, progress bar, periodic resumable state.

bf16 autocast pays only on CPUs with native bf16 arithmetic (AVX512-BF16 or AMX). Elsewhere oneDNN
emulates it, many times slower than fp32 (docs/benchmarks.md, "Precision on CPUs without bf16").
So `auto`, the training commands' default, picks bf16 only where it is native, and a forced
`bf16` on other CPUs is logged as the slow path it is.

Runs are bounded by wall time (about an hour on a shared 2-core CPU), not by a known number of
steps, so the cosine must be planned from the measured speed: after a short calibration the
planner extrapolates how many steps fit in the remaining time and keeps re-estimating, so the
run always ends on a decayed learning rate even when other jobs slow the machine down.

A task supplies `make_batch(step)` (deterministic in the step, so resuming needs no data-loader
state) and `loss(model, batch) -> (loss, {metric: (sum, count)})`; everything else lives here.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from torch import nn
from tqdm import tqdm

from contract.cpu import BF16_FLAGS, PRECISIONS, cpu_flags
from contract.errors import UserError

log = logging.getLogger(__name__)


def native_bf16() -> bool:
    """True when this CPU computes bf16 natively (AVX512-BF16 or AMX-BF16), by the flags the
    service's backends read too."""
    return bool(cpu_flags() & BF16_FLAGS)


def precision_label(bf16: bool) -> str:
    """How a run's precision is recorded (training.json, model cards, benchmark tables)."""
    return "bf16 autocast" if bf16 else "fp32"


def resolve_precision(choice: str) -> str:
    """'auto' -> 'bf16' or 'fp32' for this CPU; 'bf16' and 'fp32' are returned as asked."""
    if choice not in PRECISIONS:
        raise UserError(f"precision {choice!r}; choose from {', '.join(PRECISIONS)}")
    native = native_bf16()
    if choice == "auto":
        return "bf16" if native else "fp32"
    if choice == "bf16" and not native:
        log.warning(
            "bf16 autocast asked for, but this CPU has no native bf16 (AVX512-BF16/AMX): "
            "it is emulated and can be an order of magnitude slower than fp32"
        )
    return choice


def lr_at(
    step: int, total_steps: int, peak_lr: float, warmup_steps: int, min_lr_ratio: float = 0.01
) -> float:
    """Linear warm-up to `peak_lr`, then cosine decay to `min_lr_ratio * peak_lr` at `total_steps`."""
    warmup_steps = min(warmup_steps, max(total_steps // 5, 1))
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / span, 1.0)
    floor = peak_lr * min_lr_ratio
    return floor + (peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class StepPlanner:
    """How many optimiser steps the run will take, given step and/or time limits.

    `max_steps` alone gives a fixed plan. With `budget_s`, the plan is `max_steps` (if any) until
    `calib_steps` steps have been timed, then `step + remaining_time * measured_rate`, updated every
    `replan_every` steps from the speed of the last few hundred steps. The rate is measured in this
    process only (a resumed run re-measures).
    """

    calib_steps = 30
    skip_steps = 3
    replan_every = 50

    def __init__(
        self,
        max_steps: int | None,
        budget_s: float | None,
        elapsed_s: float = 0.0,
        provisional_steps: int = 10_000,
    ) -> None:
        if max_steps is None and budget_s is None:
            raise UserError("give a step limit, a time budget or both")
        self.max_steps = max_steps
        self.budget_s = budget_s
        self._start_elapsed = elapsed_s
        self._t0 = time.monotonic()
        self._mark: tuple[int, float] | None = None  # (step, monotonic time) when timing started
        self._steps_seen = 0
        self._history: list[tuple[int, float]] = []  # (step, time) at each re-plan
        self.window = 5  # re-plans, i.e. the rate is measured over the last ~4 x replan_every steps
        self.total = max_steps if max_steps is not None else provisional_steps
        self.calibrated = budget_s is None

    def elapsed(self) -> float:
        """Training wall time so far, including time spent before a resume."""
        return self._start_elapsed + time.monotonic() - self._t0

    def update(self, step: int) -> int:
        """Record that `step` steps are done and return the (possibly revised) planned total."""
        self._steps_seen += 1
        if self.budget_s is None:
            return self.total
        now = time.monotonic()
        if self._steps_seen == self.skip_steps:
            self._mark = (step, now)  # first steps are slow (allocator, caches): not timed
        if self._mark is None:
            return self.total
        timed = step - self._mark[0]
        if timed >= self.calib_steps and (not self.calibrated or timed % self.replan_every == 0):
            # Speed over the recent window: the machine is shared, so old speeds go stale.
            self._history.append((step, now))
            self._history = self._history[-self.window :]
            first_step, first_time = self._history[0] if len(self._history) > 1 else self._mark
            rate = (step - first_step) / max(now - first_time, 1e-6)
            remaining = max(self.budget_s - self.elapsed(), 0.0)
            planned = step + int(remaining * rate)
            if self.max_steps is not None:
                planned = min(planned, self.max_steps)
            self.total = max(planned, step)
            self.calibrated = True
        return self.total

    def done(self, step: int) -> bool:
        """Stop at the planned step, or when the budget is spent whatever the plan said."""
        if step >= self.total and self.calibrated:
            return True
        if self.max_steps is not None and step >= self.max_steps:
            return True
        return self.budget_s is not None and self.elapsed() >= self.budget_s


class Task(Protocol):
    def make_batch(self, step: int) -> Any: ...

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, tuple[float, float]]]: ...


@dataclass
class LoopConfig:
    """Optimisation settings; `max_steps` and/or `time_budget_s` bound the run."""

    lr: float
    weight_decay: float
    warmup_steps: int
    max_steps: int | None = None
    time_budget_s: float | None = None
    betas: tuple[float, float] = (0.9, 0.999)
    bf16: bool = True
    compile: bool = False
    state_path: Path | None = None
    resume: bool = False
    save_every_s: float = 300.0
    log_every: int = 100
    desc: str = "train"


@dataclass
class LoopResult:
    steps: int
    train_seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    precision: str = "fp32"


def loop_config_from_args(args: Any, desc: str, max_steps: int | None = None, **overrides: Any) -> LoopConfig:
    """The CLI flags both training commands share; `--time-budget-min` covers training plus the
    final evaluation, so `--eval-reserve-s` of it is kept back from the training loop."""
    budget = args.time_budget_min * 60 - args.eval_reserve_s if args.time_budget_min else None
    return LoopConfig(
        lr=args.lr,
        weight_decay=args.weight_decay,
        warmup_steps=args.warmup_steps,
        max_steps=args.max_steps if max_steps is None else max_steps,
        time_budget_s=budget,
        bf16=resolve_precision(args.precision) == "bf16",
        compile=args.compile,
        state_path=Path(args.state_dir) / "train_state.pt",
        resume=args.resume,
        desc=desc,
        **overrides,
    )


def _save_state(
    path: Path, model: nn.Module, opt: torch.optim.Optimizer, step: int, elapsed: float, total: int
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "step": step,
        "elapsed_s": elapsed,
        "planned_total": total,
    }
    torch.save(state, tmp)
    tmp.replace(path)


class _Meter:
    """Running sums of the task's metrics over the last `log_every` steps, plus a loss EMA."""

    def __init__(self) -> None:
        self.sums: dict[str, list[float]] = {}
        self.loss_ema: float | None = None

    def add(self, loss: float, metrics: dict[str, tuple[float, float]]) -> None:
        self.loss_ema = loss if self.loss_ema is None else 0.98 * self.loss_ema + 0.02 * loss
        for key, (total, count) in metrics.items():
            acc = self.sums.setdefault(key, [0.0, 0.0])
            acc[0] += total
            acc[1] += count

    def summary(self, reset: bool = False) -> dict[str, float]:
        out = {"loss": round(self.loss_ema or 0.0, 4)}
        out.update({k: round(s / max(c, 1), 4) for k, (s, c) in self.sums.items()})
        if reset:
            self.sums = {}
        return out


def train_loop(model: nn.Module, task: Task, cfg: LoopConfig) -> LoopResult:
    """Run optimiser steps until the step or time limit; returns what a model card reports."""
    # AdamW with no weight decay on biases and LayerNorm gains (the usual transformer/MLP recipe).
    # The fused implementation updates all tensors of a group in one kernel, where torch's CPU
    # default loops over them: the same arithmetic, a cheaper step (docs/benchmarks.md, "Training
    # options").
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=True)
    step, elapsed, provisional = 0, 0.0, 10_000
    if cfg.resume and cfg.state_path is not None and cfg.state_path.is_file():
        state = torch.load(cfg.state_path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, elapsed = int(state["step"]), float(state["elapsed_s"])
        provisional = int(state["planned_total"])
        log.info("resumed from %s at step %d (%.0f s trained)", cfg.state_path, step, elapsed)
    # Until the speed is re-measured, a resumed run keeps the plan it had (no LR jump).
    planner = StepPlanner(cfg.max_steps, cfg.time_budget_s, elapsed_s=elapsed, provisional_steps=provisional)
    model.train()
    # Compiled forward (and backward); the parameters and the saved state stay `model`'s own.
    # torch.compile returns an OptimizedModule, a Module that wraps `model`.
    forward_model = cast(nn.Module, torch.compile(model)) if cfg.compile else model
    meter = _Meter()
    interactive = sys.stderr.isatty()
    bar = tqdm(total=planner.total, initial=step, desc=cfg.desc, mininterval=1.0 if interactive else 30.0)
    last_save = time.monotonic()
    while not planner.done(step):
        lr = lr_at(step, planner.total, cfg.lr, cfg.warmup_steps)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = task.make_batch(step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            loss, metrics = task.loss(forward_model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        loss_value = float(loss.detach())
        if loss_value != loss_value:  # NaN: stop early with a clear message rather than train garbage
            raise RuntimeError(f"loss is NaN at step {step} (lr {lr:.2e}); lower --lr")
        meter.add(loss_value, metrics)
        total = bar.total = planner.update(step)
        bar.update(1)
        bar.set_postfix(meter.summary() | {"lr": f"{lr:.1e}"}, refresh=False)
        if step % cfg.log_every == 0:
            bar.write(
                f"{cfg.desc} step {step}/{total} {planner.elapsed():.0f}s lr {lr:.2e} "
                + " ".join(f"{k} {v}" for k, v in meter.summary(reset=True).items())
            )
            sys.stderr.flush()
        if cfg.state_path is not None and time.monotonic() - last_save > cfg.save_every_s:
            _save_state(cfg.state_path, model, opt, step, planner.elapsed(), planner.total)
            last_save = time.monotonic()
    bar.close()
    if cfg.state_path is not None:
        _save_state(cfg.state_path, model, opt, step, planner.elapsed(), planner.total)
    model.eval()
    return LoopResult(
        steps=step,
        train_seconds=planner.elapsed(),
        metrics=meter.summary(),
        precision=precision_label(cfg.bf16),
    )
