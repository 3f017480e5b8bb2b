"""Request and response bodies (pydantic), with the examples shown in the OpenAPI docs."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from contract.formats import MAX_FILL_MASK_TOP_K


class LabelScore(BaseModel):
    label: str
    score: float = Field(description="softmax probability")


class ClassifyResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "cifar10-gmlp",
                    "predictions": [{"label": "cat", "score": 0.91}, {"label": "dog", "score": 0.05}],
                }
            ]
        }
    )
    model: str = Field(description="the served model that answered")
    predictions: list[LabelScore] = Field(description="top_k labels, highest score first")


class ClassifyJSONRequest(BaseModel):
    """/classify with a JSON body: the image base64-encoded (plain or as a `data:` URL)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"image": "/9j/4AAQSkZJRgABAQAAAQABAAD..."}]}
    )
    image: str = Field(min_length=1, description="the image file, base64-encoded; a data: URL is accepted")


class FillMaskRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"text": "paris is the [MASK] of france.", "top_k": 5}]},
    )
    text: str = Field(min_length=1, max_length=100_000, description="text with one or more [MASK] tokens")
    top_k: int = Field(5, ge=1, le=MAX_FILL_MASK_TOP_K, description="predictions per [MASK]")
    targets: list[str] | None = Field(
        None,
        min_length=1,
        max_length=1000,
        description="restrict the candidates to these words; a word that is not one vocabulary token is "
        "replaced by its first wordpiece (as Hugging Face's fill-mask pipeline does)",
    )
    model: str | None = Field(None, description="served model name; default: the service's fill-mask model")


class MaskPrediction(BaseModel):
    score: float = Field(description="softmax probability over the whole vocabulary")
    token: int = Field(description="vocabulary id")
    token_str: str = Field(description="the decoded token")
    sequence: str = Field(description="the text with this [MASK] filled (other [MASK]s left in place)")


class FillMaskResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "gmlp-mlm-small",
                    "predictions": [
                        [
                            {
                                "score": 0.42,
                                "token": 3007,
                                "token_str": "capital",
                                "sequence": "paris is the capital of france.",
                            }
                        ]
                    ],
                }
            ]
        }
    )
    model: str
    predictions: list[list[MaskPrediction]] = Field(description="one ranked list per [MASK], in text order")


class ErrorDetail(BaseModel):
    code: str = Field(description="stable machine-readable error code")
    message: str = Field(description="what was wrong and what is accepted")
    details: list[Any] | None = None


class ErrorResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"error": {"code": "invalid_image", "message": "the data is not a readable image; ..."}}
            ]
        }
    )
    error: ErrorDetail


class BatchingInfo(BaseModel):
    max_batch_size: int
    max_queue_delay_ms: float
    max_queue_size: int
    queue_delay_policy: str = Field(description="arriving or always (setting queue_delay_policy)")


class ModelInfo(BaseModel):
    name: str
    task: str
    n: int | None = Field(description="sequence length (tokens or patches)")
    variant: str
    variants: list[str]
    provider: str = Field(description="ONNX Runtime execution provider running the model")
    intra_op_threads: int
    rows_batched: bool = Field(description="false when the variant runs batch rows one at a time")
    ready: bool
    batching: BatchingInfo
    fixed_length: bool | None = Field(
        None,
        description="masked LMs: true when every batch runs at n tokens with every prediction slot "
        "(setting fixed_length, or a graph with static shapes); false when a batch runs at its longest text",
    )
    length_multiple: int | None = Field(
        None, description="masked LMs: a batch's length is rounded up to a multiple of this (at most n)"
    )


class ModelsResponse(BaseModel):
    models: list[ModelInfo]
    defaults: dict[str, str | None] = Field(description="default model per task")


class HealthResponse(BaseModel):
    status: str
    detail: str | None = None


# -- KServe / Open Inference Protocol v2 -----------------------------------------------------------


class V2Tensor(BaseModel):
    name: str
    shape: list[int]
    datatype: str = Field(description="FP32 or INT64")
    data: list[Any] = Field(description="row-major flat list (nested lists are flattened)")


class V2InferRequest(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "inputs": [
                        {"name": "pixel_values", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [0.0]}
                    ]
                }
            ]
        }
    )
    id: str | None = None
    inputs: list[V2Tensor] = Field(min_length=1)
    parameters: dict[str, Any] | None = None
    outputs: list[dict[str, Any]] | None = None


class V2InferResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    outputs: list[V2Tensor]


class V2TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class V2ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[V2TensorMetadata]
    outputs: list[V2TensorMetadata]


class V2ErrorResponse(BaseModel):
    """The Open Inference Protocol's error shape."""

    error: str = Field(description="what was wrong and what is accepted")


_ERROR_DESCRIPTIONS = {
    404: "unknown model",
    413: "body or image too large",
    415: "wrong content type",
    422: "invalid request (message says what is accepted)",
    503: "overloaded (Retry-After) or not ready",
    504: "deadline exceeded",
}


def _error_responses(body: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": body, "description": text} for code, text in _ERROR_DESCRIPTIONS.items()}


ERROR_RESPONSES = _error_responses(ErrorResponse)
V2_ERROR_RESPONSES = _error_responses(V2ErrorResponse)
