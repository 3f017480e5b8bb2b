"""The limit a server is measured against: each task's unavoidable work in one process, nothing else.

    .venv/bin/python -m benchmarks.bare_pipeline                       # both tasks, 3 rounds x 10 s
    .venv/bin/python -m benchmarks.bare_pipeline --task classify --seconds 5 --rounds 1

No HTTP, no event loop, no queue: as many threads as the service runs execution instances, each
with the service's intra-op threads, call a session built by the product's `OnnxModel`, batch
after batch of 16 requests (`--batch-size`). "bare" is the task's whole work with the product's own libraries
(classify: decode, transform, run, rank; fill-mask: tokenise, run at the padded length, top 5 of
every [MASK] with the strings a response carries); "raw" is `session.run` alone on inputs prepared
once. Rounds alternate the two; CPU is the whole process's (all threads) per request answered. One
JSON line per task; `benchmarks.peers.run` runs it every round for served/bare ratios
(docs/benchmarks.md, "The limit: the bare pipeline").
"""

from __future__ import annotations

import itertools
import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import REPO, command_line, cpu_facts, cpu_line
from contract.formats import TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT
from contract.image import ImageTransform
from contract.scores import labelled_rows, ranked_labels
from contract.spec import ModelSpec, read_spec
from contract.text import FillMaskCodec
from loadtests.workload import BUNDLED_SENTENCES, load_images, read_sentences_tsv
from service.engine.rows import TOP_K_OUTPUTS, graph_top_k
from service.engine.runtime import OnnxModel, RuntimeOptions, choose_variant
from service.settings import ServiceSettings

BATCH = 16
TOP_K = 5
TASKS = ("classify", "fill-mask")
DEFAULT_MODELS = {
    "classify": REPO / "models" / "cifar10-gmlp",
    "fill-mask": REPO / "models" / "gutenberg-gmlp-mlm",
}


def sentences() -> list[str]:
    """The bundled masked sentences (Project Gutenberg, one [MASK] each)."""
    return [s.text for s in read_sentences_tsv(BUNDLED_SENTENCES)]


def timed(run: Callable[[int], object], threads: int, seconds: float, batch: int) -> dict[str, Any]:
    """`run(k)` (one batch of `batch` requests; k: the batch's number, 0, 1, ... across all
    threads) from `threads` threads for `seconds`: batches and requests answered, wall and CPU
    seconds, and the two figures. ORT releases the GIL, so the threads run their sessions in
    parallel, as the service's execution instances do."""
    calls = itertools.count()
    cpu0, t0 = time.process_time(), time.perf_counter()  # CPU of every thread

    def worker() -> None:
        while time.perf_counter() - t0 < seconds:
            run(next(calls))

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    # `calls` has handed out one number per call made; the next one is their count.
    batches, wall_s, cpu_s = next(calls), time.perf_counter() - t0, time.process_time() - cpu0
    requests = batches * batch
    per_request = cpu_s * 1000.0 / max(requests, 1)
    figures = {"requests_per_s": requests / wall_s, "cpu_ms_per_request": per_request}
    return {"batches": batches, "requests": requests, "wall_s": wall_s, "cpu_s": cpu_s, **figures}


class Bare:
    """One served model as the service runs it (variant, instances, threads), and its task's work."""

    task = ""
    inputs = 0  # how many distinct inputs the batches cycle through

    def __init__(self, model_dir: Path, settings: ServiceSettings, batch: int = BATCH) -> None:
        spec = read_spec(model_dir)
        if spec is None:
            raise SystemExit(f"{model_dir} is not a served-model directory (run gmlp export)")
        self.spec: ModelSpec = spec
        self.batch = batch
        self.variant = choose_variant(spec.variants, "cpu", settings.variant)
        self.instances = settings.resolved_instances("cpu")
        options = RuntimeOptions("cpu", settings.resolved_threads(self.instances), settings.ort_spinning)
        self.model = OnnxModel(spec.variant_path(self.variant), options, name=spec.name)
        # A graph exported with top-k outputs answers from them, as the service does (the logits
        # never leave the session); an older graph from its logits.
        self.from_top_k = graph_top_k(spec.config, self.model.output_names) >= TOP_K
        self.outputs = sorted(TOP_K_OUTPUTS) if self.from_top_k else ["logits"]

    def bare(self, k: int) -> list[Any]:
        """Batch number `k` of the whole task: the inputs as a request brings them -> answers."""
        raise NotImplementedError

    def raw(self, k: int) -> object:
        """Batch number `k` of `session.run` alone, on inputs prepared once."""
        raise NotImplementedError

    def _wrap(self, items: Sequence[Any], start: int) -> list[Any]:
        """The batch of `items` from `start` on, wrapping around."""
        return [items[(start + i) % len(items)] for i in range(self.batch)]


class BareClassify(Bare):
    """Decode + transform each JPEG, one session run per batch, softmax and top 5 of every row."""

    task = "classify"

    def __init__(
        self, model_dir: Path, settings: ServiceSettings, images: Sequence[bytes], batch: int = BATCH
    ) -> None:
        super().__init__(model_dir, settings, batch)
        self.transform = ImageTransform.for_model(
            self.spec.config, settings.max_image_pixels, settings.jpeg_draft
        )
        self.labels = self.spec.labels()
        self.images = list(images)
        self.inputs = len(self.images)
        self.pixels = np.stack([self.transform(image) for image in self._wrap(self.images, 0)])

    def bare(self, k: int) -> list[Any]:
        pixels = np.stack([self.transform(image) for image in self._wrap(self.images, k * self.batch)])
        out = self.model.run({"pixel_values": pixels}, self.outputs)
        k = min(TOP_K, len(self.labels))
        if not self.from_top_k:
            return ranked_labels(out["logits"], self.labels, k)
        return labelled_rows(out[TOP_K_IDS_OUTPUT][:, :k], out[TOP_K_SCORES_OUTPUT][:, :k], self.labels)

    def raw(self, k: int) -> object:
        return self.model.run({"pixel_values": self.pixels}, self.outputs)


