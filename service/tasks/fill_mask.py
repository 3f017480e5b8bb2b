"""Fill-mask: the pipeline (with its Hugging Face API answer) and its v2 forms.

A text with [MASK] tokens goes through the model's tokenizer (`contract.text`), the batcher, and
the ranked predictions per mask, decoded in the batch thread. Over v2 the encoded form is `text`
(BYTES, one text per row) and the task adds the output `predictions` (BYTES, per row the JSON list
`/fill-mask` returns, one ranked list per [MASK]; request parameter `top_k`), which the graph's
token ids can ask for too; over the Hugging Face API a raw body is the UTF-8 text.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from contract.errors import ErrorCode, InvalidInput
from contract.formats import MAX_FILL_MASK_TOP_K, MLM_TASK, TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT
from contract.spec import ModelSpec
from contract.tensors import BYTES, Tensor
from contract.text import LENGTH_MULTIPLE, EncodedText, FillMaskCodec
from service.engine.request_context import Deadline, Timed, before
from service.engine.rows import NOTHING, Done, Job, Reads
from service.engine.runtime import Collate, Feeds
from service.settings import ServiceSettings
from service.tasks.forms import (
    PREDICTIONS_OUTPUT,
    TEXT_INPUT,
    Forms,
    gather_or_cancel,
    predictions,
    stacked,
    tensor_meta,
    timed,
    top_k_parameter,
    utf8,
)
from service.tasks.pipeline import HFOptions, Pipeline

# Texts this short are tokenised on the event loop: handing them to a thread costs more (thread
# wake-ups, a GIL hand-over each way) than tokenising them. Anything longer is tokenised in a
# thread, off the event loop.
INLINE_ENCODE_CHARS = 1000


@dataclass(frozen=True, eq=False)
class Decoding:
    """A fill-mask request's answer: the `top_k` tokens of each [MASK] (among `target_ids`)."""

    encoded: EncodedText
    top_k: int
    target_ids: list[int] | None = None

    @property
    def whole_row_softmax(self) -> bool:
        return self.target_ids is None


class FillMaskPipeline(Pipeline):
    """A masked LM: a text with [MASK] tokens through the model's tokenizer (`contract.text`), the
    batcher, and the ranked predictions per mask. A batch runs at its longest text (rounded up to
    a multiple of 8 tokens) unless `fixed_length` or a graph with static shapes asks for n."""

    task = MLM_TASK
    default_setting = "default_fill_mask"
    hf_text_input = True
    collate: Collate

    def prepare(self, spec: ModelSpec, settings: ServiceSettings) -> None:
        self.codec = FillMaskCodec(spec.tokenizer_path(), spec.model_config, model_name=spec.name)
        # A graph exported with static shapes (format_version 1) runs at n with every slot.
        static = any(d is not None for d in self.runtime.static_dims("input_ids")[1:])
        self.fixed_length = settings.fixed_length or static
        self.collate = partial(self.codec.collate, fixed=self.fixed_length)
        self.v2 = FillMaskForms(self)

    def predicted_rows(self, job: Job) -> int:
        return len(job.feeds["mask_positions"])

    def finish(self, jobs: list[Job], outputs: list[Feeds], top: list[bool]) -> list[Any]:
        """The decoded predictions of the rows that ask for them (None for the others): from the
        top-k outputs where `top` says (`FillMaskCodec.decode_top`), else from the logits with the
        normalisers of all their mask rows in one pass (`FillMaskCodec.decode_batch`)."""
        answers: list[Any] = [None] * len(jobs)
        asks = []
        for i, job in enumerate(jobs):
            if not isinstance(job.answer, Decoding):
                continue
            if top[i]:
                ids, scores = outputs[i][TOP_K_IDS_OUTPUT], outputs[i][TOP_K_SCORES_OUTPUT]
                answers[i] = self.codec.decode_top(job.answer.encoded, ids, scores, job.answer.top_k)
            else:
                asks.append((i, job.answer))
        if asks:
            decoded = self.codec.decode_batch(
                [a.encoded for _, a in asks],
                [outputs[i]["logits"] for i, _ in asks],
                [a.top_k for _, a in asks],
                [a.target_ids for _, a in asks],
            )
            for (i, _), answer in zip(asks, decoded, strict=True):
                answers[i] = answer
        return answers

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
        outputs = self.session.run(self.collate(rows))
        return {name: out[:, : positions.shape[1]] for name, out in outputs.items()}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "fixed_length": self.fixed_length, "length_multiple": LENGTH_MULTIPLE}

    async def fill_mask(
        self, text: str, top_k: int, targets: list[str] | None, deadline: Deadline
    ) -> Timed[list[list[dict[str, Any]]]]:
        if not 1 <= top_k <= MAX_FILL_MASK_TOP_K:
            raise InvalidInput(ErrorCode.INVALID_TOP_K, f"top_k must be between 1 and {MAX_FILL_MASK_TOP_K}")
        done = await self.submit_text(text, deadline, targets, top_k, NOTHING)
        self.span_after("postprocess", *done.finished)
        return Timed(done.answer, done.timings)

    async def hf_answer(self, inputs: str | bytes, options: HFOptions, deadline: Deadline) -> Timed[Any]:
        """`[{"score", "token", "token_str", "sequence"}]` for one [MASK], a list of such lists
        for several."""
        if options.function_to_apply is not None:
            raise InvalidInput(
                ErrorCode.INVALID_PARAMETER, "function_to_apply applies to image classification only"
            )
        text = inputs if isinstance(inputs, str) else utf8(inputs)
        answer = await self.fill_mask(text, options.top_k or 5, options.targets, deadline)
        return Timed(answer.value[0] if len(answer.value) == 1 else answer.value, answer.timings)

    async def submit_text(
        self, text: str, deadline: Deadline, targets: list[str] | None, top_k: int, reads: Reads
    ) -> Done:
        """A text through the model's tokenizer and the batcher, its top_k per mask decoded in the batch
        thread, and its graph outputs `reads` (rows [slots, ...]: the v2 protocol's text input)."""
        with self.batcher.arriving(), self.span("preprocess"):
            if len(text) <= INLINE_ENCODE_CHARS:
                encoded = self.codec.encode(text)
            else:
                encoded = await before(asyncio.to_thread(self.codec.encode, text), deadline)
            target_ids = None if targets is None else self.codec.target_ids(targets)
        return await self.queued(
            Job(encoded.feeds, Decoding(encoded, top_k, target_ids), True, reads), deadline
        )


