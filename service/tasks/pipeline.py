"""A pipeline is a loaded model: spec + ORT session + batcher + the task's pre/post-processing.

`VisionPipeline.classify` and `FillMaskPipeline.fill_mask` are the whole task logic the transports
call: preprocess (in a thread, off the event loop, unless the input is small enough that the
hand-over would cost more), submit to the batcher, postprocess. Everything refused on the way is a
`contract.errors` error; the transports choose the status codes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from contract.check import run_check
from contract.errors import ErrorCode, InvalidInput
from contract.formats import MAX_FILL_MASK_TOP_K, MLM_TASK, VISION_TASK
from contract.image import ImageTransform
from contract.scores import ScoreFunction
from contract.spec import ModelSpec, SpecError
from contract.text import LENGTH_MULTIPLE, EncodedText, FillMaskCodec
from service.engine import request_context
from service.engine import rows as batch_jobs
from service.engine.batcher import DynamicBatcher
from service.engine.deadline import Deadline, before
from service.engine.rows import NOTHING, Decoding, Done, Job, Ranking, Reads
from service.engine.runtime import Feeds, OnnxModel, RuntimeOptions, choose_variant
from service.settings import ServiceSettings
from service.tasks.card import card_summary
from service.tasks.decode_budget import decode_in_thread
from service.telemetry import tracing
from service.telemetry.metrics import DEFAULT_VERSION, ServiceMetrics

log = logging.getLogger(__name__)

# Inputs this small are prepared on the event loop: handing them to a thread costs more (thread
# wake-ups, a GIL hand-over each way) than decoding or tokenising them, which stays short enough
# not to hold up the other requests. Anything larger is prepared in a thread, off the event loop.
INLINE_DECODE_PIXELS = 128 * 128
INLINE_ENCODE_CHARS = 1000


class Pipeline:
    """One served model, ready to answer its task: the ONNX Runtime session of the chosen variant,
    the dynamic batcher in front of it, and the warm-up that runs every input shape once.

    A pipeline is built (and warmed up) in a thread at start-up, from the model's spec and the
    service's settings, which decide its variant, execution instances, threads and batching; the
    transports then only call its task method (`VisionPipeline.classify`,
    `FillMaskPipeline.fill_mask`) or `infer` (a request's raw graph inputs). Every request goes
    through the batcher, so concurrent requests of every API share its batches. `describe` is what
    GET /models shows of it.
    """

    task = ""

    def __init__(
        self,
        spec: ModelSpec,
        settings: ServiceSettings,
        device: str,
        metrics: ServiceMetrics,
        version: str = DEFAULT_VERSION,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.settings = settings
        self.variant = choose_variant(spec.variants, device, settings.variant)
        instances = settings.resolved_instances(device)
        options = RuntimeOptions(
            device=device,
            intra_op_threads=settings.resolved_threads(instances),
            spinning=settings.ort_spinning,
        )
        self.runtime = OnnxModel(spec.variant_path(self.variant), options, name=spec.name)
        self.graph_top_k = batch_jobs.graph_top_k(spec.config, self.runtime.output_names)
        self.batcher: DynamicBatcher[Job, Done] = DynamicBatcher(
            self.run_batch,
            max_batch_size=settings.max_batch_size,
            max_queue_delay_s=settings.max_queue_delay_ms / 1000.0,
            max_queue_size=settings.max_queue_size,
            name=spec.name,
            observers=[
                metrics.observer(spec.name, version),
                tracing.BatchTracing(spec.name, self.batch_attributes),
            ],
            always_wait=settings.queue_delay_policy == "always",
            instances=instances,
        )
        self.ready = False
        self.version = version  # the repository version it was loaded from
        self.card = card_summary(spec.path, self.variant)
        self.predictions = metrics.predictions(spec.name, self.prediction_labels(spec), version)
        metrics.queue_capacity.labels(spec.name, version).set(settings.max_queue_size)
        metrics.model_instances.labels(spec.name, version).set(instances)

    def prediction_labels(self, spec: ModelSpec) -> list[str] | None:
        """The labels the top-1 answers are counted by; None where there are too many to be the
        values of a metric's label (a masked LM's vocabulary)."""
        return None

    def batch_attributes(self, items: list[Job]) -> dict[str, Any]:
        """What a batch's span says of the batch besides its size and instance."""
        return {"gmlp.model.variant": self.variant}

    def run_batch(self, jobs: list[Job]) -> list[Done]:
        """What the batcher runs (blocking, in the batch thread): the requests' feeds in one session
        run, asking only for the outputs the batch needs (`jobs.outputs_to_run`: the top-k pair
        alone when every row is answered from it), then the answers they ask for and the quality
        metrics, once for the whole batch."""
        top = [batch_jobs.from_top_k(job.answer, self.graph_top_k) for job in jobs]
        names = batch_jobs.outputs_to_run(jobs, top, self.runtime.output_names)
        outputs = self.run_rows([job.feeds for job in jobs], names)
        start = time.monotonic()
        answers = self.finish(jobs, outputs, top)
        finished = (start, time.monotonic())
        return [Done(out, answer, finished) for out, answer in zip(outputs, answers, strict=True)]

    def run_rows(self, items: list[Feeds], names: list[str] | None = None) -> list[Feeds]:
        """The requests' feeds in one session run, the outputs `names` (default: all) per request."""
        return self.runtime.run_batch(items, names=names)

    def finish(self, jobs: list[Job], outputs: list[Feeds], top: list[bool]) -> list[Any]:
        """Each job's answer (None where it asks for the outputs alone), vectorised over the rows;
        `top` marks the rows answered from the graph's top-k outputs."""
        return [None] * len(jobs)

    def observe(self, jobs: list[Job], outputs: list[Feeds], top: list[bool]) -> None:
        """The quality metrics of the batch's observed rows (`jobs.observed_rows`)."""
        self.predictions.observe_rows(*batch_jobs.observed_rows(jobs, outputs, top, self.predicted_rows))

    def predicted_rows(self, job: Job) -> int:
        return 1  # how many leading rows of a job's outputs are its predictions

    def check_top_k(self, rows: tuple[int, ...], outputs: Feeds) -> None:
        """Raise if the top-k outputs of a run are not `rows` rows of K (`graph_top_k`)."""
        for name in batch_jobs.TOP_K_OUTPUTS if self.graph_top_k else ():
            if outputs[name].shape != (*rows, self.graph_top_k):
                raise ValueError(f"model {self.name}: {name} {outputs[name].shape}, K = {self.graph_top_k}")

    def warmup_feeds(self) -> list[Feeds]:
        """One request per input shape the service will run (the largest last)."""
        raise NotImplementedError

    def check_outputs(self, feeds: Feeds, outputs: Feeds) -> None:
        """Raise if the graph's outputs do not fit the metadata (caught at start-up, not per request)."""

    def warm_up(self) -> None:
        """Run every shape at batch 1, the largest also as a full batch (blocking): the first runs of
        a shape allocate ORT's memory arenas, which should not happen on a client's request."""
        shapes = self.warmup_feeds()
        for feeds in shapes:
            self.check_outputs(feeds, self.run_rows([feeds])[0])
        if self.settings.max_batch_size > 1:
            self.check_outputs(shapes[-1], self.run_rows([shapes[-1]] * self.settings.max_batch_size)[0])

    def verify(self) -> None:
        """Raise SpecError unless the chosen variant answers the export's recorded check as the export
        recorded it (`contract.check`); a directory exported before checks were recorded passes
        with a warning, its graph contract checked by the warm-up alone."""
        entry = self.spec.config.get("check")
        if entry is None:
            log.warning(
                "model %s: no recorded check in %s; only its contract is checked", self.name, self.spec.path
            )
            return
        problem = run_check(self.spec.path, entry, self.variant, self.check_run)
        if problem is not None:
            raise SpecError(f"{self.variant} graph {self.spec.variant_path(self.variant).name}: {problem}")

    def check_run(self, feeds: Feeds) -> Feeds:
        """The graph on one recorded batch of the export's check, as the service runs a batch."""
        return self.runtime.run(feeds)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "task": self.task,
            "n": self.spec.seq_len,
            "variant": self.variant,
            "variants": sorted(self.spec.variants),
            "provider": self.runtime.provider,
            "instances": self.batcher.instances,
            "intra_op_threads": self.runtime.options.intra_op_threads,
            "rows_batched": self.runtime.row_independent,
            "graph_top_k": self.graph_top_k,
            "ready": self.ready,
            "batching": {
                "max_batch_size": self.batcher.max_batch_size,
                "max_queue_delay_ms": self.batcher.max_queue_delay_s * 1000.0,
                "max_queue_size": self.batcher.max_queue_size,
                "queue_delay_policy": "always" if self.batcher.always_wait else "arriving",
            },
            "card": self.card,
        }

    async def queued(self, job: Job, deadline: Deadline) -> Done:
        """One row through the batcher; the times it returns go to the request's Server-Timing."""
        batched = await self.batcher.submit(job, deadline)
        request_context.note_batch(batched.queue_s, batched.run_s)
        return batched.output

    async def infer(self, feeds: Feeds, deadline: Deadline, names: frozenset[str] | None = None) -> Feeds:
        """One request's model outputs (`names`; default: all), in whatever batch forms."""
        return (await self.queued(Job(feeds, reads=names), deadline)).outputs


