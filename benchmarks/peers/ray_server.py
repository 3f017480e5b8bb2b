"""Ray Serve peer: one replica with `@serve.batch`, reached directly (direct ingress).

Each request is preprocessed in the replica's `__call__` (per request, before the batch queue, in a
worker thread as gmlp-serve does, so that the replica's event loop keeps accepting requests), then
`@serve.batch` gathers up to 16 of them for one session.run (also off the event loop); its
execution instances are concurrent batches (`max_concurrent_batches`) of the one replica.
`max_ongoing_requests` is raised above the largest client count: Ray's default (5) would cap a
batch at 5 and queue the rest in the router, a configuration choice rather than a property of
the framework.

With direct ingress (`RAY_SERVE_ENABLE_DIRECT_INGRESS=1`) the replica runs its own HTTP server on
a port from a configured range and clients talk to it without the hop through Serve's HTTP proxy
actor (a separate process, still running, idle), Ray's fastest path. The runner sets the range to
a single free port, so that port is the replica's.

Run in the Ray venv (blocks until killed):

    python -m benchmarks.peers.ray_server --temp-dir /tmp/peer-ray --port 8002 \\
        --direct-port 8102 --direct-grpc-port 8103
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import numpy as np


def build_app() -> Any:
    """The Serve application (imports Ray lazily, after the environment is set)."""
    from ray import serve
    from starlette.requests import Request

    from benchmarks.peers.model import MAX_BATCH, MAX_WAIT_S, PeerModel, instances

    class Classifier:
        def __init__(self) -> None:
            self.model = PeerModel.load()
            self.model.warm_up()

        @serve.batch(
            max_batch_size=MAX_BATCH, batch_wait_timeout_s=MAX_WAIT_S, max_concurrent_batches=instances()
        )
        async def run_batch(self, pixels: list[np.ndarray]) -> list[dict[str, Any]]:
            return await asyncio.to_thread(self.model.predict, pixels)

        async def __call__(self, request: Request) -> dict[str, Any]:
            pixels = await asyncio.to_thread(self.model.transform, await request.body())
            return await self.run_batch(pixels)

    deployment = serve.deployment(
        num_replicas=1,
        max_ongoing_requests=256,
        ray_actor_options={"num_cpus": 0},
        logging_config={"enable_access_log": False},
    )(Classifier)
    return deployment.bind()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="Serve's HTTP proxy port")
    parser.add_argument("--direct-port", type=int, required=True, help="the replica's own HTTP port")
    parser.add_argument("--direct-grpc-port", type=int, required=True, help="the replica's gRPC port")
    parser.add_argument("--temp-dir", required=True, help="Ray's session directory (not shared /tmp/ray)")
    args = parser.parse_args()
    # Direct ingress is read from the environment when Serve's modules are imported. Port ranges
    # are half-open, [min, max): a range of one port pins the replica to it.
    os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "1"
    for kind, port in (("HTTP", args.direct_port), ("GRPC", args.direct_grpc_port)):
        os.environ[f"RAY_SERVE_DIRECT_INGRESS_MIN_{kind}_PORT"] = str(port)
        os.environ[f"RAY_SERVE_DIRECT_INGRESS_MAX_{kind}_PORT"] = str(port + 1)
    import ray
    from ray import serve

    # address="local": always a new single-node cluster, never one another user started here.
    ray.init(
        address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=args.temp_dir
    )
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(build_app(), route_prefix="/classify", blocking=False)
    print("ray serve ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
