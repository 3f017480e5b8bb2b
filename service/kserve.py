"""KServe / Open Inference Protocol v2 routes over the same models and batchers.

Raw tensors in, raw tensors out: for clients that preprocess themselves (or other serving stacks
speaking v2). Health follows the protocol: 200 means true, 400 means false. Each row of a v2 request
is queued separately, so v2 traffic is batched together with /classify and /fill-mask traffic.
Errors take the protocol's shape, `{"error": "<message>"}`, with the status codes of `V2_ERRORS`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from contract.errors import InvalidInput, RequestError
from service.deadline import Deadline, before
from service.errors import REST_ERRORS, ErrorTable
from service.http_io import get_state, read_json, unless_disconnected
from service.pipelines import FillMaskPipeline, Pipeline
from service.schemas import V2_ERROR_RESPONSES, V2InferRequest, V2InferResponse, V2ModelMetadata, V2Tensor
from service.state import FAILED

PREFIX = "/v2"


def v2_body(error: RequestError) -> dict[str, Any]:
    return {"error": error.message}


# The REST task routes' statuses, except that the protocol (like Triton) answers a malformed or
# unfitting request with 400.
V2_ERRORS = ErrorTable(statuses={**REST_ERRORS.statuses, InvalidInput: 400}, body=v2_body)

router = APIRouter(prefix=PREFIX, tags=["kserve-v2"])

_DATATYPES = {"float32": "FP32", "float16": "FP16", "int64": "INT64", "int32": "INT32"}
_NUMPY = {v: np.dtype(k) for k, v in _DATATYPES.items()}


def _bool(ok: bool, key: str, **extra: Any) -> JSONResponse:
    return JSONResponse({key: ok, **extra}, status_code=200 if ok else 400)


def _tensor_meta(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "name": e["name"],
            "datatype": _DATATYPES.get(str(e.get("dtype")), str(e.get("dtype")).upper()),
            "shape": [d if isinstance(d, int) else -1 for d in e.get("shape", [])],
        }
        for e in entries
    ]


@router.get("/health/live", summary="v2 liveness")
async def v2_live(request: Request) -> JSONResponse:
    return _bool(get_state(request).phase != FAILED, "live")


@router.get("/health/ready", summary="v2 readiness")
async def v2_ready(request: Request) -> JSONResponse:
    return _bool(get_state(request).ready, "ready")


@router.get(
    "/models/{name}",
    response_model=V2ModelMetadata,
    responses=V2_ERROR_RESPONSES,
    summary="v2 model metadata",
)
async def v2_model_metadata(request: Request, name: str) -> V2ModelMetadata:
    model = get_state(request).model(name, loaded_only=True)
    return V2ModelMetadata(
        name=model.name,
        versions=["1"],
        platform="onnxruntime_onnx",
        inputs=_tensor_meta(model.spec.inputs),  # type: ignore[arg-type]
        outputs=_tensor_meta(model.spec.outputs),  # type: ignore[arg-type]
    )


@router.get("/models/{name}/ready", summary="v2 model readiness")
async def v2_model_ready(request: Request, name: str) -> JSONResponse:
    state = get_state(request)
    model = state.model(name, loaded_only=True)
    return _bool(model.ready and state.ready, "ready", name=name)


def _rows(model: Pipeline, body: V2InferRequest) -> list[dict[str, np.ndarray]]:
    """Validate the v2 tensors against the model's inputs and split them into per-request rows."""
    expected = {e["name"]: e for e in _tensor_meta(model.spec.inputs)}
    given = {t.name: t for t in body.inputs}
    if set(given) != set(expected) or len(given) != len(body.inputs):
        raise InvalidInput(
            "invalid_inputs",
            f"expected exactly the inputs {sorted(expected)}, got {[t.name for t in body.inputs]}",
        )
    arrays: dict[str, np.ndarray] = {}
    for name, tensor in given.items():
        meta = expected[name]
        if tensor.datatype != meta["datatype"]:
            raise InvalidInput(
                "invalid_inputs", f"input {name} must have datatype {meta['datatype']}, got {tensor.datatype}"
            )
        same_rank = len(tensor.shape) == len(meta["shape"])
        dims = zip(meta["shape"][1:], tensor.shape[1:], strict=False)
        if not same_rank or not all(want in (-1, got) and got >= 1 for want, got in dims):
            raise InvalidInput(
                "invalid_inputs",
                f"input {name} must have shape {meta['shape']} (-1: any size), got {tensor.shape}",
            )
        try:
            arrays[name] = np.asarray(tensor.data, dtype=_NUMPY[tensor.datatype]).reshape(tensor.shape)
        except (ValueError, TypeError) as exc:
            raise InvalidInput(
                "invalid_inputs", f"input {name}: data does not match shape {tensor.shape} ({exc})"
            ) from None
    batch = {a.shape[0] for a in arrays.values()}
    max_rows = model.batcher.max_batch_size
    if len(batch) != 1 or not 1 <= (rows := batch.pop()) <= max_rows:
        raise InvalidInput("invalid_inputs", f"all inputs need the same batch size, between 1 and {max_rows}")
    if isinstance(model, FillMaskPipeline):
        _check_text_tensors(model, arrays["input_ids"], arrays["mask_positions"])
    return [{name: a[i] for name, a in arrays.items()} for i in range(rows)]


def _check_text_tensors(model: FillMaskPipeline, ids: np.ndarray, positions: np.ndarray) -> None:
    """Lengths within the model's limits, ids in the vocabulary, positions inside the text: an
    out-of-range index would make the graph's Gather fail (or read garbage), so refuse it here."""
    codec = model.codec
    length, slots = ids.shape[1], positions.shape[1]
    if length > codec.n or slots > codec.max_predictions:
        raise InvalidInput(
            "invalid_inputs",
            f"input_ids may have at most {codec.n} tokens and mask_positions at most "
            f"{codec.max_predictions} entries, got {length} and {slots}",
        )
    for name, values, upper in (("input_ids", ids, codec.vocab_size), ("mask_positions", positions, length)):
        if values.min() < 0 or values.max() >= upper:
            raise InvalidInput("invalid_inputs", f"values of {name} must be in [0, {upper})")


async def _infer_rows(
    model: Pipeline, rows: list[dict[str, np.ndarray]], deadline: Deadline
) -> list[dict[str, np.ndarray]]:
    """Queue every row; if one is refused, the others are withdrawn (cancelled) at once."""
    tasks = [asyncio.ensure_future(model.infer(row, deadline)) for row in rows]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


@router.post(
    "/models/{name}/infer",
    response_model=V2InferResponse,
    responses=V2_ERROR_RESPONSES,
    summary="v2 inference on raw tensors",
)
async def v2_infer(request: Request, name: str) -> V2InferResponse:
    state = get_state(request)
    deadline = Deadline.after(state.settings.request_timeout_s)
    model = state.model(name)
    body = await before(read_json(request, V2InferRequest), deadline)
    rows = _rows(model, body)
    results = await unless_disconnected(request, _infer_rows(model, rows, deadline))
    outputs = []
    for out_name in model.runtime.output_names:
        stacked = np.stack([r[out_name] for r in results])
        datatype = _DATATYPES.get(stacked.dtype.name, stacked.dtype.name.upper())
        outputs.append(
            V2Tensor(
                name=out_name, datatype=datatype, shape=list(stacked.shape), data=stacked.ravel().tolist()
            )
        )
    return V2InferResponse(model_name=model.name, model_version="1", id=body.id, outputs=outputs)
