"""The model configuration and statistics extensions: Triton's schemas, built from what is served.

`model_config` describes a served model as Triton's `ModelConfig` does (what tritonclient's
`get_model_config` returns and perf_analyzer reads before it sends anything), from the served
directory and the settings only: platform and backend, the batcher's `max_batch_size`, the inputs of
the form the name lists and the outputs (`dims` less the batch axis), `dynamic_batching`, the
execution instances as `instance_group`, the version policy. `model_statistics` reports the
counters of `service.telemetry.statistics` in Triton's `ModelStatistics` schema. Both are
JSON-ready dicts (the REST form), which the gRPC server parses into its messages.
"""

from __future__ import annotations

from typing import Any

from contract.errors import ErrorCode, ModelNotFound
from contract.tensors import BYTES
from service.lifecycle.state import ServiceState
from service.telemetry.statistics import Duration, ModelCounters
from service.v2 import inference

BACKEND = "onnxruntime"
NS = 1_000_000_000


def _data_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == BYTES else f"TYPE_{datatype}"


def _dims(tensor: dict[str, Any]) -> list[int]:
    """The tensor's shape less the batch axis (Triton's `dims` of a model with max_batch_size > 0)."""
    return list(tensor["shape"][1:])


def model_config(state: ServiceState, model: inference.ModelRef) -> dict[str, Any]:
    """The served model's configuration in Triton's schema."""
    served = state.loaded(model.name, model.version)
    batcher, settings = served.batcher, served.settings
    kind = "KIND_CPU" if served.runtime.options.device == "cpu" else "KIND_GPU"
    return {
        "name": model.shown,
        "platform": inference.PLATFORM,
        "backend": BACKEND,
        # The model's own policy (its policy.json, a load call's config, or GMLP_VERSION_POLICY).
        "version_policy": state.table.policy_of(served.name).triton(),
        "max_batch_size": batcher.max_batch_size,
        "input": [
            {
                "name": t["name"],
                "data_type": _data_type(t["datatype"]),
                "format": "FORMAT_NONE",
                "dims": _dims(t),
                "optional": False,
            }
            for t in served.v2.inputs(model.encoded)
        ],
        "output": [
            {"name": t["name"], "data_type": _data_type(t["datatype"]), "dims": _dims(t)}
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
        model = inference.resolve(state, name, version)
        # A model or version not served: ModelNotFound; no version named: the newest READY one's.
        served = state.loaded(model.name, model.version)
        names = [(model.name, model.shown, str(served.version))]  # a model's two names share its counters
    counters = state.metrics.statistics.counters
    return {"model_stats": [_model_statistics(counters(model, v), shown) for model, shown, v in names]}
