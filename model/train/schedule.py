"""Learning-rate schedule and time-budget planning.

Runs are bounded by wall time (about an hour on a shared 2-core CPU), not by a known number of
steps, so the cosine must be planned from the measured speed: after a short calibration the
planner extrapolates how many steps fit in the remaining time and keeps re-estimating, so the
run always ends on a decayed learning rate even when other jobs slow the machine down.
"""

from __future__ import annotations

import math
import time

from contract.errors import UserError


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
