"""A pipeline is a loaded model: spec + ORT session + batcher; a task is a pipeline with its
pre/post-processing and what the transports call.

`Pipeline` is the engine side every task shares (session, batcher, warm-up, recorded check). A
task subclass (`service.tasks.vision`, `service.tasks.fill_mask`) adds its processing, its `v2`
adapter (a `Forms`: the Open Inference Protocol forms of its requests) and its side of the
Hugging Face inference API (`hf_text_input`, `hf_answer`). The transports call those, never
switch on a task's type. Everything refused on the way is a `contract.errors` error; the
transports choose the status codes.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, Self, TypeVar

from contract.check import run_check
from contract.scores import ScoreFunction
from contract.spec import ModelSpec, SpecError
from contract.work import block_macs
from service.engine import rows as batch_jobs
from service.engine.backends import open_runtime, resolve_backend
from service.engine.batcher import BatchObserver, DynamicBatcher, RowQueue
from service.engine.request_context import Deadline, Timed
from service.engine.rows import Done, Job
from service.engine.runtime import (
    Abandon,
    Collate,
    Feeds,
    Runtime,
    RuntimeFacts,
    RuntimeOptions,
    choose_variant,
)
from service.settings import ServiceSettings
from service.tasks.card import card_summary
from service.tasks.forms import Forms
from service.telemetry import tracing
from service.telemetry.metrics import ModelObserver, PredictionMetrics, ServiceMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")
Graph = Runtime | RuntimeFacts


@dataclass(frozen=True)
class HFOptions:
    """The Hugging Face API's `parameters` as they came (None: not given)."""

    top_k: int | None = None
    targets: list[str] | None = None
    function_to_apply: ScoreFunction | None = None


