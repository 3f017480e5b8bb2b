"""Image classification: the pipeline (with its Hugging Face API answer) and its v2 forms.

An encoded image goes through the model's own transform (`contract.image`), the batcher, and
scores over its labels (softmax, unless the API asks for another function). Over v2 the encoded
form is `image` (BYTES, one encoded image per row), answered with the graph's outputs (`logits`
unless others are asked for); over the Hugging Face API a raw body is the image file and a JSON
`inputs` is the file base64-encoded.

The pixels the whole process decodes at once are bounded (`max_decoding_pixels`, `PixelBudget`):
each image is within `max_image_pixels`, but decodes run in worker threads side by side: a v2
request of 16 rows of large, highly compressed PNGs (a few hundred kilobytes in all), or as many
/classify requests, would each hold a decoded image of up to tens of millions of pixels at once,
as many as the thread pool has workers (up to 32). So a decode of more than a few thousand pixels
first takes its pixel count from this budget and gives it back when done; an image that does not
fit waits (within its request's deadline: 504 after) until decodes in flight finish. An image over
the whole budget waits until it runs alone. One budget per event loop: in a server, the process.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from contract.errors import ErrorCode, InvalidInput
from contract.formats import TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT, VISION_TASK
from contract.image import ImageTransform, PlainJpeg, decode_base64
from contract.scores import ScoreFunction, labelled_rows, ranked_labels
from contract.spec import ModelSpec
from contract.tensors import Tensor
from service.engine.request_context import Deadline, Timed, before
from service.engine.rows import NOTHING, Done, Job, Reads
from service.engine.runtime import Feeds
from service.settings import ServiceSettings
from service.tasks.forms import IMAGE_INPUT, Forms, gather_or_cancel, stacked, timed
from service.tasks.pipeline import HFOptions, Pipeline

# Images this small, decoded and resized, are prepared on the event loop: handing them to a thread
# costs more (thread wake-ups, a GIL hand-over each way) than preparing them, which stays short
# enough not to hold up the other requests. Anything larger, in either size, is prepared in a
# thread, off the event loop: a thumbnail upscaled to a 224 model's 256 is four times this.
INLINE_DECODE_PIXELS = 128 * 128


@dataclass(frozen=True)
class Ranking:
    """A classification request's answer: its `top_k` labels scored by `function`."""

    top_k: int
    function: ScoreFunction = "softmax"

    @property
    def whole_row_softmax(self) -> bool:
        return self.function == "softmax"


class PixelBudget:
    """A counting semaphore weighted by pixels, on one event loop."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.waiters: list[asyncio.Future[None]] = []

    @asynccontextmanager
    async def hold(self, pixels: int) -> AsyncIterator[None]:
        """Hold `pixels` of the budget (at most all of it) for the duration of the block."""
        pixels = min(pixels, self.capacity)
        while self.used + pixels > self.capacity:
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            try:
                await waiter
            finally:
                self.waiters.remove(waiter)
        self.used += pixels
        try:
            yield
        finally:
            self.used -= pixels
            for waiter in self.waiters:  # each rechecks whether it fits now
                if not waiter.done():
                    waiter.set_result(None)


_BUDGETS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, PixelBudget]] = (
    weakref.WeakKeyDictionary()
)


def decode_budget(capacity: int) -> PixelBudget:
    """The running loop's budget of `capacity` pixels (shared by every model it serves)."""
    per_loop = _BUDGETS.setdefault(asyncio.get_running_loop(), {})
    return per_loop.setdefault(capacity, PixelBudget(capacity))


async def decode_in_thread(
    transform: ImageTransform, img: PlainJpeg | Image.Image, capacity: int
) -> np.ndarray:
    """`transform.finish(img)` (decode, resize, crop) in a worker thread, within the running loop's
    budget of `capacity` pixels in decoding."""
    async with decode_budget(capacity).hold(img.width * img.height):
        return await asyncio.to_thread(transform.finish, img)


