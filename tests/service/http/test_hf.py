"""The Hugging Face inference API with huggingface_hub's InferenceClient, pointed at POST /models/{name}.

The client posts to the URL it is given, as it does for an Inference Endpoint; answers must equal
the task routes' for the same model and input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(start_server: Any) -> RunningServer:
    return start_server()


def hf(server: RunningServer, model: str) -> InferenceClient:
    return InferenceClient(model=f"{server.url}/models/{model}", timeout=30)


def test_fill_mask(server: RunningServer) -> None:
    client = hf(server, "tiny-mlm")
    one = client.fill_mask("the [MASK] sat on the mat.", top_k=3)
    targeted = client.fill_mask("a [MASK] day", targets=["sunny", "rainy"])
    with server.client() as http:
        expected = http.post("/fill-mask", json={"text": "the [MASK] sat on the mat.", "top_k": 3}).json()
    assert [(p.token, p.token_str, p.sequence) for p in one] == [
        (p["token"], p["token_str"], p["sequence"]) for p in expected["predictions"][0]
    ]
    assert [p.score for p in one] == pytest.approx([p["score"] for p in expected["predictions"][0]])
    assert {p.token_str for p in targeted} == {"sunny", "rainy"}


def test_image_classification_raw_bytes_and_base64(server: RunningServer, cifar_images: list[bytes]) -> None:
    client = hf(server, "tiny-vision")
    with server.client() as http:
        expected = http.post("/classify", params={"top_k": 10}, content=cifar_images[5]).json()["predictions"]
    raw = client.image_classification(cifar_images[5])  # raw bytes, no content type
    assert [(p.label, pytest.approx(p.score)) for p in raw] == [
        (p["label"], p["score"]) for p in expected[:5]
    ]
    # With parameters the client switches to JSON {"inputs": "<base64>", "parameters": {...}}.
    top2 = client.image_classification(cifar_images[5], top_k=2)
    assert [p.label for p in top2] == [p["label"] for p in expected[:2]]
    # HF's pipeline caps top_k at the number of labels instead of refusing it.
    assert len(client.image_classification(cifar_images[5], top_k=50)) == 10
    logits = client.image_classification(cifar_images[5], top_k=1, function_to_apply="none")
    assert logits[0].label == expected[0]["label"] and logits[0].score != pytest.approx(expected[0]["score"])


def test_errors_carry_the_servers_message(server: RunningServer) -> None:
    with pytest.raises(HfHubHTTPError) as no_mask:
        hf(server, "tiny-mlm").fill_mask("nothing to fill")
    assert no_mask.value.response.status_code == 422 and "contains no [MASK]" in str(no_mask.value)
    with pytest.raises(HfHubHTTPError) as unknown:
        hf(server, "bert").fill_mask("a [MASK]")
    assert unknown.value.response.status_code == 404 and "model 'bert' is not served" in str(unknown.value)
    with pytest.raises(HfHubHTTPError) as not_image:
        hf(server, "tiny-vision").image_classification(b"definitely not an image")
    assert not_image.value.response.status_code == 422 and "not a readable image" in str(not_image.value)
    with server.client() as http:  # GET /models (the listing) keeps the REST error shape
        assert http.post("/models").json()["error"]["code"] == "method_not_allowed"


def test_raw_bodies_as_curl_sends_them(server: RunningServer, cifar_images: list[bytes]) -> None:
    """`curl --data-binary @file URL` (curl's form content type) and raw text for a masked LM."""
    curl_type = {"content-type": "application/x-www-form-urlencoded"}
    with server.client() as http:
        image = http.post("/models/tiny-vision", content=cifar_images[2], headers=curl_type)
        classify = http.post("/classify", content=cifar_images[2], headers=curl_type)
        text = http.post(
            "/models/tiny-mlm", content=b"the [MASK] sat.", headers={"content-type": "text/plain"}
        )
        as_json = http.post("/models/tiny-mlm", json={"inputs": "the [MASK] sat."})
    assert image.status_code == classify.status_code == text.status_code == 200, image.text
    assert image.json() == classify.json()["predictions"]
    assert text.json() == as_json.json() and len(text.json()) == 5
