"""NVIDIA PyTriton peer: Triton's C++ HTTP/gRPC front end and dynamic batcher calling a Python
function that runs the demo classifier's ONNX file.

The model is bound under the served directory's name with the graph's own tensors, as the
directory's config.json declares them (the tensors gmlp-serve's model configuration lists as
required): Triton batches the requests' input tensors and the function runs one ONNX Runtime
`session.run` over the batch. Each execution instance is its own function and session (PyTriton
binds a list of callables as an instance group), with the product's session options and the
intra-op threads of `benchmarks.peers.model`. Triton's statistics API is restricted to callers that
send the `triton-access-token` header; `--access-token` sets its value. Run in the PyTriton venv:

    python -m benchmarks.peers.pytriton_server --http-port 8000 --grpc-port 8001 --access-token T

Triton's Python backend starts a stub process that embeds the interpreter's libpython; that stub
finds the libpython next to the interpreter only when `LD_LIBRARY_PATH` names its folder (else the
loader may pick a system libpython whose standard library does not match), so `main` puts it first.
"""

from __future__ import annotations

import argparse
import os
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.peers.model import MAX_BATCH, MAX_WAIT_S, PeerModel, instances


def library_path(current: str | None = None) -> str:
    """`LD_LIBRARY_PATH` with the folder of this interpreter's libpython first."""
    libdir = str(sysconfig.get_config_var("LIBDIR"))
    rest = [p for p in (current or "").split(":") if p and p != libdir]
    return ":".join([libdir, *rest])


def tensors(entries: list[dict[str, Any]]) -> list[tuple[str, np.dtype[Any], tuple[int, ...]]]:
    """(name, dtype, shape less the batch axis) of config.json tensors; a named axis is -1."""
    return [
        (
            e["name"],
            np.dtype(str(e.get("dtype", "float32"))),
            tuple(d if isinstance(d, int) else -1 for d in e["shape"][1:]),
        )
        for e in entries
    ]


def infer_function(model: PeerModel, outputs: list[str]) -> Callable[..., dict[str, np.ndarray]]:
    """The function of one execution instance: the batch of input tensors -> the graph's outputs."""
    from pytriton.decorators import batch

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        return dict(zip(outputs, model.session.run(outputs, inputs), strict=True))

    return infer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--access-token", required=True, help="the triton-access-token of the statistics API")
    parser.add_argument(
        "--workspace", type=Path, help="Triton's model store and sockets (default: a temporary one)"
    )
    args = parser.parse_args()
    os.environ["LD_LIBRARY_PATH"] = library_path(os.environ.get("LD_LIBRARY_PATH"))

    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    models = [PeerModel.load() for _ in range(instances())]
    for model in models:
        model.warm_up()
    spec = models[0].spec
    outputs = [t["name"] for t in spec.outputs]
    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.http_port,
        grpc_address="127.0.0.1",
        grpc_port=args.grpc_port,
        allow_metrics=False,
    )
    security = TritonSecurityConfig(access_token=args.access_token)
    with Triton(config=config, workspace=args.workspace, security_config=security) as triton:
        triton.bind(
            model_name=spec.name,
            infer_func=[infer_function(model, outputs) for model in models],
            inputs=[Tensor(name=n, dtype=d, shape=s) for n, d, s in tensors(spec.inputs)],
            outputs=[Tensor(name=n, dtype=d, shape=s) for n, d, s in tensors(spec.outputs)],
            config=ModelConfig(
                max_batch_size=MAX_BATCH,
                batcher=DynamicBatcher(max_queue_delay_microseconds=round(MAX_WAIT_S * 1_000_000)),
            ),
            strict=False,
        )
        triton.serve()


if __name__ == "__main__":
    main()
