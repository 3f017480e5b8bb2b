"""A converted g-mlp-pytorch classifier and language model, served by a real server: /classify and
/fill-mask answer what the package's own forward gives for the same input."""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer

from service.settings import ServiceSettings
from support.helpers import BERT_TOKENIZER
from support.lucidrains import CASES
from support.servers import RunningServer


@pytest.fixture(scope="module")
def server(served, tmp_path_factory):
    repository = tmp_path_factory.mktemp("lucidrains-repository")
    for name in ("vision", "lm"):
        shutil.copytree(served(name)[1], repository / name)
    settings = ServiceSettings(
        model_repository=repository,
        checkpoint_dir=None,
        intra_op_threads=1,
        max_batch_size=4,
        max_queue_delay_ms=5.0,
        request_timeout_s=30.0,
        grpc_port=0,
    )
    running = RunningServer(settings).start().wait_ready()
    yield running
    running.stop()


def softmax(logits: torch.Tensor) -> np.ndarray:
    return torch.softmax(logits.double(), dim=-1).numpy()


def test_classify_answers_as_the_package(server, served):
    """An image of exactly the model's size (no resize), normalised with mean = std = 0.5, the
    preprocessing a converted classifier records."""
    reference, _ = served("vision")
    size = CASES["vision"]["image_size"]
    pixels = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    png = io.BytesIO()
    Image.fromarray(pixels).save(png, format="PNG")
    with server.client() as client:
        response = client.post(
            "/classify",
            params={"model": "vision", "top_k": 5},
            content=png.getvalue(),
            headers={"content-type": "image/png"},
        )
    assert response.status_code == 200, response.text
    x = torch.from_numpy((pixels.astype(np.float32) / 255.0 - 0.5) / 0.5).permute(2, 0, 1)[None]
    with torch.no_grad():
        probs = softmax(reference(x)[0])
    predictions = response.json()["predictions"]
    assert [p["label"] for p in predictions] == [f"class_{i}" for i in np.argsort(-probs)]
    assert [p["score"] for p in predictions] == pytest.approx(sorted(probs, reverse=True), abs=1e-5)


def test_fill_mask_answers_as_the_package(server, served):
    """A text of exactly seq_len tokens ([CLS] and [SEP] included): the package's own window."""
    reference, _ = served("lm")
    text = "the [MASK] sat on a mat"
    tokenizer = Tokenizer.from_file(str(BERT_TOKENIZER))
    tokenizer.no_padding()
    ids = tokenizer.encode(text).ids
    assert len(ids) == CASES["lm"]["seq_len"]
    with server.client() as client:
        response = client.post("/fill-mask", json={"text": text, "top_k": 3, "model": "lm"})
    assert response.status_code == 200, response.text
    with torch.no_grad():
        probs = softmax(reference(torch.tensor([ids]))[0, ids.index(103)])
    (predictions,) = response.json()["predictions"]  # one list per [MASK]
    assert [p["token"] for p in predictions] == list(np.argsort(-probs)[:3])
    assert [p["score"] for p in predictions] == pytest.approx(sorted(probs, reverse=True)[:3], abs=1e-5)
