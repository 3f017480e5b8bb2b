"""The model configuration and statistics extensions, read with tritonclient over REST and gRPC.

The gRPC answers are decoded by tritonclient's own copy of Triton's messages, so a field number
of ours that differed from Triton's would show up here as a missing or wrong value. The
configuration is checked against the metadata and the server's settings; the statistics against
the requests the test sent and against /metrics, whose series they are read from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(120)

MODELS = ("tiny-vision", "tiny-mlm")


def config_summary(client: Any, transport: str, name: str) -> dict[str, Any]:
    """The fields both transports must agree on, from tritonclient's answer."""
    if transport == "http":
        c = client.get_model_config(name)
        batching, policy = c["dynamic_batching"], c["dynamic_batching"]["default_queue_policy"]
        return {
            "name": c["name"],
            "platform": c["platform"],
            "backend": c["backend"],
            "max_batch_size": c["max_batch_size"],
            "input": [(t["name"], t["data_type"], t["dims"], t["optional"]) for t in c["input"]],
            "output": [(t["name"], t["data_type"], t["dims"]) for t in c["output"]],
            "delay_us": batching["max_queue_delay_microseconds"],
            "queue": (
                policy["max_queue_size"],
                policy["default_timeout_microseconds"],
                policy["timeout_action"],
            ),
            "instances": [(g["kind"], g["count"]) for g in c["instance_group"]],
            "latest": c["version_policy"]["latest"]["num_versions"],
        }
    c = client.get_model_config(name).config
    dtype = model_config_pb2.DataType.Name
    policy = c.dynamic_batching.default_queue_policy
    return {
        "name": c.name,
        "platform": c.platform,
        "backend": c.backend,
        "max_batch_size": c.max_batch_size,
        "input": [(t.name, dtype(t.data_type), list(t.dims), t.optional) for t in c.input],
        "output": [(t.name, dtype(t.data_type), list(t.dims)) for t in c.output],
        "delay_us": c.dynamic_batching.max_queue_delay_microseconds,
        "queue": (
            policy.max_queue_size,
            policy.default_timeout_microseconds,
            model_config_pb2.ModelQueuePolicy.TimeoutAction.Name(policy.timeout_action),
        ),
        "instances": [
            (model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind), g.count) for g in c.instance_group
        ],
        "latest": c.version_policy.latest.num_versions,
    }


def test_config_follows_the_metadata_and_the_settings(
    triton_server: RunningServer, triton_clients: dict[str, Any], transport: str
) -> None:
    client = triton_clients[transport]
    settings = triton_server.settings
    with triton_server.client() as http:
        described = {m["name"]: m for m in http.get("/models").json()["models"]}
    for name in MODELS:
        meta = triton_clients["http"].get_model_metadata(name)
        config = config_summary(client, transport, name)
        assert config == config_summary(triton_clients["http"], "http", name)

        def kind(datatype: str) -> str:
            return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"

        assert config["input"] == [
            (t["name"], kind(t["datatype"]), t["shape"][1:], t["datatype"] == "BYTES") for t in meta["inputs"]
        ]
        assert config["output"] == [(t["name"], kind(t["datatype"]), t["shape"][1:]) for t in meta["outputs"]]
        assert (config["name"], config["platform"], config["backend"]) == (
            name,
            meta["platform"],
            "onnxruntime",
        )
        assert config["max_batch_size"] == settings.max_batch_size
        assert config["delay_us"] == round(settings.max_queue_delay_ms * 1000)
        assert config["queue"] == (settings.max_queue_size, round(settings.request_timeout_s * 1e6), "REJECT")
        assert config["instances"] == [("KIND_CPU", described[name]["instances"])]
        assert config["latest"] == 1
    # Version 1 is the one served; other versions and models are not.
    assert triton_clients["http"].get_model_config("tiny-mlm", "1") == triton_clients[
        "http"
    ].get_model_config("tiny-mlm")
    for call in (lambda: client.get_model_config("nope"), lambda: client.get_model_config("tiny-mlm", "2")):
        with pytest.raises(InferenceServerException) as caught:
            call()
        assert "not served" in caught.value.message() or "no version" in caught.value.message()


