"""Open Inference Protocol v2 semantics, shared by the REST and the gRPC transport.

A transport decodes its envelope into an `InferRequest` of `contract.tensors.Tensor`s, calls
`infer`, and encodes the `Tensor`s it gets back; metadata, readiness, the model configuration and
statistics documents (in Triton's schemas, as JSON-ready dicts that gRPC parses into its messages)
come from here too, so both transports describe and run the models identically. What a request of
a task means is the task's v2 adapter (`Pipeline.v2`).

Every model has two forms of request, told apart by their input names: the graph's own tensors
(`pixel_values`; `input_ids` + `mask_positions`) and the encoded input (`image` or `text`). So that
a tool which fills every input the metadata lists (Triton's perf_analyzer) sends one form, `NAME`
lists the graph's tensors and `NAME-ensemble` the encoded input, as a Triton ensemble would; both
names answer everything alike, and either takes either form.

The answer's size is bounded from its outputs' element counts before it is built (`check_answer`):
a few bytes of request can ask for a great deal (sixteen texts of twenty [MASK]s with `outputs:
[logits]` make 320 rows of a whole vocabulary's scores, about 20 bytes per number as JSON).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contract.errors import ErrorCode, InputTooLarge, InvalidInput, ModelNotFound
from contract.formats import package_version
from contract.messages import echo
from contract.repository import VersionError, parse_version
from contract.tensors import BYTES, NUMPY_TYPES, Tensor
from service.engine import request_context
from service.engine.request_context import Deadline, Timings
from service.lifecycle.state import Phase, ServiceState
from service.tasks.pipeline import Pipeline
from service.telemetry.statistics import Duration, ModelCounters

SERVER_NAME = "gmlp-serve"
# Extensions of the protocol this server implements (REST; gRPC has raw contents natively).
EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics", "model_repository"]
PLATFORM = "onnxruntime_onnx"
# A model's encoded form is listed under its name with this suffix (a Triton ensemble's role).
ENSEMBLE_SUFFIX = "-ensemble"


# The widest JSON text of one element, with its separating comma, as `Tensor.json_data` and
# `json.dumps` write it: "false," for a boolean; a float (FP16/32/64 all become doubles) at most 24
# characters of repr ("-2.2250738585072014e-308"); an integer its type's longest decimal, sign included.
def _widest_json(dtype: np.dtype) -> int:
    if dtype.kind in "bf":
        return 6 if dtype.kind == "b" else 25
    info = np.iinfo(dtype)
    return max(len(str(info.min)), len(str(info.max))) + 1


JSON_ELEMENT_BYTES = {name: _widest_json(dtype) for name, dtype in NUMPY_TYPES.items()}
# A BYTES element in JSON: each byte at most six characters (an escape), plus quotes and comma.
_JSON_BYTES_PER_BYTE, _JSON_STRING_OVERHEAD = 6, 3
# The envelope of one output (name, datatype, shape, keys) and of the answer, generously.
_OUTPUT_ENVELOPE, _ANSWER_ENVELOPE = 128, 256

BINARY_HINT = (
    "ask for big tensors as binary data: the binary tensor data extension (output parameter "
    '"binary_data": true, or request parameter "binary_data_output": true) carries 4 bytes per FP32 value'
)


@dataclass(frozen=True)
class AnswerSize:
    """Upper bounds of an answer's two parts, in bytes."""

    json: int  # the JSON document (every output not sent raw, and the envelope)
    raw: int  # the raw tensor bytes that follow it (or make up a gRPC answer)

    @property
    def total(self) -> int:
        return self.json + self.raw


def all_raw(name: str) -> bool:
    """Every output as raw bytes (gRPC's raw contents)."""
    return True


def raw_bytes(tensor: Tensor) -> int:
    """The exact size of `Tensor.raw()`: elements x item size; a BYTES element 4 + its length."""
    if tensor.datatype == BYTES:
        return sum(4 + len(item) for item in tensor.array.ravel())
    return int(tensor.array.size) * NUMPY_TYPES[tensor.datatype].itemsize


