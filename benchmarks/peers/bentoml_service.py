"""BentoML peer: a service whose `classify` API is batchable (BentoML's adaptive batching).

BentoML's file inputs arrive as multipart fields named after the API's parameter (`file`), so
this peer is measured with multipart bodies. BentoML's batching has no fixed wait: its dispatcher
picks the wait from the batch times it observes, under `max_latency_ms`, which is set well above
any latency seen here so that it never rejects a request. Preprocessing runs per item inside the
batched call (BentoML hands the API the whole batch of inputs). Started by the runner with

    bentoml serve benchmarks.peers.bentoml_service:Classifier --host 127.0.0.1 --port 8003
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import bentoml

from benchmarks.peers.model import MAX_BATCH, PeerModel, instances

MAX_LATENCY_MS = 10_000


@bentoml.service(workers=instances(), logging={"access": {"enabled": False}})
class Classifier:
    """The demo classifier; its execution instances are worker processes (each with its own
    batching); no access log, like gmlp-serve."""

    def __init__(self) -> None:
        self.model = PeerModel.load()
        self.model.warm_up()

    @bentoml.api(batchable=True, max_batch_size=MAX_BATCH, max_latency_ms=MAX_LATENCY_MS)
    def classify(self, file: list[Path]) -> list[dict[str, Any]]:
        pixels = [self.model.transform(path.read_bytes()) for path in file]
        return self.model.predict(pixels)