def statistics(client: Any, transport: str, name: str) -> dict[str, Any]:
    """One model's statistics as plain numbers."""
    if transport == "http":
        (entry,) = client.get_inference_statistics(name)["model_stats"]
        stats = entry["inference_stats"]
        return {
            "inferences": entry["inference_count"],
            "executions": entry["execution_count"],
            "last": entry["last_inference"],
            **{
                f"{k}.{f}": stats[k][f]
                for k in ("success", "fail", "queue", "compute_infer")
                for f in ("count", "ns")
            },
            "rows_in_batches": sum(
                b["batch_size"] * b["compute_infer"]["count"] for b in entry["batch_stats"]
            ),
            "batches": sum(b["compute_infer"]["count"] for b in entry["batch_stats"]),
        }
    (entry,) = client.get_inference_statistics(name).model_stats
    stats = entry.inference_stats
    return {
        "inferences": entry.inference_count,
        "executions": entry.execution_count,
        "last": entry.last_inference,
        **{
            f"{k}.{f}": getattr(getattr(stats, k), f)
            for k in ("success", "fail", "queue", "compute_infer")
            for f in ("count", "ns")
        },
        "rows_in_batches": sum(b.batch_size * b.compute_infer.count for b in entry.batch_stats),
        "batches": sum(b.compute_infer.count for b in entry.batch_stats),
    }


def _pixels_input(transport: str, rows: int) -> Any:
    module = httpclient if transport == "http" else grpcclient
    tensor = module.InferInput("pixel_values", [rows, 3, 32, 32], "FP32")
    tensor.set_data_from_numpy(np.random.default_rng(rows).standard_normal((rows, 3, 32, 32), np.float32))
    return tensor


def _image_input(transport: str) -> Any:
    module = httpclient if transport == "http" else grpcclient
    tensor = module.InferInput("image", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"not an image"]], dtype=object))
    return tensor


def test_statistics_count_what_was_sent(
    triton_server: RunningServer, triton_clients: dict[str, Any], transport: str
) -> None:
    client = triton_clients[transport]
    before = statistics(client, transport, "tiny-vision")
    untouched = statistics(client, transport, "tiny-mlm")
    sent_rows = [1, 2, 3]
    for rows in sent_rows:
        client.infer("tiny-vision", [_pixels_input(transport, rows)])
    with pytest.raises(InferenceServerException) as caught:  # two forms at once: refused, counted
        client.infer("tiny-vision", [_pixels_input(transport, 1), _image_input(transport)])
    assert "takes the inputs" in caught.value.message()
    after = statistics(client, transport, "tiny-vision")
    delta = {key: after[key] - before[key] for key in before}
    rows = sum(sent_rows)
    assert delta["success.count"] == len(sent_rows) and delta["fail.count"] == 1
    assert delta["success.ns"] > 0 and delta["fail.ns"] > 0
    assert delta["inferences"] == delta["queue.count"] == delta["compute_infer.count"] == rows
    assert 1 <= delta["executions"] <= rows and delta["batches"] == delta["executions"]
    assert delta["rows_in_batches"] == rows and delta["compute_infer.ns"] > 0
    assert after["last"] >= before["last"] and after["last"] > 0
    assert statistics(client, transport, "tiny-mlm") == untouched
    # The same series as /metrics.
    labels = {"model": "tiny-vision", "version": "1"}
    assert triton_server.metric("gmlp_model_inferences_total", **labels) == after["inferences"]
    assert triton_server.metric("gmlp_model_requests_total", outcome="fail", **labels) == after["fail.count"]


def test_statistics_of_every_model_and_the_extensions(
    triton_server: RunningServer, triton_clients: dict[str, Any]
) -> None:
    http, grpc_client = triton_clients["http"], triton_clients["grpc"]
    every = http.get_inference_statistics()["model_stats"]
    assert sorted((m["name"], m["version"]) for m in every) == [("tiny-mlm", "1"), ("tiny-vision", "1")]
    assert sorted(m.name for m in grpc_client.get_inference_statistics().model_stats) == sorted(MODELS)
    assert http.get_inference_statistics("tiny-mlm", "1")["model_stats"][0]["name"] == "tiny-mlm"
    for client in (http, grpc_client):
        with pytest.raises(InferenceServerException):
            client.get_inference_statistics("nope")
    for extensions in (
        http.get_server_metadata()["extensions"],
        grpc_client.get_server_metadata().extensions,
    ):
        assert {"model_configuration", "statistics"} <= set(extensions)
