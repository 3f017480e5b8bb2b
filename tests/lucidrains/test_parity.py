"""g-mlp-pytorch models, converted and exported with the README's commands, answer as the package's
own forward does: fp32 ONNX logits within 1e-4 of its logits (relative to their largest), every
option the converter accepts covered."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from contract.check import run_check
from export.onnx_export import DOMAIN, OP_TYPE
from support.lucidrains import ALL_VARIANTS, CASES, VOCAB

PARITY = 1e-4


def graph_inputs(args: dict, batch: int = 3) -> dict[str, np.ndarray]:
    """Inputs both models read: images, or texts of exactly seq_len tokens with no padding."""
    gen = torch.Generator().manual_seed(5)
    if "image_size" in args:
        size = args["image_size"]
        return {"pixel_values": torch.randn(batch, 3, size, size, generator=gen).numpy()}
    n = args["seq_len"]
    ids = torch.randint(1000, VOCAB, (batch, n), generator=gen).numpy()
    return {"input_ids": ids, "mask_positions": np.tile(np.arange(n), (batch, 1))}


def package_logits(reference: torch.nn.Module, inputs: dict[str, np.ndarray]) -> np.ndarray:
    first = next(iter(inputs.values()))
    with torch.no_grad():
        return reference(torch.from_numpy(first)).numpy()  # [B, classes] or [B, n, vocab]


@pytest.mark.parametrize("name", list(CASES))
def test_fp32_onnx_logits_match_the_package(served, name):
    reference, out = served(name)
    graph = onnx.load(str(out / "model.onnx"))
    fused = [n for n in graph.graph.node if (n.domain, n.op_type) == (DOMAIN, OP_TYPE)]
    assert len(fused) == CASES[name]["depth"]
    inputs = graph_inputs(CASES[name])
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(["logits"], inputs)[0]
    expected = package_logits(reference, inputs)
    assert got.shape == expected.shape
    relative = float(np.abs(got - expected).max() / np.abs(expected).max())
    print(f"{name}: relative max |logit diff| {relative:.2e}")
    assert relative <= PARITY
    # Perturbed weights: the answer depends on the input, and on its order of tokens or patches.
    assert np.abs(expected[0] - expected[1]).max() > 1e-2


@pytest.mark.parametrize("name", sorted(ALL_VARIANTS))
def test_every_variant_is_recorded_and_agrees_with_the_package(served, name):
    reference, out = served(name)
    config = json.loads((out / "config.json").read_text())
    assert set(config["variants"]) == {"fp32", "int8", "fp16"}
    inputs = graph_inputs(CASES[name], batch=8)
    expected = package_logits(reference, inputs)
    for variant, file in config["variants"].items():
        sess = ort.InferenceSession(str(out / file), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]

        def run(feeds, sess=sess, names=names):
            return dict(zip(names, sess.run(names, feeds), strict=True))

        assert run_check(out, config["check"], variant, run) is None, variant
        got = run(inputs)["logits"]
        agreement = float((got.argmax(-1) == expected.argmax(-1)).mean())
        assert agreement >= (0.75 if variant == "int8" else 0.95), (variant, agreement)
