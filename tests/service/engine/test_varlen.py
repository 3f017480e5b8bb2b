"""Fill-mask at each request's own length: served answers equal the fixed-window PyTorch model.

The reference is computed independently: the checkpoint in PyTorch, every text padded to the full
window of n tokens with all prediction slots, softmax in torch. The service runs the same texts
unpadded, in batches padded only to their longest text (`FillMaskPipeline.run_batch`, what the
batcher calls), with `fixed_length` off and on, and from a served directory whose graph has the
static shapes of the first served format.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import pytest
import torch

from contract.spec import read_spec
from export import export_served_model
from model import load_checkpoint
from service.settings import ServiceSettings
from service.tasks.fill_mask import FillMaskPipeline
from service.tasks.registry import load_pipeline
from service.telemetry.metrics import ServiceMetrics

if TYPE_CHECKING:
    from support.servers import RunningServer

pytestmark = pytest.mark.timeout(300)

Feeds = dict[str, np.ndarray]


def _pipeline(served: Path, variant: str = "fp32", **settings: Any) -> FillMaskPipeline:
    spec = read_spec(served)
    assert spec is not None
    options = ServiceSettings(variant=variant, intra_op_threads=1, max_batch_size=8, **settings)
    pipeline = load_pipeline(spec, options, "cpu", ServiceMetrics(8), "1")
    assert isinstance(pipeline, FillMaskPipeline)
    return pipeline


def _texts(n: int, max_predictions: int, vocab: int, count: int, seed: int = 0) -> list[Feeds]:
    """Random texts of 3..n tokens ([CLS] ... [SEP]) with 1..max_predictions masked positions."""
    rng = np.random.default_rng(seed)
    texts = []
    for i in range(count):
        length = 3 + (i * (n - 3)) // max(1, count - 1)  # 3 ... n, the ends included
        ids = rng.integers(1000, vocab, length)
        ids[0], ids[-1] = 101, 102
        masks = int(rng.integers(1, min(max_predictions, length - 2) + 1))
        positions = np.sort(rng.choice(np.arange(1, length - 1), masks, replace=False))
        ids[positions] = 103
        texts.append({"input_ids": ids.astype(np.int64), "mask_positions": positions.astype(np.int64)})
    return texts


def _reference(checkpoint: Path, texts: list[Feeds]) -> list[np.ndarray]:
    """PyTorch at the fixed window: logits [masks, vocab] per text."""
    model = load_checkpoint(checkpoint).eval()
    cfg = model.config
    out = []
    with torch.no_grad():
        for text in texts:
            ids = torch.full((1, cfg.n), cfg.pad_token_id, dtype=torch.long)
            ids[0, : len(text["input_ids"])] = torch.from_numpy(text["input_ids"])
            positions = torch.zeros((1, cfg.max_predictions), dtype=torch.long)
            positions[0, : len(text["mask_positions"])] = torch.from_numpy(text["mask_positions"])
            out.append(model(ids, positions=positions)[0, : len(text["mask_positions"])].numpy())
    return out


def _served(pipeline: FillMaskPipeline, texts: list[Feeds], batch: int) -> list[np.ndarray]:
    """Logits [masks, vocab] per text, run `batch` texts at a time (mixed lengths)."""
    out = []
    for start in range(0, len(texts), batch):
        chunk = texts[start : start + batch]
        for text, result in zip(chunk, pipeline.run_rows(chunk), strict=True):
            out.append(result["logits"][: len(text["mask_positions"])])
    return out


def _assert_same(served: list[np.ndarray], reference: list[np.ndarray], atol: float = 1e-4) -> None:
    """Logits equal up to float rounding, and so the same top-5 tokens."""
    for got, want in zip(served, reference, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=atol)
        assert np.array_equal(np.argsort(-got, -1)[:, :5], np.argsort(-want, -1)[:, :5])


def _top1_agreement(served: list[np.ndarray], reference: list[np.ndarray]) -> float:
    got, want = np.concatenate(served), np.concatenate(reference)
    return float(np.mean(got.argmax(-1) == want.argmax(-1)))


@pytest.fixture(scope="module")
def amlp_served(tiny_amlp_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("amlp") / "tiny-amlp"
    export_served_model(tiny_amlp_checkpoint, out, ["fp32"])
    return out


@pytest.mark.parametrize("kind", ["gmlp", "amlp"])
def test_own_length_equals_the_fixed_window(
    kind: str, request: pytest.FixtureRequest, tiny_mlm_checkpoint: Path, tiny_amlp_checkpoint: Path
) -> None:
    served = request.getfixturevalue("tiny_mlm_served" if kind == "gmlp" else "amlp_served")
    checkpoint = tiny_mlm_checkpoint if kind == "gmlp" else tiny_amlp_checkpoint
    variable, fixed = _pipeline(served), _pipeline(served, fixed_length=True)
    assert not variable.fixed_length and fixed.fixed_length
    codec = variable.codec
    texts = _texts(codec.n, codec.max_predictions, codec.vocab_size, count=30)
    assert {len(t["input_ids"]) for t in texts} >= {3, codec.n}
    reference = _reference(checkpoint, texts)
    for batch in (1, 4, 8):  # alone, and in batches mixing short and long texts
        _assert_same(_served(variable, texts, batch), reference)
    _assert_same(_served(fixed, texts, 8), reference)


def test_static_int8_at_its_own_length(tiny_mlm_served: Path, tiny_mlm_checkpoint: Path) -> None:
    variable, fixed = (
        _pipeline(tiny_mlm_served, "int8"),
        _pipeline(tiny_mlm_served, "int8", fixed_length=True),
    )
    codec = variable.codec
    texts = _texts(codec.n, codec.max_predictions, codec.vocab_size, count=30, seed=1)
    # Static int8 fixes its activation scales at export, so padding changes only the float rounding
    # of the fp32 parts, which can move a value across an int8 step: nearly equal, not bit-equal.
    own, window = _served(variable, texts, 8), _served(fixed, texts, 1)
    assert _top1_agreement(own, window) >= 0.95
    assert max(float(np.abs(a - b).max()) for a, b in zip(own, window, strict=True)) < 0.05
    # Against PyTorch fp32 it keeps the export's own rule for int8 (>= 80 % top-1 agreement).
    assert _top1_agreement(own, _reference(tiny_mlm_checkpoint, texts)) >= 0.8


def test_a_short_and_a_long_text_batched_as_alone(tiny_mlm_served: Path) -> None:
    pipeline = _pipeline(tiny_mlm_served)
    codec = pipeline.codec
    short, long = _texts(codec.n, codec.max_predictions, codec.vocab_size, count=2, seed=2)
    assert (len(short["input_ids"]), len(long["input_ids"])) == (3, codec.n)
    together = pipeline.run_rows([short, long])
    for text, result in zip((short, long), together, strict=True):
        (alone,) = pipeline.run_rows([text])
        masks = len(text["mask_positions"])
        np.testing.assert_allclose(result["logits"][:masks], alone["logits"][:masks], rtol=0, atol=1e-5)


def _fixed_shape_copy(served: Path, out: Path) -> Path:
    """The served directory as the first format wrote it: static seq and prediction axes."""
    shutil.copytree(served, out)
    config = json.loads((out / "config.json").read_text())
    n, slots = config["model"]["n"], config["model"]["max_predictions"]
    config.update(format_version=1)
    config["inputs"][0]["shape"] = ["batch", n]
    config["inputs"][1]["shape"] = ["batch", slots]
    config["outputs"][0]["shape"] = ["batch", slots, config["model"]["vocab_size"]]
    (out / "config.json").write_text(json.dumps(config))
    for file in config["variants"].values():
        proto = onnx.load(str(out / file))
        for value, size in zip(proto.graph.input, (n, slots), strict=True):
            value.type.tensor_type.shape.dim[1].dim_value = size
        onnx.save(proto, str(out / file))
    return out


def test_a_fixed_shape_served_directory_still_works(
    tiny_mlm_served: Path, tiny_mlm_checkpoint: Path, tmp_path: Path
) -> None:
    old = _pipeline(_fixed_shape_copy(tiny_mlm_served, tmp_path / "old"))
    assert old.fixed_length  # read from the graph, not from a setting
    assert old.runtime.static_dims("input_ids")[1] == old.codec.n
    codec = old.codec
    texts = _texts(codec.n, codec.max_predictions, codec.vocab_size, count=12, seed=3)
    _assert_same(_served(old, texts, 4), _reference(tiny_mlm_checkpoint, texts))


def test_served_answers_do_not_depend_on_fixed_length(start_server: Callable[..., RunningServer]) -> None:
    variable, fixed = start_server(), start_server(fixed_length=True)
    texts = ["[MASK]", "the [MASK] sat on the [MASK].", "a " * 12 + "[MASK] day", "[MASK] " * 16]
    answers = []
    for server in (variable, fixed):
        with server.client() as client:
            models = {m["name"]: m for m in client.get("/models").json()["models"]}
            answers.append(
                [client.post("/fill-mask", json={"text": t, "top_k": 5}).json()["predictions"] for t in texts]
            )
        answers[-1].append(models["tiny-mlm"]["fixed_length"])
    assert answers[0][-1] is False and answers[1][-1] is True
    for ours, theirs in zip(answers[0][:-1], answers[1][:-1], strict=True):
        assert [[p["token"] for p in slot] for slot in ours] == [
            [p["token"] for p in slot] for slot in theirs
        ]
        for slot_a, slot_b in zip(ours, theirs, strict=True):
            np.testing.assert_allclose([p["score"] for p in slot_a], [p["score"] for p in slot_b], atol=1e-5)
