"""A loaded model = spec + ORT session + batcher + the task's pre/post-processing.

`VisionPipeline.classify` and `FillMaskPipeline.fill_mask` are the whole task logic the routes call:
preprocess (in a thread, off the event loop), submit to the batcher, postprocess. Batcher refusals
become the service's 503/504 errors here, so routes only deal with HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import numpy as np

from service.batching import BatcherClosedError, DeadlineExceededError, DynamicBatcher, QueueFullError
from service.errors import deadline_exceeded, overloaded, unprocessable
from service.metrics import ServiceMetrics
from service.preprocess import ImageTransform
from service.repository import MLM_TASK, VISION_TASK, ServedModelSpec
from service.runtime import Feeds, OnnxModel, RuntimeOptions, choose_variant
from service.settings import ServiceSettings
from service.text import FillMaskCodec

log = logging.getLogger(__name__)

T = TypeVar("T")


class ServedModel:
    """Common part: session, batcher, warm-up, the settings shown by GET /models."""

    task = ""

    def __init__(
        self, spec: ServedModelSpec, settings: ServiceSettings, device: str, metrics: ServiceMetrics
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.settings = settings
        self.variant = choose_variant(spec.variants, device, settings.variant)
        options = RuntimeOptions(
            device=device, intra_op_threads=settings.resolved_threads(), spinning=settings.ort_spinning
        )
        self.runtime = OnnxModel(spec.variant_path(self.variant), options, name=spec.name)
        self.batcher: DynamicBatcher[Feeds, Feeds] = DynamicBatcher(
            self.runtime.run_batch,
            max_batch_size=settings.max_batch_size,
            max_queue_delay_s=settings.max_queue_delay_ms / 1000.0,
            max_queue_size=settings.max_queue_size,
            name=spec.name,
            observer=metrics.observer(spec.name),
        )
        self.ready = False

    def warmup_feeds(self) -> Feeds:
        raise NotImplementedError

    def check_outputs(self, outputs: Feeds) -> None:
        """Raise if the graph's outputs do not fit the metadata (caught at start-up, not per request)."""

    def warm_up(self) -> None:
        """Run a batch of one and a full batch (blocking): first runs allocate ORT's memory arenas."""
        feeds = self.warmup_feeds()
        for size in sorted({1, self.settings.max_batch_size}):
            outputs = self.runtime.run_batch([feeds] * size)
            self.check_outputs(outputs[0])

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "task": self.task,
            "n": self.spec.seq_len,
            "variant": self.variant,
            "variants": sorted(self.spec.variants),
            "provider": self.runtime.provider,
            "intra_op_threads": self.runtime.options.intra_op_threads,
            "rows_batched": self.runtime.row_independent,
            "ready": self.ready,
            "batching": {
                "max_batch_size": self.batcher.max_batch_size,
                "max_queue_delay_ms": self.batcher.max_queue_delay_s * 1000.0,
                "max_queue_size": self.batcher.max_queue_size,
            },
        }

    async def infer(self, feeds: Feeds, deadline: float) -> Feeds:
        """Submit to the batcher, translating its refusals into HTTP errors."""
        try:
            return await self.batcher.submit(feeds, deadline)
        except QueueFullError as exc:
            raise overloaded(f"{exc}; retry later") from exc
        except BatcherClosedError as exc:
            raise overloaded(str(exc)) from exc
        except DeadlineExceededError as exc:
            raise deadline_exceeded(self.settings.request_timeout_s) from exc


async def before_deadline(work: Awaitable[T], deadline: float, timeout_s: float) -> T:
    """Await `work` until `deadline` (a time.monotonic() instant); 504 after.

    Used for the steps before the batcher (reading the body, decoding); the batcher enforces the
    same deadline itself while the request is queued.
    """
    try:
        return await asyncio.wait_for(work, max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        raise deadline_exceeded(timeout_s) from None


def _top_k(probs: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-probs, kind="stable")[:k]


class VisionPipeline(ServedModel):
    task = VISION_TASK

    def __init__(
        self, spec: ServedModelSpec, settings: ServiceSettings, device: str, metrics: ServiceMetrics
    ) -> None:
        super().__init__(spec, settings, device, metrics)
        self.labels = spec.labels()
        shape = spec.inputs[0]["shape"] if spec.inputs else None
        input_hw = (int(shape[-2]), int(shape[-1])) if shape else None
        self.transform = ImageTransform.from_config(spec.preprocessing, settings.max_image_pixels, input_hw)

    def warmup_feeds(self) -> Feeds:
        h, w = self.transform.crop_size
        return {"pixel_values": np.zeros((3, h, w), dtype=np.float32)}

    def check_outputs(self, outputs: Feeds) -> None:
        if outputs["logits"].shape != (len(self.labels),):
            raise ValueError(
                f"model {self.name}: logits {outputs['logits'].shape} but {len(self.labels)} labels"
            )

    async def classify(self, image: bytes, top_k: int, deadline: float) -> list[dict[str, Any]]:
        if not 1 <= top_k <= len(self.labels):
            raise unprocessable(
                "invalid_top_k", f"top_k must be between 1 and {len(self.labels)} (the number of labels)"
            )
        pixels = await before_deadline(
            asyncio.to_thread(self.transform, image), deadline, self.settings.request_timeout_s
        )
        logits = (await self.infer({"pixel_values": pixels}, deadline))["logits"].astype(np.float64)
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        return [{"label": self.labels[i], "score": float(probs[i])} for i in _top_k(probs, top_k)]


class FillMaskPipeline(ServedModel):
    task = MLM_TASK
    max_top_k = 100

    def __init__(
        self, spec: ServedModelSpec, settings: ServiceSettings, device: str, metrics: ServiceMetrics
    ) -> None:
        super().__init__(spec, settings, device, metrics)
        self.codec = FillMaskCodec(spec.tokenizer_path(), spec.model_config, model_name=spec.name)

    def warmup_feeds(self) -> Feeds:
        return self.codec.encode(self.codec.mask_token).feeds

    def check_outputs(self, outputs: Feeds) -> None:
        expected = (self.codec.max_predictions, self.codec.vocab_size)
        if outputs["logits"].shape != expected:
            raise ValueError(f"model {self.name}: logits {outputs['logits'].shape}, expected {expected}")

    async def fill_mask(
        self, text: str, top_k: int, targets: list[str] | None, deadline: float
    ) -> list[list[dict[str, Any]]]:
        if not 1 <= top_k <= self.max_top_k:
            raise unprocessable("invalid_top_k", f"top_k must be between 1 and {self.max_top_k}")
        encoded = await before_deadline(
            asyncio.to_thread(self.codec.encode, text), deadline, self.settings.request_timeout_s
        )
        target_ids = None if targets is None else self.codec.target_ids(targets)
        logits = (await self.infer(encoded.feeds, deadline))["logits"]
        return self.codec.decode(encoded, logits, top_k, target_ids)


PIPELINES: dict[str, type[ServedModel]] = {VISION_TASK: VisionPipeline, MLM_TASK: FillMaskPipeline}


def load_model(
    spec: ServedModelSpec, settings: ServiceSettings, device: str, metrics: ServiceMetrics
) -> ServedModel:
    """Create the session and warm it up (blocking; call from a thread)."""
    model = PIPELINES[spec.task](spec, settings, device, metrics)
    model.warm_up()
    return model


__all__ = ["before_deadline", "ServedModel", "VisionPipeline", "FillMaskPipeline", "load_model", "PIPELINES"]
