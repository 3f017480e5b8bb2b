"""The classifier every peer server serves: one ONNX Runtime session and the product's own transform.

Every peer imports this module so that the only thing that differs between them is the serving
framework (HTTP stack, queue, batching): the same exported file, a session built by the product's
own `service.engine.runtime.OnnxModel` (its CPU options: intra-op threads, sequential, no spinning), the
same preprocessing (`contract.image`), the same scores (`contract.scores`) and the same response
shape as gmlp-serve's `/classify`. It needs only numpy, Pillow, tokenizers and onnxruntime
(`contract` and `service.engine.runtime` import nothing else), which every peer venv has.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from contract.image import ImageTransform
from contract.scores import ranked, softmax
from contract.spec import ModelSpec, read_spec
from service.engine.runtime import OnnxModel, RuntimeOptions

# The batch limits every peer is configured with (gmlp-serve: --max-batch-size, --max-queue-delay-ms).
MAX_BATCH = 16
MAX_WAIT_S = 0.002
# The CPUs every server's model runs on, shared out among its execution instances (batches that
# may run at once: gmlp-serve --instances, LitServe workers, Ray Serve concurrent batches,
# BentoML workers), GMLP_PEER_INSTANCES of them, set by the runner.
CPUS = 2
INSTANCES_ENV = "GMLP_PEER_INSTANCES"
TOP_K = 5
# gmlp-serve's default `max_image_pixels` (the decompression-bomb guard).
MAX_PIXELS = 40_000_000
MODEL_ENV = "GMLP_PEER_MODEL_DIR"
VARIANT = "int8"


def instances() -> int:
    """Execution instances of every server in this run (the runner's --instances)."""
    return int(os.environ.get(INSTANCES_ENV, "1"))


def intra_op_threads() -> int:
    """ORT intra-op threads of each instance: the CPUs shared out."""
    return max(1, CPUS // instances())


@dataclass
class PeerModel:
    """A served classifier: bytes -> pixels (per request), pixels batch -> responses (per batch)."""

    spec: ModelSpec
    session: ort.InferenceSession
    transform: ImageTransform  # encoded image -> float32 [3, H, W], as gmlp-serve's /classify does it
    labels: list[str]
    input_name: str

    @classmethod
    def load(cls, model_dir: str | Path | None = None, variant: str = VARIANT) -> PeerModel:
        """Load the served-model directory (default: $GMLP_PEER_MODEL_DIR, set by the runner)."""
        directory = Path(model_dir or os.environ[MODEL_ENV])
        spec = read_spec(directory)
        if spec is None:
            raise SystemExit(f"{directory} is not a served-model directory (run gmlp export)")
        # The product's own runtime class builds the session, so the options cannot drift apart.
        runtime = OnnxModel(spec.variant_path(variant), RuntimeOptions("cpu", intra_op_threads(), False))
        session = runtime.session
        transform = ImageTransform.for_model(spec.config, MAX_PIXELS)
        return cls(spec, session, transform, spec.labels(), session.get_inputs()[0].name)

    def logits(self, pixels: list[np.ndarray] | np.ndarray) -> np.ndarray:
        """One session.run over a batch of preprocessed images -> logits [B, classes]."""
        batch = np.stack(pixels) if isinstance(pixels, list) else pixels
        return self.session.run(None, {self.input_name: batch})[0]

    def responses(self, logits: np.ndarray) -> list[dict[str, Any]]:
        """Per-image JSON bodies shaped like gmlp-serve's /classify response."""
        out = []
        for row in logits:
            probs = softmax(row)
            preds = [{"label": self.labels[i], "score": float(probs[i])} for i in ranked(probs, TOP_K)]
            out.append({"model": self.spec.name, "predictions": preds})
        return out

    def predict(self, pixels: list[np.ndarray]) -> list[dict[str, Any]]:
        return self.responses(self.logits(pixels))

    def warm_up(self) -> None:
        """Run batch 1 and a full batch once, as gmlp-serve does at start-up (ORT arena allocation)."""
        h, w = self.transform.crop_size
        zero = np.zeros((3, h, w), dtype=np.float32)
        self.logits([zero])
        self.logits([zero] * MAX_BATCH)
