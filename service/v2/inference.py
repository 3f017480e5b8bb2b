"""Open Inference Protocol v2 semantics, shared by the REST and the gRPC transport.

A transport decodes its envelope into an `InferRequest` of `service.v2.tensors.Tensor`s, calls
`infer`, and encodes the `Tensor`s it gets back; metadata and readiness come from here too, so both
transports describe and run the models identically. Three kinds of request, chosen by the input
names:

- the graph's own tensors (`pixel_values`; `input_ids` + `mask_positions`): raw tensors in, the
  graph's outputs out, for clients that preprocess themselves;
- `image` (BYTES, one encoded image per row) for classifiers: the service's own decoding and
  transform, output `logits`, so a v2 client gets the same answer as `/classify`;
- `text` (BYTES, one text per row) for masked LMs: output `predictions` (BYTES), each element the
  JSON list `/fill-mask` returns (one ranked list per [MASK]); request parameter `top_k`.

So that a tool which fills every input the model configuration requires and asks for every listed
output gets an answer, the graph's tensors are the required inputs and the encoded input the
optional alternative (a request has one form or the other, never both: 400); BYTES tensors have a
per-row dimension (`[-1, 1]`, `[-1]` is accepted too); and each form produces every output of the
model: a masked LM's raw token ids can ask for `predictions` (decoded from the logits) and its
texts and images for the graph's outputs (`logits`, and `topk_ids` / `topk_scores` where the graph
has them; a text's rows are its [MASK]s). Without a list of outputs, a request gets its form's own
(every graph output for the graph's tensors, `logits` for images, `predictions` for texts). A row
runs the session for the outputs asked for only, so a request for the top-k pair copies no logits.

Every row is queued on its own in the model's dynamic batcher, so v2 rows share batches with the
task routes' requests.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from contract.errors import ErrorCode, InvalidInput, ModelNotFound
from contract.formats import MAX_FILL_MASK_TOP_K, package_version
from contract.messages import echo
from contract.repository import VersionError, parse_version
from service.engine import request_context
from service.engine.deadline import Deadline
from service.lifecycle.state import Phase, ServiceState
from service.tasks.pipeline import FillMaskPipeline, Pipeline, VisionPipeline
from service.telemetry.statistics import DEFAULT_VERSION
from service.v2.answer_budget import AnswerSize, all_raw, answer_size, check_answer
from service.v2.tensors import BYTES, Tensor, bytes_tensor, datatype_of

T = TypeVar("T")

SERVER_NAME = "gmlp-serve"
# Extensions of the protocol this server implements (REST; gRPC has raw contents natively).
EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics", "model_repository"]
VERSION = DEFAULT_VERSION  # what a response names when it has no model version
PLATFORM = "onnxruntime_onnx"
IMAGE_INPUT, TEXT_INPUT, PREDICTIONS_OUTPUT = "image", "text", "predictions"


@dataclass(frozen=True)
class InferRequest:
    """One v2 inference request, whichever transport it came by (its model and version are
    resolved where it arrived: `infer` gets the leased pipeline)."""

    inputs: list[Tensor]
    outputs: list[str] = field(default_factory=list)  # requested output names; empty: all
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InferResult:
    model_name: str
    outputs: list[Tensor]
    id: str = ""
    model_version: str = VERSION
    size: AnswerSize = AnswerSize(0, 0)  # bounds of the encoded answer (`answer_budget`), checked


def server_metadata() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": package_version(), "extensions": list(EXTENSIONS)}


def server_live(state: ServiceState) -> bool:
    return state.phase is not Phase.FAILED


def version_number(state: ServiceState, name: str, version: str) -> int | None:
    """A request's version, parsed once where the request arrives: None (empty: `newest_ready`) or
    a number; anything else is a version no model has."""
    if version == "":
        return None
    try:
        return parse_version(version)
    except VersionError as exc:
        known = state.table.models.get(name)
        raise ModelNotFound(
            ErrorCode.VERSION_NOT_FOUND,
            f"model {echo(name)} has no version {echo(version)} ({exc}); versions: "
            f"{[str(v) for v in sorted(known.versions)] if known else []}",
        ) from None


def _meta(
    name: str, datatype: str, shape: Sequence[Any], dims: dict[str, int] | None = None
) -> dict[str, Any]:
    """Tensor metadata; named dimensions the model fixes (`dims`) are given as numbers, others -1."""
    sizes = [d if isinstance(d, int) else (dims or {}).get(str(d), -1) for d in shape]
    return {"name": name, "datatype": datatype, "shape": sizes}


def _graph_tensors(served: Pipeline, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The graph's tensors as the served config declares them: a named (dynamic) axis is -1, so a
    masked LM takes any length up to n and any number of positions up to max_predictions."""
    return [
        _meta(e["name"], datatype_of(np.dtype(str(e.get("dtype", "float32")))), e["shape"]) for e in entries
    ]