class Pipeline:
    """One served model, ready to answer its task: the session of the chosen variant, the dynamic
    batcher in front of it, and the warm-up that runs every input shape once.

    Built (and warmed up) in a thread, from the model's spec and the service's settings, which
    decide its variant, execution instances, threads and batching. Every request of every API goes
    through the batcher, so they share its batches. `describe` is what GET /models shows of it. A
    task subclass names its task and the `ServiceSettings` field of its default model
    (`default_setting`), and sets its `v2` adapter in `prepare`.
    """

    task = ""
    default_setting = ""
    v2: Forms
    # What a raw Hugging Face API body is: UTF-8 text, which the transport validates as the JSON
    # `inputs` string (True), else the input file itself.
    hf_text_input = False
    # The labels the top-1 answers are counted by; None where there are too many to be the values
    # of a metric's label (a masked LM's vocabulary).
    labels: list[str] | None = None
    collate: Collate | None = None  # how a batch's rows are put together (None: stacked)

    batcher: RowQueue[Job, Done]
    predictions: PredictionMetrics  # where the session runs (`open`): a batch's quality metrics

    def __init__(
        self, spec: ModelSpec, settings: ServiceSettings, version: str, variant: str, runtime: Graph
    ) -> None:
        """The model as the transports see it, over `runtime`: the session itself where it runs
        (`open`), or what an engine process tells a front-end of it (`RuntimeFacts`); the batcher
        (`RowQueue`) is set by whoever built it."""
        self.spec = spec
        self.name = spec.name
        self.settings = settings
        self.variant = variant
        self.runtime = runtime
        # What the arithmetic is done in: the runtime's choice (OpenVINO's bf16), else the file's.
        self.precision = runtime.precision or variant
        self.graph_top_k = batch_jobs.graph_top_k(spec.config, runtime.output_names)
        # Chosen once, at build: with tracing off (the common case) no request or batch of this
        # model enters the tracing code at all.
        self.traced = tracing.configured()
        self.ready = False
        self.version = version  # the repository version it was loaded from
        self.card = card_summary(spec.path, variant)
        self.prepare(spec, settings)

    @classmethod
    def open(
        cls,
        spec: ModelSpec,
        settings: ServiceSettings,
        device: str,
        metrics: ServiceMetrics,
        version: str,
        abandon: Abandon | None = None,
    ) -> Self:
        """The model with its session open and its batcher in front of it (blocking: a thread's).

        The settings decide its variant, execution instances, threads and batching; once `abandon`
        is abandoned, the session's runs stop."""
        backend = resolve_backend(settings.backend, device)
        variant = choose_variant(spec.variants, device, settings.variant, backend)
        instances = settings.resolved_instances(device)
        options = RuntimeOptions(
            device=device,
            intra_op_threads=settings.resolved_threads(instances),
            spinning=settings.ort_spinning,
            backend=backend,
            instances=instances,
            lone_threads=settings.lone_threads_for(device, block_macs(spec.model_config)),
        )
        runtime = open_runtime(spec.variant_path(variant), options, name=spec.name)
        if abandon is not None:  # a load that can be given up: its runs stop when it is
            abandon.watch(runtime)
        model = cls(spec, settings, version, variant, runtime)
        observers: list[BatchObserver] = [ModelObserver(metrics, spec.name, version)]
        if model.traced:
            observers.append(tracing.BatchTracing(spec.name, model.batch_attributes))
        model.batcher = DynamicBatcher(
            model.run_batch,
            max_batch_size=settings.max_batch_size,
            max_queue_delay_s=settings.max_queue_delay_ms / 1000.0,
            max_queue_size=settings.max_queue_size,
            name=spec.name,
            observers=observers,
            always_wait=settings.queue_delay_policy == "always",
            instances=instances,
        )
        model.predictions = PredictionMetrics(metrics, spec.name, version, model.labels)
        metrics.queue_capacity.labels(spec.name, version).set(settings.max_queue_size)
        metrics.model_instances.labels(spec.name, version).set(instances)
        return model

    @property
    def session(self) -> Runtime:
        """The runtime that runs the graph: only where the session is (`open`), never a
        front-end's `RuntimeFacts`."""
        if not isinstance(self.runtime, Runtime):
            raise TypeError(f"model {self.name}: its graph runs in another process")
        return self.runtime

    def prepare(self, spec: ModelSpec, settings: ServiceSettings) -> None:
        """The task's own state (its transform or codec) and its `v2` adapter, once the session is open."""
        raise NotImplementedError

    async def hf_answer(self, inputs: str | bytes, options: HFOptions, deadline: Deadline) -> Timed[Any]:
        """The Hugging Face API's answer, as Hugging Face's pipeline of the task renders it, to
        `inputs` (the JSON `inputs` string, or a raw file's bytes) under `options`."""
        raise NotImplementedError

    def batch_attributes(self, items: list[Job]) -> dict[str, Any]:
        """What a batch's span says of the batch besides its size and instance."""
        return {"gmlp.model.variant": self.variant}

    def run_batch(self, jobs: list[Job]) -> list[Done]:
        """What the batcher runs (blocking, in the batch thread): the requests' feeds in one session
        run, asking only for the outputs the batch needs (`jobs.outputs_to_run`: the top-k pair
        alone when every row is answered from it), then the quality metrics of the observed rows
        and the answers the rows ask for, once for the whole batch."""
        top = [batch_jobs.from_top_k(job.answer, self.graph_top_k) for job in jobs]
        names = batch_jobs.outputs_to_run(jobs, top, self.runtime.output_names)
        outputs = self.run_rows([job.feeds for job in jobs], names)
        start = time.monotonic()
        self.predictions.observe_rows(*batch_jobs.observed_rows(jobs, outputs, top, self.predicted_rows))
        answers = self.finish(jobs, outputs, top)
        finished = (start, time.monotonic())
        return [Done(out, answer, finished) for out, answer in zip(outputs, answers, strict=True)]

    def run_rows(self, items: list[Feeds], names: list[str] | None = None) -> list[Feeds]:
        """The requests' feeds in one session run, the outputs `names` (default: all) per request."""
        return self.session.run_batch(items, self.collate, names)

    def finish(self, jobs: list[Job], outputs: list[Feeds], top: list[bool]) -> list[Any]:
        """Each job's answer (None where it asks for the outputs alone), vectorised over the rows;
        `top` marks the rows answered from the graph's top-k outputs."""
        return [None] * len(jobs)

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
        """Run every shape at batch 1, the largest also as a full batch (blocking), each output
        checked: a graph that cannot answer is refused here, not on a client's request. The memory
        these runs take is given back (`Runtime.warming`)."""
        shapes = self.warmup_feeds()
        with self.session.warming():
            with self.session.on_every_session():
                for feeds in shapes:
                    self.check_outputs(feeds, self.run_rows([feeds])[0])
            # The full batch on the instances' session only: a lone session runs one row.
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
        problem = run_check(self.spec.path, entry, self.variant, self.check_run, self.runtime.precision)
        if problem is not None:
            raise SpecError(f"{self.variant} graph {self.spec.variant_path(self.variant).name}: {problem}")

    def check_run(self, feeds: Feeds) -> Feeds:
        """The graph on one recorded batch of the export's check, as the service runs a batch."""
        return self.session.run(feeds)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "task": self.task,
            "n": self.spec.seq_len,
            "variant": self.variant,
            "variants": sorted(self.spec.variants),
            "provider": self.runtime.provider,
            "precision": self.precision,
            "instances": self.batcher.instances,
            "intra_op_threads": self.runtime.options.intra_op_threads,
            "lone_threads": self.runtime.lone_threads,
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

    def span(self, name: str) -> AbstractContextManager[Any]:
        """A child span of the request's span around a step (`tracing.span`); a shared no-op
        when tracing is off."""
        return tracing.span(name) if self.traced else tracing.NO_SPAN

    def span_after(self, name: str, start: float, end: float) -> None:
        """A child span of the request's span for a step measured elsewhere (`tracing.span_after`)."""
        if self.traced:
            tracing.span_after(name, start, end)

    async def queued(self, job: Job, deadline: Deadline) -> Done:
        """One row through the batcher, with the queue wait and batch run it came back with."""
        batched = await self.batcher.submit(job, deadline)
        return replace(batched.output, timings=batched.timings)