class VisionPipeline(Pipeline):
    """An image classifier: an encoded image through the model's own transform (`contract.image`),
    the batcher, and scores over its labels (softmax, unless the API asks for another function)."""

    task = VISION_TASK

    def __init__(
        self,
        spec: ModelSpec,
        settings: ServiceSettings,
        device: str,
        metrics: ServiceMetrics,
        version: str = DEFAULT_VERSION,
    ) -> None:
        super().__init__(spec, settings, device, metrics, version)
        self.labels = spec.labels()
        self.transform = ImageTransform.for_model(
            spec.config, settings.max_image_pixels, settings.jpeg_draft, settings.max_resized_pixels
        )

    def prediction_labels(self, spec: ModelSpec) -> list[str] | None:
        return spec.labels()

    def warmup_feeds(self) -> list[Feeds]:
        h, w = self.transform.crop_size
        return [{"pixel_values": np.zeros((3, h, w), dtype=np.float32)}]

    def check_outputs(self, feeds: Feeds, outputs: Feeds) -> None:
        if outputs["logits"].shape != (len(self.labels),):
            raise ValueError(
                f"model {self.name}: logits {outputs['logits'].shape} but {len(self.labels)} labels"
            )
        self.check_top_k((), outputs)

    def finish(self, jobs: list[Job], outputs: list[Feeds], top: list[bool]) -> list[Any]:
        """The ranked labels of the rows that ask for them: from the top-k outputs where `top`
        says, else one vectorised pass per score function (at the largest top_k among its rows;
        each row keeps its own prefix of the ranking)."""
        self.observe(jobs, outputs, top)
        return batch_jobs.rank_rows(jobs, outputs, self.labels, top)

    async def logits(self, image: bytes, deadline: Deadline) -> np.ndarray:
        """The logits of one encoded image, through the model's own transform and the batcher."""
        return (await self.image_outputs(image, deadline, frozenset({"logits"})))["logits"]

    async def image_outputs(self, image: bytes, deadline: Deadline, names: frozenset[str]) -> Feeds:
        """The graph outputs `names` of one encoded image (the v2 protocol's image input)."""
        return (await self._submit(image, deadline, None, names)).outputs

    async def _submit(
        self, image: bytes, deadline: Deadline, answer: Ranking | None, reads: Reads = NOTHING
    ) -> Done:
        """One encoded image through the model's own transform and the batcher."""
        with self.batcher.arriving(), tracing.span("preprocess"):
            img = self.transform.open(image)  # the header only: cheap whatever the image
            if img.width * img.height <= INLINE_DECODE_PIXELS:
                pixels = self.transform.finish(img)
            else:
                capacity = self.settings.max_decoding_pixels
                pixels = await before(decode_in_thread(self.transform, img, capacity), deadline)
        return await self.queued(Job({"pixel_values": pixels}, answer, True, reads), deadline)

    async def classify(
        self, image: bytes, top_k: int, deadline: Deadline, function: ScoreFunction = "softmax"
    ) -> list[dict[str, Any]]:
        """The top_k labels; scores are softmax probabilities unless `function` says otherwise (the
        Hugging Face API lets a client ask for sigmoid scores or the raw logits)."""
        if not 1 <= top_k <= len(self.labels):
            raise InvalidInput(
                ErrorCode.INVALID_TOP_K,
                f"top_k must be between 1 and {len(self.labels)} (the number of labels)",
            )
        done = await self._submit(image, deadline, Ranking(top_k, function))
        tracing.span_after("postprocess", *done.finished)
        answer: list[dict[str, Any]] = done.answer
        return answer