class VisionPipeline(Pipeline):
    """An image classifier: its transform, its labels, and the ranking of its batch rows."""

    task = VISION_TASK
    default_setting = "default_classifier"
    labels: list[str]

    def prepare(self, spec: ModelSpec, settings: ServiceSettings) -> None:
        self.labels = spec.labels()
        self.transform = ImageTransform.for_model(
            spec.config, settings.max_image_pixels, settings.jpeg_draft, settings.max_resized_pixels
        )
        self.v2 = VisionForms(self)

    def warmup_feeds(self) -> list[Feeds]:
        return [{"pixel_values": np.zeros((3, *self.transform.crop_size), dtype=np.float32)}]

    def check_outputs(self, feeds: Feeds, outputs: Feeds) -> None:
        if outputs["logits"].shape != (len(self.labels),):
            raise ValueError(
                f"model {self.name}: logits {outputs['logits'].shape} but {len(self.labels)} labels"
            )
        self.check_top_k((), outputs)

    def finish(self, jobs: list[Job], outputs: list[Feeds], top: list[bool]) -> list[Any]:
        """The ranked labels of the rows that ask for them (None for the others): from the top-k
        outputs where `top` says, else one vectorised pass per score function at the largest top_k
        among its rows, each row keeping its own prefix of that ranking."""
        answers: list[Any] = [None] * len(jobs)
        groups: dict[ScoreFunction, list[tuple[int, int]]] = {}
        for i, job in enumerate(jobs):
            if not isinstance(job.answer, Ranking):
                continue
            if top[i]:
                ids, scores = outputs[i][TOP_K_IDS_OUTPUT], outputs[i][TOP_K_SCORES_OUTPUT]
                k = job.answer.top_k
                answers[i] = labelled_rows(ids[None, :k], scores[None, :k], self.labels)[0]
            else:
                groups.setdefault(job.answer.function, []).append((i, job.answer.top_k))
        for function, asks in groups.items():
            logits = np.stack([outputs[i]["logits"] for i, _ in asks])
            ranked = ranked_labels(logits, self.labels, max(k for _, k in asks), function)
            for (i, k), answer in zip(asks, ranked, strict=True):
                answers[i] = answer[:k]
        return answers

    async def submit_image(
        self, image: bytes, deadline: Deadline, answer: Ranking | None, reads: Reads = NOTHING
    ) -> Done:
        """One encoded image through the model's own transform and the batcher, its ranked labels
        (`answer`) and its graph outputs `reads` (the v2 protocol's image input) in what it returns."""
        with self.batcher.arriving(), self.span("preprocess"):
            img = self.transform.open(image)  # the header only: cheap whatever the image
            resized = math.prod(self.transform.resized_size(img.width, img.height))
            if max(img.width * img.height, resized) <= INLINE_DECODE_PIXELS:
                pixels = self.transform.finish(img)
            else:
                capacity = self.settings.max_decoding_pixels
                pixels = await before(decode_in_thread(self.transform, img, capacity), deadline)
        return await self.queued(Job({"pixel_values": pixels}, answer, True, reads), deadline)

    async def classify(
        self, image: bytes, top_k: int, deadline: Deadline, function: ScoreFunction = "softmax"
    ) -> Timed[list[dict[str, Any]]]:
        """The top_k labels; scores are softmax probabilities unless `function` says otherwise (the
        Hugging Face API lets a client ask for sigmoid scores or the raw logits)."""
        if not 1 <= top_k <= len(self.labels):
            raise InvalidInput(
                ErrorCode.INVALID_TOP_K,
                f"top_k must be between 1 and {len(self.labels)} (the number of labels)",
            )
        done = await self.submit_image(image, deadline, Ranking(top_k, function))
        self.span_after("postprocess", *done.finished)
        return Timed(done.answer, done.timings)

    async def hf_answer(self, inputs: str | bytes, options: HFOptions, deadline: Deadline) -> Timed[Any]:
        """`[{"label", "score"}]`; a JSON `inputs` is the image file base64-encoded."""
        if options.targets is not None:
            raise InvalidInput(ErrorCode.INVALID_PARAMETER, "targets apply to fill-mask only")
        image = decode_base64(inputs, "inputs") if isinstance(inputs, str) else inputs
        top_k = min(options.top_k or 5, len(self.labels))  # as HF's pipeline: at most every label
        return await self.classify(image, top_k, deadline, options.function_to_apply or "softmax")


class VisionForms(Forms):
    """`pixel_values`, or `image`: encoded images through the service's own decoding and
    transform, so that a v2 client gets the same logits as `/classify` ranks."""

    encoded_input = IMAGE_INPUT
    served: VisionPipeline

    async def run_encoded(
        self, tensor: Tensor, outputs: list[str], parameters: dict[str, Any], deadline: Deadline
    ) -> Timed[dict[str, Tensor]]:
        images = self.encoded_items(tensor)
        graph = self.graph_outputs(outputs, ["logits"])
        reads = frozenset(graph)
        done = await gather_or_cancel([self.served.submit_image(i, deadline, None, reads) for i in images])
        return timed({name: stacked(name, [d.outputs[name] for d in done]) for name in graph}, done)
