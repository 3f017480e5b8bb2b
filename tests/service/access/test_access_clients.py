"""Stock clients with credentials, unchanged: huggingface_hub's `token=`, tritonclient's HTTP headers
and gRPC metadata, and KServe's SDK; each refused without the key, served with it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError
from tritonclient.utils import InferenceServerException

from support.keys import bearer

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(180)

KSERVE_CLIENT = Path(__file__).resolve().parents[1] / "v2" / "kserve_client.py"


@pytest.fixture(scope="module")
def server(start_server: Any, keys_file: tuple[Path, dict[str, str]], grpc_port: Any) -> RunningServer:
    path, keys = keys_file
    return start_server(
        api_keys_file=path, grpc_port=grpc_port(), client_options={"headers": bearer(keys["ops"])}
    )


def _text_input(module: Any) -> Any:
    tensor = module.InferInput("text", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"the [MASK] sat on the mat."], dtype=object))
    return tensor


def test_huggingface_hub_token(server: RunningServer, keys_file: tuple[Path, dict[str, str]]) -> None:
    url = f"{server.url}/models/tiny-mlm"
    with pytest.raises(HfHubHTTPError) as caught:
        InferenceClient(model=url, timeout=30).fill_mask("the [MASK] sat.")
    assert caught.value.response is not None and caught.value.response.status_code == 401
    answers = InferenceClient(model=url, token=keys_file[1]["client"], timeout=30).fill_mask(
        "the [MASK] sat."
    )
    assert answers and all(a.sequence for a in answers)


def test_tritonclient_http_headers(server: RunningServer, keys_file: tuple[Path, dict[str, str]]) -> None:
    client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        assert client.is_server_ready()  # health is open
        with pytest.raises(InferenceServerException, match="API key"):
            client.infer("tiny-mlm", [_text_input(httpclient)])
        headers = bearer(keys_file[1]["client"])
        result = client.infer("tiny-mlm", [_text_input(httpclient)], headers=headers)
        assert result.as_numpy("predictions") is not None
        assert client.get_model_metadata("tiny-mlm", headers=headers)["name"] == "tiny-mlm"
    finally:
        client.close()


def test_tritonclient_grpc_metadata(server: RunningServer, keys_file: tuple[Path, dict[str, str]]) -> None:
    client = grpcclient.InferenceServerClient(url=f"127.0.0.1:{server.settings.grpc_port}")
    try:
        assert client.is_server_live() and client.is_model_ready("tiny-mlm")
        with pytest.raises(InferenceServerException) as caught:
            client.infer("tiny-mlm", [_text_input(grpcclient)])
        assert caught.value.status() == "StatusCode.UNAUTHENTICATED"
        headers = {"authorization": f"Bearer {keys_file[1]['client']}"}
        result = client.infer("tiny-mlm", [_text_input(grpcclient)], headers=headers)
        assert result.as_numpy("predictions") is not None
        other = {"authorization": f"Bearer {keys_file[1]['ops']}"}
        with pytest.raises(InferenceServerException) as caught:
            client.get_model_metadata("tiny-mlm", headers=other)
        assert caught.value.status() == "StatusCode.PERMISSION_DENIED"
    finally:
        client.close()


def test_kserve_sdk_with_headers(
    server: RunningServer, keys_file: tuple[Path, dict[str, str]], cifar_images: list[bytes], tmp_path: Path
) -> None:
    image = tmp_path / "image.jpg"
    image.write_bytes(cifar_images[3])
    command = [
        sys.executable,
        str(KSERVE_CLIENT),
        server.url,
        f"127.0.0.1:{server.settings.grpc_port}",
        str(image),
    ]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=90)
    assert refused.returncode != 0 and "401" in refused.stderr
    run = subprocess.run([*command, keys_file[1]["client"]], capture_output=True, text=True, timeout=90)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["rest_id"] == "kserve-rest" and out["grpc_id"] == "kserve-grpc"
    np.testing.assert_allclose(out["grpc_logits"], out["rest_logits"], rtol=0, atol=1e-5)