def model_tensors(served: Pipeline) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The inputs (each with `optional`: the encoded form is the graph tensors' alternative) and the
    outputs, shapes with the batch axis first."""
    inputs = [{**t, "optional": False} for t in _graph_tensors(served, served.spec.inputs)]
    outputs = _graph_tensors(served, served.spec.outputs)
    if isinstance(served, VisionPipeline):
        inputs.append({**_meta(IMAGE_INPUT, BYTES, [-1, 1]), "optional": True})
    elif isinstance(served, FillMaskPipeline):
        inputs.append({**_meta(TEXT_INPUT, BYTES, [-1, 1]), "optional": True})
        outputs.append(_meta(PREDICTIONS_OUTPUT, BYTES, [-1, 1]))
    return inputs, outputs


def model_metadata(state: ServiceState, name: str, version: int | None = None) -> dict[str, Any]:
    """Name, versions, platform, inputs and outputs: the graph's tensors and the encoded forms."""
    served = state.loaded(name, version)
    inputs, outputs = model_tensors(served)
    inputs = [{k: v for k, v in t.items() if k != "optional"} for t in inputs]
    return {
        "name": served.name,
        "versions": [str(v) for v in state.table.ready_versions(served.name)],
        "platform": PLATFORM,
        "inputs": inputs,
        "outputs": outputs,
    }


async def gather_or_cancel(work: Sequence[Awaitable[T]]) -> list[T]:
    """Await all; if one fails (a row refused, the queue full), the others are withdrawn at once."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


def _rows(served: Pipeline, count: int) -> int:
    if not 1 <= count <= served.batcher.max_batch_size:
        raise InvalidInput(
            ErrorCode.INVALID_BATCH,
            f"a request has between 1 and {served.batcher.max_batch_size} rows, got {count}",
        )
    return count


def _encoded_items(tensor: Tensor, served: Pipeline) -> list[bytes]:
    """The elements of an `image` / `text` input: shape [rows] or [rows, 1], datatype BYTES."""
    if tensor.datatype != BYTES or not (
        len(tensor.shape) == 1 or (len(tensor.shape) == 2 and tensor.shape[1] == 1)
    ):
        raise InvalidInput(
            ErrorCode.INVALID_INPUTS,
            f"input {tensor.name} must be BYTES with shape [rows] or [rows, 1], one element per row; "
            f"got {tensor.datatype} {tensor.shape}",
        )
    _rows(served, tensor.shape[0])
    return list(tensor.array.ravel())


def _top_k(parameters: dict[str, Any]) -> int:
    top_k = parameters.get("top_k", 5)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_FILL_MASK_TOP_K:
        raise InvalidInput(
            ErrorCode.INVALID_TOP_K, f"parameter top_k must be an integer in 1..{MAX_FILL_MASK_TOP_K}"
        )
    return top_k


def _graph_rows(served: Pipeline, inputs: list[Tensor]) -> list[dict[str, np.ndarray]]:
    """Validate raw tensors against the graph's inputs and split them into per-request rows."""
    expected = {e["name"]: e for e in _graph_tensors(served, served.spec.inputs)}
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
    rows = _rows(served, batch.pop())
    if isinstance(served, FillMaskPipeline):
        _check_text_tensors(served, given["input_ids"].array, given["mask_positions"].array)
    return [{name: t.array[i] for name, t in given.items()} for i in range(rows)]


def _check_text_tensors(served: FillMaskPipeline, ids: np.ndarray, positions: np.ndarray) -> None:
    """Lengths within the model's limits, ids in the vocabulary, positions inside the text: an
    out-of-range index would make the graph's Gather fail (or read garbage), so refuse it here."""
    codec = served.codec
    length, slots = ids.shape[1], positions.shape[1]
    if length > codec.n or slots > codec.max_predictions:
        raise InvalidInput(
            ErrorCode.INVALID_INPUTS,
            f"input_ids may have at most {codec.n} tokens and mask_positions at most "
            f"{codec.max_predictions} entries, got {length} and {slots}",
        )
    for name, values, upper in (("input_ids", ids, codec.vocab_size), ("mask_positions", positions, length)):
        if values.min() < 0 or values.max() >= upper:
            raise InvalidInput(ErrorCode.INVALID_INPUTS, f"values of {name} must be in [0, {upper})")


def _check_outputs(requested: list[str], available: list[str]) -> None:
    """Refuse unknown requested outputs before anything is queued."""
    missing = [n for n in requested if n not in available]
    if missing:
        raise InvalidInput(
            ErrorCode.INVALID_OUTPUTS,
            f"outputs {missing} are not produced for these inputs; available: {available}",
        )


def _output_names(served: Pipeline) -> list[str]:
    """Every output the model lists; each input form produces all of them."""
    names = list(served.runtime.output_names)
    return [*names, PREDICTIONS_OUTPUT] if isinstance(served, FillMaskPipeline) else names


def _predictions(answers: Sequence[Any], shape: Sequence[int]) -> Tensor:
    """The JSON of `/fill-mask` for each row (decoded in the batch thread), as a BYTES tensor of
    `shape` (one element per row)."""
    items = [json.dumps(answer, ensure_ascii=False).encode("utf-8") for answer in answers]
    return bytes_tensor(PREDICTIONS_OUTPUT, items, shape)


def _stacked(name: str, rows: Sequence[np.ndarray]) -> Tensor:
    """A graph output of a request's rows (images, or texts with their [MASK] rows), as one tensor."""
    if len({row.shape for row in rows}) != 1:
        raise InvalidInput(
            ErrorCode.INVALID_OUTPUTS,
            f"output {name} needs the same number of [MASK] tokens in every text of a request; "
            "ask for predictions only, or send the texts in separate requests",
        )
    stacked = np.stack(rows)
    return Tensor(name, datatype_of(stacked.dtype), stacked)


def _graph_outputs(served: Pipeline, requested: list[str], default: list[str]) -> list[str]:
    """The graph outputs a request asks for, in the graph's order (`default` when it names none)."""
    names = served.runtime.output_names
    return [n for n in names if n in requested] if requested else [n for n in names if n in default]


async def _run(served: Pipeline, request: InferRequest, deadline: Deadline) -> dict[str, Tensor]:
    names = sorted(t.name for t in request.inputs)
    graph_inputs = sorted(served.runtime.input_names)
    if len(set(names)) != len(names):
        raise InvalidInput(ErrorCode.INVALID_INPUTS, f"an input is given twice: {names}")
    if names == graph_inputs:
        _check_outputs(request.outputs, _output_names(served))
        decode = isinstance(served, FillMaskPipeline) and PREDICTIONS_OUTPUT in request.outputs
        top_k = _top_k(request.parameters) if decode else 0
        rows = _graph_rows(served, request.inputs)
        graph = _graph_outputs(served, request.outputs, served.runtime.output_names)
        reads = frozenset(graph)
        if decode:
            assert isinstance(served, FillMaskPipeline)
            done = await gather_or_cancel([served.infer_decoded(row, top_k, deadline, reads) for row in rows])
            results = [d.outputs for d in done]
        else:
            results = await gather_or_cancel([served.infer(row, deadline, reads) for row in rows])
        stacked = {name: np.stack([r[name] for r in results]) for name in graph}
        produced = {name: Tensor(name, datatype_of(a.dtype), a) for name, a in stacked.items()}
        if decode:
            produced[PREDICTIONS_OUTPUT] = _predictions([d.answer for d in done], [len(rows), 1])
        return produced
    if isinstance(served, VisionPipeline) and names == [IMAGE_INPUT]:
        _check_outputs(request.outputs, served.runtime.output_names)
        images = _encoded_items(request.inputs[0], served)
        graph = _graph_outputs(served, request.outputs, ["logits"])
        reads = frozenset(graph)
        results = await gather_or_cancel([served.image_outputs(image, deadline, reads) for image in images])
        return {name: _stacked(name, [r[name] for r in results]) for name in graph}
    if isinstance(served, FillMaskPipeline) and names == [TEXT_INPUT]:
        _check_outputs(request.outputs, _output_names(served))
        top_k = _top_k(request.parameters)
        texts = [_utf8(item) for item in _encoded_items(request.inputs[0], served)]
        graph = _graph_outputs(served, request.outputs, [])
        reads = frozenset(graph)
        runs = await gather_or_cancel([served.decoded_text(t, top_k, deadline, reads) for t in texts])
        produced = {PREDICTIONS_OUTPUT: _predictions([run.answer for run in runs], request.inputs[0].shape)}
        for name in graph:
            produced[name] = _stacked(name, [run.outputs[name][: len(run.answer)] for run in runs])
        return produced
    accepted = [graph_inputs, [IMAGE_INPUT] if isinstance(served, VisionPipeline) else [TEXT_INPUT]]
    raise InvalidInput(
        ErrorCode.INVALID_INPUTS,
        f"model {served.name} takes the inputs {accepted[0]} or {accepted[1]}, got {names}",
    )


def _utf8(item: bytes) -> str:
    try:
        return item.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(ErrorCode.INVALID_TEXT, "input text must be UTF-8 encoded") from None


async def infer(
    state: ServiceState,
    served: Pipeline,
    request: InferRequest,
    deadline: Deadline,
    is_raw: Callable[[str], bool] = all_raw,
) -> InferResult:
    """Run one v2 request on `served`, the model version the transport leased for it (held until
    the answer is back); outputs in the order requested (default: the form's own outputs).

    The request counts in that version's statistics as a success or, refused or abandoned, as a
    failure (an unknown model counts nowhere: its name is the client's, and no lease was given).
    The answer's size, with the outputs `is_raw` names as raw bytes, is checked against the limits
    before any transport builds it (`answer_budget`): `AnswerSize` rides on the result for the
    transport's encoding."""
    # The protocol's id: the client's, else the request id (X-Request-ID / x-request-id metadata).
    context = request_context.current()
    id_ = request.id or (context.request_id if context is not None else "")
    start, ok = time.perf_counter(), False
    try:
        produced = await _run(served, request, deadline)
        names = request.outputs or list(produced)
        outputs = [produced[n] for n in names]
        size = answer_size(outputs, is_raw, len(served.name) + len(id_) + len(served.version))
        settings = state.settings
        check_answer(size, settings.max_response_bytes, settings.max_binary_response_bytes)
        result = InferResult(served.name, outputs, id=id_, model_version=served.version, size=size)
        ok = True
        return result
    finally:
        state.metrics.model_request(served.name, served.version, ok, time.perf_counter() - start)


__all__ = [
    "InferRequest",
    "InferResult",
    "infer",
    "version_number",
    "model_metadata",
    "model_tensors",
    "server_metadata",
    "server_live",
    "gather_or_cancel",
    "EXTENSIONS",
]
