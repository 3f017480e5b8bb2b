"""KServe's own client SDK against a running server, as a user runs it (tests run it as a subprocess).

    python tests/service/v2/kserve_client.py http://127.0.0.1:8000 127.0.0.1:8081 cat.jpg [API_KEY]

KServe's SDK registers its copy of the protocol's messages in protobuf's default pool, as
tritonclient does, and the two refuse to share one process; hence a process of its own. Prints
one JSON object with what each call returned. With an API key, every call sends it as the SDK's
users would: `headers={"Authorization": "Bearer KEY"}` over REST, the `authorization` metadata
over gRPC.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig


def image_request(jpeg: bytes, request_id: str, *, binary: bool) -> InferRequest:
    tensor = InferInput("image", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([jpeg], dtype=object), binary_data=binary)
    return InferRequest("tiny-vision", [tensor], request_id=request_id)


async def main(url: str, grpc_address: str, jpeg: bytes, key: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}

    # A new dict per call: the SDK adds the body's own headers (lengths) to the dict it is given.
    def headers() -> dict[str, str] | None:
        return {"Authorization": f"Bearer {key}"} if key else None

    metadata = [("authorization", f"Bearer {key}")] if key else None
    rest = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))
    try:
        out["rest_live"] = await rest.is_server_live(url, headers=headers())
        out["rest_ready"] = await rest.is_model_ready(url, "tiny-vision", headers=headers())
        request = image_request(jpeg, "kserve-rest", binary=True)
        response = await rest.infer(url, request, "tiny-vision", headers=headers())
        out["rest_id"] = response.id
        out["rest_logits"] = response.outputs[0].as_numpy().tolist()
        text = InferInput("text", [1], "BYTES", data=["the [MASK] sat on the mat."])
        masked_request = InferRequest("tiny-mlm", [text], parameters={"top_k": 2})
        masked = await rest.infer(url, masked_request, "tiny-mlm", headers=headers())
        out["rest_predictions"] = json.loads(masked.outputs[0].as_numpy()[0])
        try:
            await rest.infer(url, image_request(jpeg, "x", binary=True), "no-such-model", headers=headers())
        except Exception as exc:  # httpx.HTTPStatusError carrying the server's message
            out["rest_error"] = str(exc)
    finally:
        await rest.close()
    grpc = InferenceGRPCClient(grpc_address, timeout=30)
    try:
        out["grpc_live"] = await grpc.is_server_live(headers=metadata)
        response = await grpc.infer(image_request(jpeg, "kserve-grpc", binary=True), headers=metadata)
        out["grpc_id"] = response.id
        out["grpc_logits"] = response.outputs[0].as_numpy().tolist()
    finally:
        await grpc.close()
    return out


if __name__ == "__main__":
    key = sys.argv[4] if len(sys.argv) > 4 else None
    result = asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]).read_bytes(), key))
    print(json.dumps(result))
