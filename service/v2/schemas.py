"""The Open Inference Protocol's REST bodies (pydantic), with every constraint the server checks
before it looks at a model: datatypes, shapes within their limits, the parameters it reads.
Booleans and integers are strict: JSON true or false, JSON integers, as the schema says (no 0/1,
no "true", no 5.0 or "5")."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool

from contract.tensors import DATATYPES, MAX_DIMS, MAX_ELEMENTS, SHAPE_LIMITS
from service.http.parsing import TopK, json_integer
from service.http.schemas import MessageError, error_responses, examples, inline_schema

Datatype = Literal[DATATYPES]  # type: ignore[valid-type]
Scalar = str | int | float | bool
Dimension = Annotated[int, Field(ge=0, le=MAX_ELEMENTS), BeforeValidator(json_integer)]
ByteCount = Annotated[int, Field(ge=0), BeforeValidator(json_integer)]


class TensorParameters(BaseModel):
    """Tensor parameters; `binary_data_size` says the tensor's data follow the JSON as raw bytes."""

    model_config = ConfigDict(extra="allow")
    binary_data_size: ByteCount | None = Field(None, description="bytes of this tensor after the JSON")


class InputTensor(BaseModel):
    name: str = Field(min_length=1)
    shape: list[Dimension] = Field(max_length=MAX_DIMS, description=f"dimensions: {SHAPE_LIMITS}")
    datatype: Datatype
    parameters: TensorParameters | None = None
    data: list[Any] | None = Field(
        None, description="row-major data, flat or nested (BYTES: strings); absent for binary data"
    )


class OutputParameters(BaseModel):
    model_config = ConfigDict(extra="allow")
    binary_data: StrictBool | None = Field(None, description="return this output as raw bytes after the JSON")


class RequestedOutput(BaseModel):
    name: str = Field(min_length=1)
    parameters: OutputParameters | None = None


class RequestParameters(BaseModel):
    model_config = ConfigDict(extra="allow")
    binary_data_output: StrictBool | None = Field(None, description="default of every output's binary_data")
    top_k: TopK | None = Field(None, description="predictions per [MASK] for a `text` input")


class InferRequestBody(BaseModel):
    model_config = examples(
        {
            "id": "r1",
            "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a [MASK] day"]}],
            "parameters": {"top_k": 3},
        }
    )
    id: str | None = Field(None, description="echoed in the response")
    parameters: RequestParameters | None = None
    inputs: list[InputTensor] = Field(min_length=1)
    outputs: list[RequestedOutput] | None = Field(None, description="outputs to return; default: all")


class OutputTensor(BaseModel):
    name: str
    shape: list[int]
    datatype: Datatype
    parameters: dict[str, Scalar] | None = None
    data: list[Any] | None = None


class InferResponseBody(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Scalar] | None = None
    outputs: list[OutputTensor]


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class TensorMetadata(BaseModel):
    name: str
    datatype: Datatype
    shape: list[int] = Field(description="-1: any size")


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class Live(BaseModel):
    live: bool


class Ready(BaseModel):
    ready: bool


class ModelReadyBody(BaseModel):
    name: str
    ready: bool


class ConfigTensor(BaseModel):
    """An input or output of the model configuration; `dims` without the batch axis."""

    model_config = ConfigDict(extra="allow")
    name: str
    data_type: str = Field(description="TYPE_FP32, TYPE_INT64, TYPE_STRING (BYTES), ...")
    dims: list[int] = Field(description="-1: any size")
    optional: bool | None = Field(None, description="true: an alternative input a request may leave out")


class ModelConfigBody(BaseModel):
    """The model configuration extension's document, in Triton's schema (the fields it sets)."""

    model_config = ConfigDict(extra="allow")
    name: str
    platform: str
    backend: str
    max_batch_size: int
    version_policy: dict[str, Any]
    input: list[ConfigTensor]
    output: list[ConfigTensor]
    dynamic_batching: dict[str, Any]
    instance_group: list[dict[str, Any]]


class StatisticDuration(BaseModel):
    count: int = Field(ge=0)
    ns: int = Field(ge=0, description="cumulative nanoseconds")


class InferStatistics(BaseModel):
    model_config = ConfigDict(extra="allow")
    success: StatisticDuration
    fail: StatisticDuration
    queue: StatisticDuration
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration


class BatchStatistics(BaseModel):
    batch_size: int = Field(ge=1)
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration


class ModelStatisticsEntry(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    version: str
    last_inference: int = Field(ge=0, description="milliseconds since the epoch of the last batch run")
    inference_count: int = Field(ge=0, description="rows run")
    execution_count: int = Field(ge=0, description="batches run")
    inference_stats: InferStatistics
    batch_stats: list[BatchStatistics]


class ModelStatisticsBody(BaseModel):
    """The statistics extension's document, in Triton's schema."""

    model_stats: list[ModelStatisticsEntry]


class IndexRequest(BaseModel):
    ready: StrictBool = Field(False, description="true: only the READY versions")


class ControlRequest(BaseModel):
    parameters: dict[str, Any] = Field(
        default_factory=dict,
        description='load: {"config": "<JSON model configuration>"}; its version_policy picks the versions',
    )


ERROR_RESPONSES = error_responses(MessageError, invalid=400)


def _json_form() -> dict[str, Any]:
    """The request schema of a JSON-only body: every input carries its `data` (a tensor whose
    parameters announce `binary_data_size` needs the binary form, JSON followed by the bytes)."""
    schema = inline_schema(InferRequestBody)
    tensor = schema["properties"]["inputs"]["items"]
    tensor["required"] = [*tensor.get("required", []), "data"]
    tensor["properties"]["data"] = {"type": "array", "description": "row-major data, flat or nested"}
    tensor["properties"]["parameters"] = {
        "anyOf": [{"type": "object", "not": {"required": ["binary_data_size"]}}, {"type": "null"}]
    }
    return schema


INFER_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "JSON (any or no content type); with the Inference-Header-Content-Length header, "
        "that many bytes of JSON followed by the binary tensors",
        "content": {
            "application/json": {"schema": _json_form()},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}
INFER_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "model": InferResponseBody,
        "description": "the outputs; as application/octet-stream when binary outputs follow the JSON "
        "(its length in the Inference-Header-Content-Length header)",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    },
    **ERROR_RESPONSES,
}
