"""Inputs are prepared on the event loop when small and in a thread when not: the same answers.

Each path's logits are compared with an independent computation: the model's transform applied
to the bytes directly, run through the same ORT session alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from contract.image import load_image, open_image
from contract.spec import read_spec
from service.engine.request_context import Deadline
from service.settings import ServiceSettings
from service.tasks import fill_mask, vision
from service.tasks.fill_mask import FillMaskPipeline
from service.tasks.registry import load_pipeline
from service.tasks.vision import VisionPipeline
from service.telemetry.metrics import ServiceMetrics

pytestmark = pytest.mark.timeout(120)


def _load(spec_dir: Path, settings: ServiceSettings) -> Any:
    spec = read_spec(spec_dir)
    assert spec is not None
    return load_pipeline(spec, settings, "cpu", ServiceMetrics(settings.max_batch_size), "1")


def _jpeg(side: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def _run(pipeline: Any, work: Callable[[], Any]) -> Any:
    async def main() -> Any:
        pipeline.batcher.start()
        try:
            return await work()
        finally:
            await pipeline.batcher.close(10)

    return asyncio.run(asyncio.wait_for(main(), 60))


async def _logits(pipeline: VisionPipeline, image: bytes) -> np.ndarray:
    """The logits of one encoded image, through the model's transform and the batcher."""
    outputs = (await pipeline.submit_image(image, Deadline.after(30), None, frozenset({"logits"}))).outputs
    return outputs["logits"]


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The functions the pipelines hand to a thread."""
    calls: list[Any] = []
    to_thread = asyncio.to_thread

    async def counting(func: Any, *args: Any) -> Any:
        calls.append(func)
        return await to_thread(func, *args)

    monkeypatch.setattr(fill_mask.asyncio, "to_thread", counting)
    return calls


def test_small_and_large_images_give_the_transform_s_answer(
    tiny_vision_served: Path, make_settings: Callable[..., ServiceSettings], threads: list[Any]
) -> None:
    pipeline = _load(tiny_vision_served, make_settings(variant="fp32"))
    assert isinstance(pipeline, VisionPipeline)
    small, large = _jpeg(32, 0), _jpeg(300, 1)  # 32 x 32 on the loop, 300 x 300 in a thread
    assert 32 * 32 <= vision.INLINE_DECODE_PIXELS < 300 * 300
    got = _run(
        pipeline,
        lambda: asyncio.gather(*(_logits(pipeline, d) for d in (small, large))),
    )
    assert len(threads) == 1  # only the large image went to a thread
    for data, logits in zip((small, large), got, strict=True):
        expected = pipeline.runtime.run({"pixel_values": pipeline.transform(data)[None]})["logits"][0]
        np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_a_small_image_resized_large_is_prepared_in_a_thread(
    tiny_vision_served: Path, make_settings: Callable[..., ServiceSettings], threads: list[Any]
) -> None:
    """What is resized counts, not only what is decoded: a thumbnail that the transform upscales
    past the inline bound (as a 224 model upscales it to 256) leaves the event loop."""
    pipeline = _load(tiny_vision_served, make_settings(variant="fp32"))
    pipeline.transform = dataclasses.replace(pipeline.transform, resize_size=160)
    assert 32 * 32 <= vision.INLINE_DECODE_PIXELS < 160 * 160
    small = _jpeg(32, 2)
    (logits,) = _run(pipeline, lambda: asyncio.gather(_logits(pipeline, small)))
    assert threads == [pipeline.transform.finish]
    expected = pipeline.runtime.run({"pixel_values": pipeline.transform(small)[None]})["logits"][0]
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_short_and_long_texts_give_the_codec_s_encoding(
    tiny_mlm_served: Path,
    make_settings: Callable[..., ServiceSettings],
    monkeypatch: pytest.MonkeyPatch,
    threads: list[Any],
) -> None:
    pipeline = _load(tiny_mlm_served, make_settings(variant="fp32"))
    assert isinstance(pipeline, FillMaskPipeline)
    short = "the cat sat on the [MASK]."
    # Over the inline bound in characters, still within the model's window in tokens.
    long = "[MASK]" + " " * (fill_mask.INLINE_ENCODE_CHARS + 10) + "sat."
    seen: list[Any] = []
    original = pipeline.batcher.submit

    async def recording(job: Any, deadline: Deadline | None = None) -> Any:
        seen.append(job.feeds)
        return await original(job, deadline)

    monkeypatch.setattr(pipeline.batcher, "submit", recording)
    _run(
        pipeline,
        lambda: asyncio.gather(*(pipeline.fill_mask(t, 3, None, Deadline.after(30)) for t in (short, long))),
    )
    assert threads == [pipeline.codec.encode]  # only the long text went to a thread
    for text, feeds in zip((short, long), seen, strict=True):
        expected = pipeline.codec.encode(text).feeds
        assert set(feeds) == set(expected)
        for name in expected:
            assert np.array_equal(feeds[name], expected[name]), name


@pytest.mark.parametrize("draft", [True, False])
def test_jpeg_draft_setting_chooses_the_decode(
    tiny_vision_served: Path, make_settings: Callable[..., ServiceSettings], draft: bool
) -> None:
    """`jpeg_draft` on: a large JPEG is decoded at a reduced DCT scale; off: every pixel (Pillow's
    own full and `draft` decodes are the references)."""
    pipeline = _load(tiny_vision_served, make_settings(variant="fp32", jpeg_draft=draft))
    assert isinstance(pipeline, VisionPipeline)
    data, transform = _jpeg(512, 2), pipeline.transform
    reduced = transform.transform(
        load_image(open_image(data, 10**8), 10**8, min_side=2 * transform.resize_size)
    )
    full = transform.transform(load_image(open_image(data, 10**8), 10**8))
    assert not np.array_equal(reduced, full)
    got = _run(pipeline, lambda: _logits(pipeline, data))
    expected, other = (
        pipeline.runtime.run({"pixel_values": pixels[None]})["logits"][0]
        for pixels in ((reduced, full) if draft else (full, reduced))
    )
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(got, other, rtol=1e-5, atol=1e-5)  # the two decodes are told apart
