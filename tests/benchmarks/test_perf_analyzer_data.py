"""The --input-data files `benchmarks.perf_analyzer` hands perf_analyzer are answered: every row,
sent as perf_analyzer sends it (batch 1, every output, gRPC), by a real `gmlp serve` of the tiny
test models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import json_format

from benchmarks.perf_analyzer import input_data
from gmlp.server_process import ServerProcess, free_port, gmlp_serve

pytestmark = pytest.mark.timeout(180)

NUMPY = {"FP32": np.float32, "INT64": np.int64}


@pytest.fixture(scope="module")
def grpc_client(model_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    port = free_port()
    log = tmp_path_factory.mktemp("perf-analyzer-data") / "server.log"
    server: ServerProcess = gmlp_serve(model_repository, log_path=log, serve_args=["--grpc-port", str(port)])
    with server:
        client = grpcclient.InferenceServerClient(url=f"127.0.0.1:{port}")
        server.wait_ready(lambda: client.is_server_ready() or None)
        yield client


@pytest.mark.parametrize(
    ("name", "kind"), [("tiny-vision", "random"), ("tiny-vision", "real"), ("tiny-mlm", "random")]
)
def test_every_row_of_the_input_data_is_answered(
    grpc_client: Any, model_repository: Path, name: str, kind: str
) -> None:
    config = json_format.MessageToDict(
        grpc_client.get_model_config(name).config, preserving_proto_field_name=True
    )
    types = {t["name"]: t["data_type"].removeprefix("TYPE_") for t in config["input"]}
    rows = input_data(model_repository / name, config, kind)["data"]
    assert rows
    outputs = [grpcclient.InferRequestedOutput(t["name"]) for t in config["output"]]
    for row in rows:
        inputs = []
        for tensor, entry in row.items():
            infer_input = grpcclient.InferInput(tensor, [1, *entry["shape"]], types[tensor])
            array = np.asarray(entry["content"], dtype=NUMPY[types[tensor]])
            infer_input.set_data_from_numpy(array.reshape([1, *entry["shape"]]))
            inputs.append(infer_input)
        result = grpc_client.infer(name, inputs, outputs=outputs)
        assert all(result.as_numpy(t["name"]) is not None for t in config["output"])