class BareFillMask(Bare):
    """Tokenise each sentence, one session run per batch at its padded length, top 5 per [MASK]."""

    task = "fill-mask"

    def __init__(
        self, model_dir: Path, settings: ServiceSettings, texts: Sequence[str], batch: int = BATCH
    ) -> None:
        super().__init__(model_dir, settings, batch)
        self.codec = FillMaskCodec(
            self.spec.tokenizer_path(), self.spec.model_config, model_name=self.spec.name
        )
        static = any(d is not None for d in self.model.static_dims("input_ids")[1:])
        self.fixed = settings.fixed_length or static
        # The texts that fit the model's window (all of the bundled ones for the demo model).
        self.texts = [t for t in texts if len(self.codec.tokenizer.encode(t).ids) <= self.codec.n]
        if not self.texts:
            raise SystemExit(f"no text fits the {self.codec.n}-token window of {self.spec.name}")
        self.inputs = len(self.texts)
        # Whole batches of the texts in turn, collated once for the raw runs.
        feeds = [self.codec.encode(t).feeds for t in self.texts]
        starts = range(0, max(1, len(feeds) - self.batch + 1), self.batch)
        self.batches = [self.codec.collate(self._wrap(feeds, s), fixed=self.fixed) for s in starts]

    def bare(self, k: int) -> list[Any]:
        encoded = [self.codec.encode(t) for t in self._wrap(self.texts, k * self.batch)]
        feeds = self.codec.collate([e.feeds for e in encoded], fixed=self.fixed)
        out = self.model.run(feeds, self.outputs)
        if not self.from_top_k:
            logits = list(out["logits"])
            return self.codec.decode_batch(encoded, logits, [TOP_K] * len(encoded), [None] * len(encoded))
        ids, scores = out[TOP_K_IDS_OUTPUT], out[TOP_K_SCORES_OUTPUT]
        return [self.codec.decode_top(e, ids[i], scores[i], TOP_K) for i, e in enumerate(encoded)]

    def raw(self, k: int) -> object:
        return self.model.run(self.batches[k % len(self.batches)], self.outputs)


def measure(bare: Bare, seconds: float, rounds: int) -> dict[str, Any]:
    """Rounds of bare then raw (after one untimed batch of each); per round and medians."""
    bare.bare(0)
    bare.raw(0)
    per_round: list[dict[str, Any]] = []
    for rnd in range(rounds):
        b = timed(bare.bare, bare.instances, seconds, bare.batch)
        r = timed(bare.raw, bare.instances, seconds, bare.batch)
        per_round.append({"round": rnd, "bare": b, "raw": r})
    medians = {
        kind: {
            key: statistics.median(p[kind][key] for p in per_round)
            for key in ("requests_per_s", "cpu_ms_per_request")
        }
        for kind in ("bare", "raw")
    }
    return {
        "inputs": bare.inputs,
        "task": bare.task,
        "model": bare.spec.name,
        "variant": bare.variant,
        "instances": bare.instances,
        "intra_op_threads": bare.model.options.intra_op_threads,
        "batch": bare.batch,
        "outputs": bare.outputs,
        "seconds": seconds,
        "rounds": per_round,
        **medians,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = command_line(__doc__)
    parser.add_argument("--task", choices=(*TASKS, "both"), default="both")
    parser.add_argument(
        "--model-dir", type=Path, help="served-model directory (default: models/ demo of the task)"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per timed run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--instances", type=int, help="threads running batches (default: the service's)")
    parser.add_argument(
        "--intra-op-threads", type=int, help="ORT threads per instance (default: the service's)"
    )
    parser.add_argument("--variant", help="model variant (default: the service's choice)")
    parser.add_argument("--all-images", action="store_true", help="classify: all 8 bundled JPEGs in turn")
    parser.add_argument("--batch-size", type=int, default=BATCH, help="requests per batch")
    args = parser.parse_args(argv)
    if args.task == "both" and args.model_dir is not None:
        raise SystemExit("--model-dir needs --task classify or --task fill-mask")
    # The service's settings from the environment, with the command line's overrides.
    overrides = {
        "instances": args.instances,
        "intra_op_threads": args.intra_op_threads,
        "variant": args.variant,
    }
    settings = ServiceSettings(**{k: v for k, v in overrides.items() if v is not None})
    machine = cpu_line(cpu_facts())
    for task in TASKS if args.task == "both" else (args.task,):
        model_dir = args.model_dir or DEFAULT_MODELS[task]
        if task == "classify":
            images, _ = load_images()  # in the peer benchmark's order: its request is the first
            chosen = images if args.all_images else images[:1]
            bare: Bare = BareClassify(model_dir, settings, chosen, args.batch_size)
        else:
            bare = BareFillMask(model_dir, settings, sentences(), args.batch_size)
        result = measure(bare, args.seconds, args.rounds)
        print(json.dumps({"machine": machine, **result}), flush=True)


if __name__ == "__main__":
    main()
