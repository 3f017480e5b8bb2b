"""Variable length in the exported masked LM: one graph for every 1 <= L <= n and 1 <= P <= max_predictions.

Every ONNX answer is compared with the PyTorch model run at its fixed window (the same text padded
to n, read at the same positions), computed here independently of the export's own check.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F

from export import ExportCheckError, export_served_model
from export.onnx_export import example_inputs
from export.verify import ORT_RUN_ERRORS
from model import load_checkpoint


@pytest.fixture(scope="module")
def amlp_variants(tmp_path_factory, tiny_amlp_checkpoint):
    """The tiny aMLP with fp32, static int8 (calibrated on the committed book text) and fp16 files."""
    from contract.calibration import write_calibration_set
    from support.helpers import TEXT_SAMPLE

    root = tmp_path_factory.mktemp("varlen")
    checkpoint = root / "checkpoint"
    shutil.copytree(tiny_amlp_checkpoint, checkpoint)
    write_calibration_set(checkpoint, "fill-mask", TEXT_SAMPLE, count=32)
    export_served_model(checkpoint, root / "served", ["fp32", "int8", "fp16"], calibration_samples=32)
    return root / "served", load_checkpoint(checkpoint)


@pytest.fixture(scope="module")
def options_served(tmp_path_factory):
    """A tiny MLM with a 4-head SGU, a gate activation, a token shift and an untied decoder (fp32)."""
    from model import build_model, save_checkpoint
    from support.helpers import BERT_TOKENIZER, perturbed, tiny_mlm_config

    root = tmp_path_factory.mktemp("varlen-options")
    torch.manual_seed(0)
    config = tiny_mlm_config(heads=4, shift_tokens=1, gate_act="gelu", tie_embeddings=False)
    save_checkpoint(perturbed(build_model(config)), root / "checkpoint", tokenizer=BERT_TOKENIZER)
    export_served_model(root / "checkpoint", root / "served", ["fp32"])
    return root / "served", load_checkpoint(root / "checkpoint")


@pytest.fixture(params=["mlm", "amlp", "options"])
def served_mlm(request):
    """(served directory, PyTorch model); each built only when a test asks for it."""
    if request.param == "mlm":
        checkpoint = request.getfixturevalue("tiny_mlm_checkpoint")
        return request.getfixturevalue("tiny_mlm_served"), load_checkpoint(checkpoint)
    return request.getfixturevalue("amlp_variants" if request.param == "amlp" else "options_served")


def window_logits(model, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """PyTorch logits with `ids` padded to the model's full window n."""
    config = model.config
    window = F.pad(torch.from_numpy(ids), (0, config.n - ids.shape[1]), value=config.pad_token_id)
    with torch.no_grad():
        return model(window, positions=torch.from_numpy(positions)).numpy()