class FillMaskForms(Forms):
    """`input_ids` + `mask_positions`, or `text`; both can ask for `predictions` and the graph's
    outputs (a text's rows are its [MASK]s)."""

    encoded_input = TEXT_INPUT
    served: FillMaskPipeline

    extra_outputs = (tensor_meta(PREDICTIONS_OUTPUT, BYTES, [-1, 1]),)

    def check_tensors(self, given: dict[str, Tensor]) -> None:
        """Lengths within the model's limits, ids in the vocabulary, positions inside the text: an
        out-of-range index would make the graph's Gather fail (or read garbage), so refuse it here."""
        codec = self.served.codec
        ids, positions = given["input_ids"].array, given["mask_positions"].array
        length, slots = ids.shape[1], positions.shape[1]
        if length > codec.n or slots > codec.max_predictions:
            raise InvalidInput(
                ErrorCode.INVALID_INPUTS,
                f"input_ids may have at most {codec.n} tokens and mask_positions at most "
                f"{codec.max_predictions} entries, got {length} and {slots}",
            )
        bounds = (("input_ids", ids, codec.vocab_size), ("mask_positions", positions, length))
        for name, values, upper in bounds:
            if values.min() < 0 or values.max() >= upper:
                raise InvalidInput(ErrorCode.INVALID_INPUTS, f"values of {name} must be in [0, {upper})")

    async def run_tensors(
        self, inputs: list[Tensor], outputs: list[str], parameters: dict[str, Any], deadline: Deadline
    ) -> Timed[dict[str, Tensor]]:
        """Token ids; with `predictions` asked for, decoded in the batch thread as their text would be."""
        if PREDICTIONS_OUTPUT not in outputs:
            return await super().run_tensors(inputs, outputs, parameters, deadline)
        top_k = top_k_parameter(parameters)
        rows = self.tensor_rows(inputs)
        graph = self.graph_outputs(outputs, [])
        reads = frozenset(graph)
        encoded = [EncodedText(r["input_ids"].tolist(), r["mask_positions"].tolist(), r) for r in rows]
        jobs = [Job(e.feeds, Decoding(e, top_k), reads=reads) for e in encoded]
        done = await gather_or_cancel([self.served.queued(job, deadline) for job in jobs])
        produced = {name: stacked(name, [d.outputs[name] for d in done]) for name in graph}
        produced[PREDICTIONS_OUTPUT] = predictions([d.answer for d in done], [len(rows), 1])
        return timed(produced, done)

    async def run_encoded(
        self, tensor: Tensor, outputs: list[str], parameters: dict[str, Any], deadline: Deadline
    ) -> Timed[dict[str, Tensor]]:
        top_k = top_k_parameter(parameters)
        texts = [utf8(item) for item in self.encoded_items(tensor)]
        graph = self.graph_outputs(outputs, [])
        reads = frozenset(graph)
        runs = await gather_or_cancel(
            [self.served.submit_text(t, deadline, None, top_k, reads) for t in texts]
        )
        produced = {PREDICTIONS_OUTPUT: predictions([run.answer for run in runs], tensor.shape)}
        for name in graph:
            produced[name] = stacked(name, [run.outputs[name][: len(run.answer)] for run in runs])
        return timed(produced, runs)
