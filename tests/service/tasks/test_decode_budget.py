"""The process's budget of pixels in decoding: never exceeded, never leaked, never a deadlock."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.tasks.vision import PixelBudget, decode_budget

pytestmark = pytest.mark.timeout(60)


async def _run(budget: PixelBudget, sizes: list[int], cancel: set[int]) -> list[int]:
    """Decodes of `sizes` pixels at once (those in `cancel` abandoned while they may wait); the
    budget's use as seen from inside every hold."""
    seen: list[int] = []

    async def decode(pixels: int) -> None:
        async with budget.hold(pixels):
            seen.append(budget.used)
            await asyncio.sleep(0.001)

    tasks = [asyncio.ensure_future(decode(pixels)) for pixels in sizes]
    await asyncio.sleep(0)
    for i in cancel:
        tasks[i].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return seen


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 100),
    st.lists(st.integers(1, 150), min_size=1, max_size=20),
    st.sets(st.integers(0, 19), max_size=5),
)
def test_the_budget_is_never_exceeded_nor_leaked(capacity: int, sizes: list[int], cancel: set[int]) -> None:
    budget = PixelBudget(capacity)
    seen = asyncio.run(_run(budget, sizes, {i for i in cancel if i < len(sizes)}))
    assert all(used <= capacity for used in seen)
    assert budget.used == 0 and not budget.waiters
    # Every decode not abandoned ran, those over the whole budget alone.
    assert len(seen) >= len(sizes) - len(cancel)


def test_one_budget_per_loop_and_capacity() -> None:
    async def same() -> bool:
        return decode_budget(10) is decode_budget(10) and decode_budget(10) is not decode_budget(11)

    assert asyncio.run(same())
    first = asyncio.run(_budget_of(10))
    assert asyncio.run(_budget_of(10)) is not first  # another loop: another budget


async def _budget_of(capacity: int) -> PixelBudget:
    return decode_budget(capacity)