def json_bytes(tensor: Tensor) -> int:
    """An upper bound of the size of `Tensor.json_data()` once encoded (the list's brackets too)."""
    if tensor.datatype == BYTES:
        items = tensor.array.ravel()
        strings = sum(_JSON_BYTES_PER_BYTE * len(item) for item in items) + _JSON_STRING_OVERHEAD * len(items)
        return 2 + strings
    return 2 + int(tensor.array.size) * JSON_ELEMENT_BYTES[tensor.datatype]


def answer_size(outputs: Sequence[Tensor], is_raw: Callable[[str], bool], envelope: int = 0) -> AnswerSize:
    """Bounds of an answer whose outputs named by `is_raw` go as raw bytes, the others as JSON;
    `envelope`: the length of the answer's own strings (model name, id), escapes included."""
    json_size, raw_size = _ANSWER_ENVELOPE + 6 * envelope, 0
    for tensor in outputs:
        json_size += _OUTPUT_ENVELOPE + 6 * len(tensor.name) + 21 * len(tensor.shape)
        if is_raw(tensor.name):
            raw_size += raw_bytes(tensor)
        else:
            json_size += json_bytes(tensor)
    return AnswerSize(json_size, raw_size)


def check_answer(size: AnswerSize, max_json: int, max_raw: int) -> None:
    """Refuse an answer over either limit, saying which, by how much, and what to do instead."""
    if size.json > max_json:
        raise InputTooLarge(
            ErrorCode.RESPONSE_TOO_LARGE,
            f"the outputs asked for would make a JSON answer of up to {size.json} bytes; at most {max_json} "
            f"are sent as JSON (max_response_bytes): {BINARY_HINT}, or ask for fewer outputs or rows",
        )
    if size.raw > max_raw:
        raise InputTooLarge(
            ErrorCode.RESPONSE_TOO_LARGE,
            f"the outputs asked for are {size.raw} bytes of tensor data; at most {max_raw} are sent in one "
            "answer (max_binary_response_bytes): ask for fewer outputs or rows per request",
        )


@dataclass(frozen=True)
class InferRequest:
    """One v2 inference request, whichever transport it came by."""

    inputs: list[Tensor]
    outputs: list[str] = field(default_factory=list)  # requested output names; empty: all
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """An output named twice is refused before anything runs, as Triton refuses it: the answer
        would repeat it, and a few bytes of request per name could ask for one output 100,000
        times (its refusal would then come only after the model ran, from the answer's size)."""
        seen: set[str] = set()
        for name in self.outputs:
            if name in seen:
                raise InvalidInput(
                    ErrorCode.INVALID_OUTPUTS,
                    f"output {echo(name)} is requested twice; name each output once",
                )
            seen.add(name)


@dataclass(frozen=True)
class ModelRef:
    """A request's model name and version, resolved once at the transport's edge: the name as the
    client wrote it (`shown`, which answers carry), the model it means, the version as a number
    (None: the newest READY one), and whether the name lists the encoded form."""

    shown: str
    name: str
    version: int | None
    encoded: bool


@dataclass(frozen=True)
class InferResult:
    model_name: str
    outputs: list[Tensor]
    model_version: str  # the version that answered
    id: str = ""
    size: AnswerSize = AnswerSize(0, 0)  # bounds of the encoded answer (`answer_size`), checked
    timings: Timings = Timings()  # where its rows' time went in the batcher (REST's Server-Timing)


def server_metadata() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": package_version(), "extensions": list(EXTENSIONS)}


def server_live(state: ServiceState) -> bool:
    return state.phase is not Phase.FAILED


