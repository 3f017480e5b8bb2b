"""The Open Inference Protocol forms of a task's requests (`Forms`, which each task extends) and
what they share: tensor metadata, stacking rows into output tensors, the `top_k` parameter
and the `predictions` output. Metadata keeps the served config's shapes: a named (dynamic) axis
is -1, so a masked LM takes any length up to n and any number of positions up to
max_predictions. Every refusal names the tensor and is an `InvalidInput`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np

from contract.errors import ErrorCode, InvalidInput
from contract.formats import MAX_FILL_MASK_TOP_K
from contract.spec import ModelSpec
from contract.tensors import BYTES, Tensor, bytes_tensor, datatype_of
from service.engine.batcher import RowQueue
from service.engine.request_context import Deadline, Timed, Timings
from service.engine.rows import Done, Job
from service.engine.runtime import Feeds, Runtime, RuntimeFacts

T = TypeVar("T")
IMAGE_INPUT, TEXT_INPUT, PREDICTIONS_OUTPUT = "image", "text", "predictions"


def tensor_meta(name: str, datatype: str, shape: Sequence[Any]) -> dict[str, Any]:
    """Tensor metadata; a named (dynamic) dimension is -1."""
    return {"name": name, "datatype": datatype, "shape": [d if isinstance(d, int) else -1 for d in shape]}


def graph_tensors(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The graph's tensors as the served config declares them."""
    return [
        tensor_meta(e["name"], datatype_of(np.dtype(str(e.get("dtype", "float32")))), e["shape"])
        for e in entries
    ]


async def gather_or_cancel(work: Sequence[Awaitable[T]]) -> list[T]:
    """Await all; if one fails (a row refused, the queue full), the others are withdrawn at once."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


def top_k_parameter(parameters: dict[str, Any]) -> int:
    top_k = parameters.get("top_k", 5)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_FILL_MASK_TOP_K:
        raise InvalidInput(
            ErrorCode.INVALID_TOP_K, f"parameter top_k must be an integer in 1..{MAX_FILL_MASK_TOP_K}"
        )
    return top_k


def stacked(name: str, rows: Sequence[np.ndarray]) -> Tensor:
    """A graph output of a request's rows (images, or texts with their [MASK] rows), as one tensor."""
    if len({row.shape for row in rows}) != 1:
        raise InvalidInput(
            ErrorCode.INVALID_OUTPUTS,
            f"output {name} needs the same number of [MASK] tokens in every text of a request; "
            "ask for predictions only, or send the texts in separate requests",
        )
    array = np.stack(rows)
    return Tensor(name, datatype_of(array.dtype), array)


def predictions(answers: Sequence[Any], shape: Sequence[int]) -> Tensor:
    """The JSON of `/fill-mask` for each row (decoded in the batch thread), as a BYTES tensor of
    `shape` (one element per row)."""
    items = [json.dumps(answer, ensure_ascii=False).encode("utf-8") for answer in answers]
    return bytes_tensor(PREDICTIONS_OUTPUT, items, shape)


def utf8(item: bytes) -> str:
    try:
        return item.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(ErrorCode.INVALID_TEXT, "input text must be UTF-8 encoded") from None


class Adapted(Protocol):
    """What a task's forms need of the model they adapt (`service.tasks.pipeline.Pipeline`)."""

    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def runtime(self) -> Runtime | RuntimeFacts: ...

    @property
    def batcher(self) -> RowQueue[Job, Done]: ...

    async def queued(self, job: Job, deadline: Deadline) -> Done: ...


