"""The REST response bodies and error documents (pydantic), with the examples shown in the OpenAPI
docs; the requests' schemas are read where requests are read (`service.http.parsing`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from contract.errors import ErrorCode


def examples(*documents: Any, **config: Any) -> ConfigDict:
    """A model's configuration with the examples the OpenAPI docs show."""
    return ConfigDict(json_schema_extra={"examples": list(documents)}, **config)  # type: ignore[typeddict-item]


class LabelScore(BaseModel):
    label: str
    score: float | None = Field(
        description="softmax probability; null where the model's output makes it NaN or infinite "
        "(JSON has neither)"
    )


class ClassifyResponse(BaseModel):
    model_config = examples(
        {
            "model": "cifar10-gmlp",
            "predictions": [{"label": "cat", "score": 0.91}, {"label": "dog", "score": 0.05}],
        }
    )
    model: str = Field(description="the served model that answered")
    predictions: list[LabelScore] = Field(description="top_k labels, highest score first")


class MaskPrediction(BaseModel):
    score: float | None = Field(
        description="softmax probability over the whole vocabulary; null where the model's output "
        "makes it NaN or infinite (JSON has neither)"
    )
    token: int = Field(description="vocabulary id")
    token_str: str = Field(description="the decoded token")
    sequence: str = Field(description="the text with this [MASK] filled (other [MASK]s left in place)")


_CAPITAL = {
    "score": 0.42,
    "token": 3007,
    "token_str": "capital",
    "sequence": "paris is the capital of france.",
}


class FillMaskResponse(BaseModel):
    model_config = examples({"model": "gmlp-mlm-small", "predictions": [[_CAPITAL]]})
    model: str
    predictions: list[list[MaskPrediction]] = Field(description="one ranked list per [MASK], in text order")


class ErrorDetail(BaseModel):
    code: str = Field(description="stable machine-readable error code")
    message: str = Field(description="what was wrong and what is accepted")
    details: list[Any] | None = None


class ErrorResponse(BaseModel):
    model_config = examples(
        {"error": {"code": ErrorCode.INVALID_IMAGE.value, "message": "the data is not a readable image; ..."}}
    )
    error: ErrorDetail


class MessageError(BaseModel):
    """`{"error": "<message>"}`: the error shape of the Open Inference Protocol and of Hugging Face's
    inference API (their clients print that string)."""

    error: str = Field(description="what was wrong and what is accepted")


class BatchingInfo(BaseModel):
    max_batch_size: int
    max_queue_delay_ms: float
    max_queue_size: int
    queue_delay_policy: str = Field(description="arriving or always (setting queue_delay_policy)")


class CardSummary(BaseModel):
    """What the model card (the served directory's README.md) says, in short."""

    title: str | None
    description: str | None = Field(description="the card's first paragraph")
    accuracy: dict[str, float] = Field(
        description="accuracy figures by what they measure (e.g. `cifar10_test top1`), as fractions"
    )
    measured: str | None = Field(
        description="whose figures: the served variant's (its name) or the training run's (`training`)"
    )


class ModelInfo(BaseModel):
    name: str
    version: str = Field("1", description="the repository version answering requests that name none")
    task: str
    n: int | None = Field(description="sequence length (tokens or patches)")
    variant: str
    variants: list[str]
    provider: str = Field(
        description="what runs the model: ONNX Runtime's execution provider, or `OpenVINO CPU` (setting "
        "backend)"
    )
    precision: str = Field(
        description="what the model's arithmetic is done in: the variant's own (fp32, int8, fp16), or the "
        "precision OpenVINO chose for the CPU (fp32 or bf16)"
    )
    instances: int = Field(description="batches of this model that may run at once (setting instances)")
    intra_op_threads: int = Field(description="ONNX Runtime intra-op threads of each instance")
    lone_threads: int = Field(
        0,
        description="threads of a one-row run that starts while no other run goes (setting lone_threads; "
        "0: it runs on an instance's threads, as where the service measured no gain at load)",
    )
    rows_batched: bool = Field(description="false when the variant runs batch rows one at a time")
    graph_top_k: int = Field(
        0,
        description="K of the graph's topk_ids/topk_scores outputs, from which requests for at most K "
        "candidates are answered (0: the graph has none; every answer comes from the logits)",
    )
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
    card: CardSummary | None = Field(None, description="the model card's summary; null without a card")


class VersionState(BaseModel):
    name: str
    version: str
    state: str = Field(description="READY, LOADING, UNLOADING or UNAVAILABLE")
    reason: str = Field("", description="why the version is not READY (empty when READY)")


class ModelsResponse(BaseModel):
    models: list[ModelInfo]
    defaults: dict[str, str | None] = Field(description="default model per task")
    versions: list[VersionState] = Field(
        default_factory=list, description="every known version and its state (the v2 repository index)"
    )


class HealthResponse(BaseModel):
    status: str
    detail: str | None = None


class StatsPoint(BaseModel):
    """Served requests (not probes, scrapes or the playground's own polling) over an interval."""

    requests: float = Field(description="requests answered in the interval")
    requests_per_s: float
    p50_ms: float | None = Field(description="median latency; null without requests")
    p99_ms: float | None = Field(description="99th percentile latency (histogram buckets, interpolated)")
    queue_depth: float = Field(description="requests waiting in the batch queues at the interval's end")
    batch_size: float | None = Field(description="mean requests per executed batch; null without batches")


class StatsWindow(StatsPoint):
    seconds: float = Field(description="how long the window is (up to setting stats_window_s)")


class StatsSeriesPoint(StatsPoint):
    t: float = Field(description="Unix time at the interval's end")


class ModelStatus(BaseModel):
    name: str
    task: str
    ready: bool


class StatsResponse(BaseModel):
    """The status view of the playground, from the same series as /metrics."""

    status: str = Field(description="loading, ready, failed or draining (what /health/ready reports)")
    ready: bool
    models: list[ModelStatus]
    requests_total: float = Field(description="served requests since start")
    batches_total: float = Field(description="batches executed since start")
    window: StatsWindow = Field(description="the last stats_window_s seconds, up to now")
    interval_s: float = Field(description="spacing of the series' points (setting stats_interval_s)")
    series: list[StatsSeriesPoint] = Field(description="one point per interval, oldest first")


_ERROR_DESCRIPTIONS = {
    400: "malformed request",
    404: "unknown model",
    413: "body or image too large",
    415: "wrong content type",
    422: "invalid request (message says what is accepted)",
    503: "overloaded (Retry-After) or not ready",
    504: "deadline exceeded",
}


def error_responses(body: type[BaseModel], *, invalid: int = 422) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the refusals of a route; `invalid` is the transport's status for an
    invalid request (REST 422, the Open Inference Protocol 400)."""
    responses: dict[int | str, dict[str, Any]] = {
        code: {"model": body, "description": text}
        for code, text in _ERROR_DESCRIPTIONS.items()
        if code != 422
    }
    responses[invalid] = {"model": body, "description": _ERROR_DESCRIPTIONS[422]}
    return responses


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s JSON schema with its `$defs` inlined, for a hand-written OpenAPI request body
    (whose `#/$defs/...` references would not resolve inside the OpenAPI document)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(defs[ref.removeprefix("#/$defs/")])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)


ERROR_RESPONSES = error_responses(ErrorResponse)