def resolve(state: ServiceState, name: str, version: str = "") -> ModelRef:
    """The model a v2 name means at `version` (empty: the newest READY one; not a number: a version
    no model has): `NAME` lists the graph's tensors, `NAME-ensemble` the encoded input (a model the
    repository holds under that very name is that model)."""
    base = name.removesuffix(ENSEMBLE_SUFFIX)
    encoded = base != name and state.known_versions(name) is None and state.known_versions(base) is not None
    model_name = base if encoded else name
    try:
        return ModelRef(name, model_name, parse_version(version) if version else None, encoded)
    except VersionError as exc:
        known = state.known_versions(model_name) or []
        raise ModelNotFound(
            ErrorCode.VERSION_NOT_FOUND,
            f"model {echo(model_name)} has no version {echo(version)} ({exc}); versions: "
            f"{[str(v) for v in known]}",
        ) from None


def model_metadata(state: ServiceState, model: ModelRef) -> dict[str, Any]:
    """Name, versions, platform, inputs (the form the name lists) and outputs (all of them)."""
    served = state.loaded(model.name, model.version)
    return {
        "name": model.shown,
        "versions": [str(v) for v in state.ready_versions(model.name)],
        "platform": PLATFORM,
        "inputs": served.v2.inputs(model.encoded),
        "outputs": served.v2.outputs(),
    }


async def load_model(state: ServiceState, name: str, parameters: Mapping[str, Any]) -> None:
    """The model-repository extension's load (beside what serves `name` now; switched to only once
    warmed up and checked). Its `config` parameter is a JSON model configuration whose
    `version_policy` (Triton's form, or `latest:N`, `all`, `specific:V,...`) chooses the versions;
    other parameters (Triton's `file:` overrides) are accepted and ignored: models load from the
    repository only."""
    config = parameters.get("config")
    if isinstance(config, bytes):
        config = config.decode("utf-8", "replace")
    if config is not None and not isinstance(config, str):
        raise InvalidInput(
            ErrorCode.INVALID_VERSION_POLICY, "the config parameter must be a string holding a JSON object"
        )
    await state.load_model(name, config)


async def infer(
    state: ServiceState,
    model: ModelRef,
    served: Pipeline,
    request: InferRequest,
    deadline: Deadline,
    is_raw: Callable[[str], bool] = all_raw,
) -> InferResult:
    """Run one v2 request on `served`, the version of `model` the transport leased for it (held
    until the answer is back); outputs in the order requested (default: the form's own outputs).

    The request counts in that version's statistics as a success or, refused or abandoned, as a
    failure (an unknown model counts nowhere: its name is the client's, and no lease was given).
    The answer's size, with the outputs `is_raw` names as raw bytes, is checked against the limits
    before any transport builds it (`check_answer`): `AnswerSize` rides on the result for the
    transport's encoding."""
    # The protocol's id: the client's, else the request id (X-Request-ID / x-request-id metadata).
    context = request_context.current()
    id_ = request.id or (context.request_id if context is not None else "")
    start, ok = time.perf_counter(), False
    try:
        produced = await served.v2.run(request.inputs, request.outputs, request.parameters, deadline)
        names = request.outputs or list(produced.value)
        outputs = [produced.value[n] for n in names]
        size = answer_size(outputs, is_raw, len(model.shown) + len(id_) + len(served.version))
        settings = state.settings
        check_answer(size, settings.max_response_bytes, settings.max_binary_response_bytes)
        result = InferResult(model.shown, outputs, served.version, id_, size, produced.timings)
        ok = True
        return result
    finally:
        labels = (served.name, served.version, "success" if ok else "fail")
        state.metrics.statistics.requests.labels(*labels).inc()
        state.metrics.statistics.request_seconds.labels(*labels).inc(time.perf_counter() - start)


BACKEND = "onnxruntime"
NS = 1_000_000_000


def _data_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == BYTES else f"TYPE_{datatype}"