class Forms:
    """A task's Open Inference Protocol forms: the graph's own tensors, and the encoded input
    (`encoded_input`: one image file or text per row) that runs the task's own preprocessing.

    `inputs` is the metadata of one form's inputs, `outputs` that of every output (each form
    produces all of them); `run` answers a request of either form, told apart by its input names.
    Metadata entries are `{"name", "datatype", "shape"}` with the batch axis first (-1: any size).
    The graph-tensor form is here; a task's subclass adds its encoded input (`run_encoded`),
    outputs beyond the graph's (`extra_outputs`: a masked LM's decoded `predictions`) and checks
    of the graph tensors' values (`check_tensors`)."""

    encoded_input = ""
    extra_outputs: Sequence[dict[str, Any]] = ()  # outputs the task adds to the graph's (both forms)

    def __init__(self, served: Adapted) -> None:
        self.served = served

    def inputs(self, encoded: bool) -> list[dict[str, Any]]:
        if encoded:
            return [tensor_meta(self.encoded_input, BYTES, [-1, 1])]
        return graph_tensors(self.served.spec.inputs)

    def outputs(self) -> list[dict[str, Any]]:
        return [*graph_tensors(self.served.spec.outputs), *self.extra_outputs]

    def output_names(self) -> list[str]:
        """Every output the model lists; each input form produces all of them."""
        return [*self.served.runtime.output_names, *(t["name"] for t in self.extra_outputs)]

    def graph_outputs(self, requested: list[str], default: Sequence[str]) -> list[str]:
        """The graph outputs a request asks for, in the graph's order (`default` when it names none)."""
        names = self.served.runtime.output_names
        return [n for n in names if n in requested] if requested else [n for n in names if n in default]

    def rows(self, count: int) -> int:
        limit = self.served.batcher.max_batch_size
        if not 1 <= count <= limit:
            raise InvalidInput(
                ErrorCode.INVALID_BATCH, f"a request has between 1 and {limit} rows, got {count}"
            )
        return count

    def encoded_items(self, tensor: Tensor) -> list[bytes]:
        """The elements of the encoded input: shape [rows] or [rows, 1], datatype BYTES."""
        if tensor.datatype != BYTES or not (
            len(tensor.shape) == 1 or (len(tensor.shape) == 2 and tensor.shape[1] == 1)
        ):
            raise InvalidInput(
                ErrorCode.INVALID_INPUTS,
                f"input {tensor.name} must be BYTES with shape [rows] or [rows, 1], one element per "
                f"row; got {tensor.datatype} {tensor.shape}",
            )
        self.rows(tensor.shape[0])
        return list(tensor.array.ravel())

    def check_tensors(self, given: dict[str, Tensor]) -> None:
        """Refuse values the graph cannot take (the shapes and datatypes are checked already)."""

    def tensor_rows(self, inputs: list[Tensor]) -> list[Feeds]:
        """Validate raw tensors against the graph's inputs and split them into per-request rows."""
        expected = {e["name"]: e for e in self.inputs(encoded=False)}
        given = {t.name: t for t in inputs}
        for name, tensor in given.items():
            meta = expected[name]
            if tensor.datatype != meta["datatype"]:
                raise InvalidInput(
                    ErrorCode.INVALID_INPUTS,
                    f"input {name} must have datatype {meta['datatype']}, got {tensor.datatype}",
                )
            dims = meta["shape"]
            if len(tensor.shape) != len(dims) or any(
                d not in (-1, t) or t < 1 for t, d in zip(tensor.shape[1:], dims[1:], strict=True)
            ):
                raise InvalidInput(
                    ErrorCode.INVALID_INPUTS,
                    f"input {name} must have shape {meta['shape']} (-1: any size), got {tensor.shape}",
                )
        batch = {t.shape[0] for t in inputs}
        if len(batch) != 1:
            raise InvalidInput(ErrorCode.INVALID_INPUTS, "all inputs need the same number of rows")
        count = self.rows(batch.pop())
        self.check_tensors(given)
        return [{name: t.array[i] for name, t in given.items()} for i in range(count)]

    async def run(
        self, inputs: list[Tensor], outputs: list[str], parameters: dict[str, Any], deadline: Deadline
    ) -> Timed[dict[str, Tensor]]:
        """A request of either form, told apart by its input names: its outputs by name."""
        names = sorted(t.name for t in inputs)
        graph_inputs = sorted(self.served.runtime.input_names)
        if len(set(names)) != len(names):
            raise InvalidInput(ErrorCode.INVALID_INPUTS, f"an input is given twice: {names}")
        if names not in (graph_inputs, [self.encoded_input]):
            raise InvalidInput(
                ErrorCode.INVALID_INPUTS,
                f"model {self.served.name} takes the inputs {graph_inputs} or {[self.encoded_input]}, "
                f"got {names}",
            )
        missing = [n for n in outputs if n not in self.output_names()]
        if missing:  # refused before anything is queued
            raise InvalidInput(
                ErrorCode.INVALID_OUTPUTS,
                f"outputs {missing} are not produced for these inputs; available: {self.output_names()}",
            )
        if names == graph_inputs:
            return await self.run_tensors(inputs, outputs, parameters, deadline)
        return await self.run_encoded(inputs[0], outputs, parameters, deadline)

    async def run_tensors(
        self, inputs: list[Tensor], outputs: list[str], parameters: dict[str, Any], deadline: Deadline
    ) -> Timed[dict[str, Tensor]]:
        """The graph's tensors in, the graph outputs asked for (default: all) out."""
        rows = self.tensor_rows(inputs)
        graph = self.graph_outputs(outputs, self.served.runtime.output_names)
        reads = frozenset(graph)
        done = await gather_or_cancel([self.served.queued(Job(row, reads=reads), deadline) for row in rows])
        return timed({name: stacked(name, [d.outputs[name] for d in done]) for name in graph}, done)

    async def run_encoded(
        self, tensor: Tensor, outputs: list[str], parameters: dict[str, Any], deadline: Deadline
    ) -> Timed[dict[str, Tensor]]:
        raise NotImplementedError


def timed(value: T, done: Sequence[Done]) -> Timed[T]:
    """`value`, made of the rows `done`, with the longest queue wait and batch run among them."""
    return Timed(value, Timings.longest(d.timings for d in done))