def run(path, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(["logits"], {"input_ids": ids, "mask_positions": positions})[0]


def feeds(config, batch: int, length: int, predictions: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    inputs = example_inputs(config, batch, seed=seed, length=length, predictions=predictions)
    return inputs["input_ids"].numpy(), inputs["mask_positions"].numpy()


def test_fp32_at_every_length_equals_pytorch_at_the_window(served_mlm):
    served_dir, model = served_mlm
    config = model.config
    sess = ort.InferenceSession(str(served_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    for length in range(1, config.n + 1):
        for predictions in sorted({1, 1 + length % config.max_predictions, config.max_predictions}):
            ids, positions = feeds(config, 3, length, predictions, seed=length)
            got = sess.run(["logits"], {"input_ids": ids, "mask_positions": positions})[0]
            expected = window_logits(model, ids, positions)
            assert got.shape == (3, predictions, config.vocab_size)
            assert np.abs(got - expected).max() <= 1e-4, (length, predictions)
    assert np.abs(expected).max() > 1e-2


def test_a_batch_of_mixed_lengths_gives_each_text_its_result_alone(served_mlm):
    """A 3-token and an n-token text in one batch (the short one padded to n) each get what they
    get alone at their own length."""
    served_dir, model = served_mlm
    config = model.config
    path = served_dir / "model.onnx"
    rng = np.random.default_rng(0)
    short_ids = rng.integers(1000, config.vocab_size, (1, 3))  # texts with no padding
    long_ids = rng.integers(1000, config.vocab_size, (1, config.n))
    short_pos, long_pos = np.array([[2, 0]]), np.array([[config.n - 1, 1]])
    batch_ids = np.concatenate([np.pad(short_ids, ((0, 0), (0, config.n - 3))), long_ids])
    together = run(path, batch_ids, np.concatenate([short_pos, long_pos]))
    np.testing.assert_allclose(together[0], run(path, short_ids, short_pos)[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(together[1], run(path, long_ids, long_pos)[0], rtol=0, atol=1e-5)


def test_every_variant_file_has_dynamic_axes_and_takes_several_lengths(amlp_variants):
    served_dir, model = amlp_variants
    config = model.config
    cfg = json.loads((served_dir / "config.json").read_text())
    assert cfg["format_version"] == 2 and cfg["int8_quantization"] == "static"
    assert [e["shape"] for e in cfg["inputs"]] == [["batch", "seq"], ["batch", "predictions"]]
    assert cfg["outputs"][0]["shape"] == ["batch", "predictions", config.vocab_size]
    min_agreement = {"fp32": 1.0, "int8": 0.8, "fp16": 0.95}
    for variant, filename in cfg["variants"].items():
        proto = onnx.load(str(served_dir / filename))
        dims = {
            v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in (*proto.graph.input, *proto.graph.output)
        }
        assert dims == {
            "input_ids": ["batch", "seq"],
            "mask_positions": ["batch", "predictions"],
            "logits": ["batch", "predictions", config.vocab_size],
            "topk_ids": ["batch", "predictions", cfg["graph_top_k"]],
            "topk_scores": ["batch", "predictions", cfg["graph_top_k"]],
        }, variant
        assert sum(n.op_type == "SpatialGatingUnit" for n in proto.graph.node) == config.depth, variant
        agree, total = 0, 0
        for length in (1, 5, config.n // 2, config.n):
            for predictions in (1, config.max_predictions):
                ids, positions = feeds(config, 8, length, predictions, seed=10 + length)
                got = run(served_dir / filename, ids, positions)
                assert got.shape == (8, predictions, config.vocab_size), (variant, length)
                expected = window_logits(model, ids, positions)
                agree += int((got.argmax(-1) == expected.argmax(-1)).sum())
                total += expected.shape[0] * expected.shape[1]
        assert agree / total >= min_agreement[variant], variant


def test_the_graph_refuses_more_than_n_tokens(tiny_mlm_served, tiny_mlm_checkpoint):
    config = load_checkpoint(tiny_mlm_checkpoint).config
    ids, positions = feeds(config, 1, config.n, 1, seed=0)
    with pytest.raises(ORT_RUN_ERRORS):
        run(tiny_mlm_served / "model.onnx", np.pad(ids, ((0, 0), (0, 1)), constant_values=2000), positions)


def test_an_export_that_only_works_at_n_is_not_written(tmp_path, tiny_mlm_checkpoint, monkeypatch):
    """The SGU function without its slice of W still exports with dynamic axes and is right at
    L = n; the export's check at shorter lengths must refuse it and write nothing."""
    import export.onnx_export as onnx_export

    real_build = onnx_export.build_sgu_function

    def fixed_window_sgu(**kwargs):
        return real_build(**{**kwargs, "variable_length": False})

    monkeypatch.setattr(onnx_export, "build_sgu_function", fixed_window_sgu)
    with pytest.raises(ExportCheckError, match=r"fp32: ONNX Runtime failed on inputs of .*'length': 1\b"):
        export_served_model(tiny_mlm_checkpoint, tmp_path / "out")
    assert not (tmp_path / "out").exists()