def model_config(state: ServiceState, model: ModelRef) -> dict[str, Any]:
    """The served model's configuration in Triton's schema."""
    served = state.loaded(model.name, model.version)
    batcher, settings = served.batcher, served.settings
    kind = "KIND_CPU" if served.runtime.options.device == "cpu" else "KIND_GPU"
    return {
        "name": model.shown,
        "platform": PLATFORM,
        "backend": BACKEND,
        # The model's own policy (its policy.json, a load call's config, or GMLP_VERSION_POLICY).
        "version_policy": state.policy_of(served.name).triton(),
        "max_batch_size": batcher.max_batch_size,
        "input": [
            {
                "name": t["name"],
                "data_type": _data_type(t["datatype"]),
                "format": "FORMAT_NONE",
                "dims": t["shape"][1:],  # Triton's dims: without the batch axis
                "optional": False,
            }
            for t in served.v2.inputs(model.encoded)
        ],
        "output": [
            {"name": t["name"], "data_type": _data_type(t["datatype"]), "dims": t["shape"][1:]}
            for t in served.v2.outputs()
        ],
        "dynamic_batching": {
            "max_queue_delay_microseconds": round(batcher.max_queue_delay_s * 1_000_000),
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": round(settings.request_timeout_s * 1_000_000),
                "allow_timeout_override": True,  # a gRPC deadline shorter than the timeout wins
                "max_queue_size": batcher.max_queue_size,
            },
        },
        "instance_group": [{"name": f"{model.shown}_0", "kind": kind, "count": batcher.instances}],
        "default_model_filename": served.runtime.path.name,
        "parameters": {
            key: {"string_value": str(value)}
            for key, value in (
                ("variant", served.variant),
                ("execution_provider", served.runtime.provider),
                ("precision", served.precision),
                ("intra_op_threads", served.runtime.options.intra_op_threads),
                ("lone_threads", served.runtime.lone_threads),
                ("queue_delay_policy", "always" if batcher.always_wait else "arriving"),
            )
        },
    }


def _duration(duration: Duration) -> dict[str, int]:
    return {"count": duration.count, "ns": round(duration.seconds * NS)}


_NONE = Duration()


def _model_statistics(counters: ModelCounters, name: str) -> dict[str, Any]:
    per_row = Duration(counters.inferences, 0.0)  # input and output copies are part of the run
    return {
        "name": name,
        "version": counters.version,
        "last_inference": round(counters.last_inference_s * 1000),
        "inference_count": counters.inferences,
        "execution_count": counters.executions,
        "inference_stats": {
            "success": _duration(counters.success),
            "fail": _duration(counters.fail),
            "queue": _duration(counters.queue),
            "compute_input": _duration(per_row),
            "compute_infer": _duration(counters.compute),
            "compute_output": _duration(per_row),
            "cache_hit": _duration(_NONE),
            "cache_miss": _duration(_NONE),
        },
        "batch_stats": [
            {
                "batch_size": size,
                "compute_input": _duration(Duration(run.count, 0.0)),
                "compute_infer": _duration(run),
                "compute_output": _duration(Duration(run.count, 0.0)),
            }
            for size, run in counters.by_batch_size.items()
        ],
    }


def model_statistics(state: ServiceState, name: str = "", version: str = "") -> dict[str, Any]:
    """`{"model_stats": [...]}`: every served model (no name), or one model (and version). The
    version is parsed here, where a request may name one without a model."""
    if not name:
        if version:
            raise ModelNotFound(ErrorCode.MODEL_NOT_FOUND, "a version needs a model name")
        newest = state.newest_ready()
        names = [(n, n, str(newest[n].version)) for n in sorted(newest)]
    else:
        model = resolve(state, name, version)
        # A model or version not served: ModelNotFound; no version named: the newest READY one's.
        served = state.loaded(model.name, model.version)
        names = [(model.name, model.shown, str(served.version))]  # a model's two names share its counters
    counted = state.metrics.statistics.counters([(model, v) for model, _, v in names])
    return {"model_stats": [_model_statistics(c, s) for c, (_, s, _) in zip(counted, names, strict=True)]}