class FillMaskPipeline(Pipeline):
    """A masked LM: a text with [MASK] tokens through the model's tokenizer (`contract.text`), the
    batcher, and the ranked predictions per mask. A batch runs at its longest text (rounded up to
    a multiple of 8 tokens) unless `fixed_length` or a graph with static shapes asks for n."""

    task = MLM_TASK

    def __init__(
        self,
        spec: ModelSpec,
        settings: ServiceSettings,
        device: str,
        metrics: ServiceMetrics,
        version: str = DEFAULT_VERSION,
    ) -> None:
        super().__init__(spec, settings, device, metrics, version)
        self.codec = FillMaskCodec(spec.tokenizer_path(), spec.model_config, model_name=spec.name)
        # A graph exported with static shapes (format_version 1) runs at n with every slot.
        static = any(d is not None for d in self.runtime.static_dims("input_ids")[1:])
        self.fixed_length = settings.fixed_length or static

    def collate(self, items: Sequence[Feeds]) -> Feeds:
        return self.codec.collate(items, fixed=self.fixed_length)

    def run_rows(self, items: list[Feeds], names: list[str] | None = None) -> list[Feeds]:
        return self.runtime.run_batch(items, self.collate, names)

    def predicted_rows(self, job: Job) -> int:
        return len(job.feeds["mask_positions"])

    def finish(self, jobs: list[Job], outputs: list[Feeds], top: list[bool]) -> list[Any]:
        """The quality metrics of the task requests' mask rows, and the decoded predictions of those
        that ask for them: from the top-k outputs where `top` says, else from the logits
        (`FillMaskCodec.decode_batch`: the batch's normalisers in one pass)."""
        self.observe(jobs, outputs, top)
        return batch_jobs.decode_rows(jobs, outputs, self.codec, top)

    def warmup_feeds(self) -> list[Feeds]:
        """[MASK]-only texts at every padded length a batch can have, one mask, then the largest."""
        codec = self.codec
        lengths = {codec.padded_length(length, fixed=self.fixed_length) for length in range(1, codec.n + 1)}
        shapes = [{"input_ids": np.full(length, codec.mask_id, np.int64)} for length in sorted(lengths)]
        for feeds in shapes:
            feeds["mask_positions"] = np.zeros(1, np.int64)
        shapes[-1]["mask_positions"] = np.arange(min(codec.max_predictions, codec.n), dtype=np.int64)
        return shapes

    def check_outputs(self, feeds: Feeds, outputs: Feeds) -> None:
        slots = self.codec.max_predictions if self.fixed_length else len(feeds["mask_positions"])
        expected = (slots, self.codec.vocab_size)
        if outputs["logits"].shape != expected:
            raise ValueError(f"model {self.name}: logits {outputs['logits'].shape}, expected {expected}")
        self.check_top_k((slots,), outputs)

    def batch_attributes(self, items: list[Job]) -> dict[str, Any]:
        length = self.codec.padded_length(
            max(len(i.feeds["input_ids"]) for i in items), fixed=self.fixed_length
        )
        return {**super().batch_attributes(items), "gmlp.batch.padded_length": length}

    def check_run(self, feeds: Feeds) -> Feeds:
        """Collated as requests are (to the padded length; n and every slot for a graph with
        static shapes), the recorded slots read back."""
        ids, positions = feeds["input_ids"], feeds["mask_positions"]
        rows = [{"input_ids": i, "mask_positions": p} for i, p in zip(ids, positions, strict=True)]
        outputs = self.runtime.run(self.collate(rows))
        return {name: out[:, : positions.shape[1]] for name, out in outputs.items()}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "fixed_length": self.fixed_length, "length_multiple": LENGTH_MULTIPLE}

    async def fill_mask(
        self, text: str, top_k: int, targets: list[str] | None, deadline: Deadline
    ) -> list[list[dict[str, Any]]]:
        if not 1 <= top_k <= MAX_FILL_MASK_TOP_K:
            raise InvalidInput(ErrorCode.INVALID_TOP_K, f"top_k must be between 1 and {MAX_FILL_MASK_TOP_K}")
        _, _, done = await self._submit(text, deadline, targets, top_k, NOTHING)
        tracing.span_after("postprocess", *done.finished)
        answer: list[list[dict[str, Any]]] = done.answer
        return answer

    async def decoded_text(self, text: str, top_k: int, deadline: Deadline, names: frozenset[str]) -> Done:
        """A text's graph outputs `names` (rows [slots, ...]) and its top_k per mask, decoded in the
        batch thread (the v2 protocol's text input)."""
        return (await self._submit(text, deadline, None, top_k, names))[2]

    async def infer_decoded(
        self, feeds: Feeds, top_k: int, deadline: Deadline, names: frozenset[str] | None = None
    ) -> Done:
        """A token-id request's outputs `names` (default: all) and its top_k per mask, decoded in
        the batch thread (the v2 protocol's graph inputs with the predictions output asked for)."""
        ids, positions = feeds["input_ids"].tolist(), feeds["mask_positions"].tolist()
        answer = Decoding(EncodedText(ids, positions, feeds), top_k)
        return await self.queued(Job(feeds, answer, reads=names), deadline)

    async def _submit(
        self, text: str, deadline: Deadline, targets: list[str] | None, top_k: int | None, reads: Reads
    ) -> tuple[EncodedText, list[int] | None, Done]:
        """A text through the model's tokenizer and the batcher; decoded in the batch thread when
        `top_k` is given."""
        with self.batcher.arriving(), tracing.span("preprocess"):
            if len(text) <= INLINE_ENCODE_CHARS:
                encoded = self.codec.encode(text)
            else:
                encoded = await before(asyncio.to_thread(self.codec.encode, text), deadline)
            target_ids = None if targets is None else self.codec.target_ids(targets)
        answer = None if top_k is None else Decoding(encoded, top_k, target_ids)
        done = await self.queued(Job(encoded.feeds, answer, True, reads), deadline)
        return encoded, target_ids, done


PIPELINES: dict[str, type[Pipeline]] = {VISION_TASK: VisionPipeline, MLM_TASK: FillMaskPipeline}


def load_pipeline(
    spec: ModelSpec,
    settings: ServiceSettings,
    device: str,
    metrics: ServiceMetrics,
    version: str = DEFAULT_VERSION,
) -> Pipeline:
    """Create the session, warm it up and check it against its recorded check (blocking; call from
    a thread)."""
    model = PIPELINES[spec.task](spec, settings, device, metrics, version)
    model.warm_up()
    model.verify()
    return model


__all__ = ["Pipeline", "VisionPipeline", "FillMaskPipeline", "load_pipeline", "PIPELINES"]
