"""LitServe peer: a `LitAPI` with LitServe's own batching (`batch`/`predict`/`unbatch`).

LitServe parses a request body as JSON unless it is a form, so the image comes as multipart field
`file` (as with gmlp-serve's multipart form of /classify). Preprocessing runs in `decode_request`,
which LitServe calls per request in its inference worker before it forms the batch, like
gmlp-serve's per-request transform before its batcher. Its execution instances are inference
workers (`workers_per_device`), each a process with its own batching. Run in the LitServe venv:

    python -m benchmarks.peers.litserve_server --port 8001
"""

import argparse
from typing import Any

import litserve as ls
import numpy as np
from fastapi import Request

from benchmarks.peers.model import MAX_BATCH, MAX_WAIT_S, PeerModel, instances


class ClassifierAPI(ls.LitAPI):
    """The demo classifier behind LitServe; `setup` runs in the inference worker process."""

    def setup(self, device: str) -> None:
        self.model = PeerModel.load()
        self.model.warm_up()

    def decode_request(self, request: Request) -> np.ndarray:
        # LitServe reads this annotation (as an object: hence no postponed annotations in this
        # module) to choose its body parsing: for `Request` it parses the form and passes it here.
        upload = request["file"]
        upload.file.seek(0)
        return self.model.transform(upload.file.read())

    def batch(self, inputs: list[np.ndarray]) -> np.ndarray:
        return np.stack(inputs)

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.model.logits(x)

    def unbatch(self, output: np.ndarray) -> list[np.ndarray]:
        return list(output)

    def encode_response(self, output: np.ndarray) -> dict[str, Any]:
        return self.model.responses(output[None])[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    api = ClassifierAPI(max_batch_size=MAX_BATCH, batch_timeout=MAX_WAIT_S, api_path="/classify")
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=instances())
    server.run(
        host="127.0.0.1", port=args.port, num_api_servers=1, generate_client_file=False, log_level="warning"
    )


if __name__ == "__main__":
    main()
