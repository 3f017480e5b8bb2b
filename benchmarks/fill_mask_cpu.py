"""Fill-mask CPU per request through the service against the model's own CPU per sequence.

    .venv/bin/python -m benchmarks.fill_mask_cpu --served models/gutenberg-gmlp-mlm [--rounds 3]

The 200 masked sentences of `loadtests/data/sentences.tsv` (Project Gutenberg) are sent in turn
to `POST /fill-mask` (top 5) by wrk, 32 connections, for `--seconds` per round; the server's CPU
(user + system of its process tree, from /proc) is divided by the requests served. The model's
own figure is raw `session.run` of the same served file on the same sentences, encoded and padded
by the product's own codec, in batches of 16, from as many threads as the server has execution
instances, each with the server's intra-op threads (the server's defaults on this machine): CPU
per sequence from getrusage. Rounds alternate the two. What the service adds per request is HTTP,
JSON, tokenising and the post-processing (scores over the vocabulary, top-k, decoding); the
ratio is the figure to read. A benchmark, not a test; prints the machine's CPU flags with it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.peers import wrk
from benchmarks.peers.proc import tree_cpu_seconds
from benchmarks.peers.raw_ort import run_concurrently
from benchmarks.peers.run import machine
from benchmarks.peers.server import free_port, link_repository
from contract.spec import read_spec
from contract.text import FillMaskCodec
from service.runtime import OnnxModel, RuntimeOptions, choose_variant
from service.settings import ServiceSettings

REPO = Path(__file__).resolve().parents[1]
SENTENCES = REPO / "loadtests" / "data" / "sentences.tsv"
DEFAULT_SERVED = REPO / "models" / "gutenberg-gmlp-mlm"
BATCH = 16
TOP_K = 5
CONNECTIONS = 32


def sentences() -> list[str]:
    lines = SENTENCES.read_text().splitlines()
    return [line.split("\t", 1)[1] for line in lines if line and not line.startswith("#")]


class RawModel:
    """The served file as the server runs it (its default instances and threads), with the
    sentences encoded and padded by the product's codec into batches of 16, prepared once."""

    def __init__(self, served: Path, texts: list[str]) -> None:
        spec = read_spec(served)
        assert spec is not None, f"{served} is not a served-model directory"
        settings = ServiceSettings()
        self.instances = settings.resolved_instances("cpu")
        options = RuntimeOptions("cpu", settings.resolved_threads(self.instances), settings.ort_spinning)
        self.model = OnnxModel(spec.variant_path(choose_variant(spec.variants, "cpu", None)), options)
        codec = FillMaskCodec(spec.tokenizer_path(), spec.model_config, model_name=spec.name)
        feeds = [codec.encode(text).feeds for text in texts]
        self.batches = [codec.collate(feeds[i : i + BATCH]) for i in range(0, len(feeds) - BATCH + 1, BATCH)]
        self.model.run(self.batches[0])  # warm

    def cpu_ms_per_sequence(self, seconds: float) -> float:
        """CPU ms per sequence of session.run at batch 16, the batches in turn."""
        runs = run_concurrently(
            lambda k: self.model.run(self.batches[k % len(self.batches)]), self.instances, seconds
        )
        return runs.cpu_s * 1000.0 / (runs.calls * BATCH)


def lua_script(texts: list[str]) -> str:
    """wrk script: POST /fill-mask with each sentence in turn."""
    bodies = ",\n".join(f"[==[{json.dumps({'text': t, 'top_k': TOP_K})}]==]" for t in texts)
    return (
        f"local bodies = {{\n{bodies}\n}}\n"
        "local i = 0\n"
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        "request = function()\n"
        "  i = i % #bodies + 1\n"
        '  return wrk.format(nil, "/fill-mask", nil, bodies[i])\n'
        "end\n"
    )


def _post(url: str, text: str) -> dict:
    body = json.dumps({"text": text, "top_k": TOP_K}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def check_answer(url: str, text: str) -> None:
    """A real answer of top_k predictions before anything is timed."""
    answer = _post(url, text)
    assert len(answer["predictions"][0]) == TOP_K, answer


def start_server(served: Path, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    repository = link_repository(work, served)
    port = free_port()
    cmd = [str(REPO / ".venv" / "bin" / "gmlp"), "serve", "--model-repository", str(repository)]
    cmd += ["--checkpoint-dir", "", "--grpc-port", "0", "--port", str(port), "--log-level", "warning"]
    with (work / "server.log").open("wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health/ready", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    proc.wait(10)
    raise SystemExit(f"the server did not become ready; see {work / 'server.log'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--served", type=Path, default=DEFAULT_SERVED)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    texts = sentences()
    info = machine()
    print(f"CPU: {info.get('cpu')}, {info.get('cpus')} vCPUs; SIMD: {info.get('simd')}")
    raw = RawModel(args.served, texts)
    service_ms: list[float] = []
    raw_ms: list[float] = []
    with tempfile.TemporaryDirectory(prefix="gmlp-fill-mask-cpu-") as tmp:
        proc, url = start_server(args.served, Path(tmp))
        try:
            check_answer(url + "/fill-mask", texts[0])
            script = Path(tmp) / "fill_mask.lua"
            script.write_text(lua_script(texts))
            wrk.run(url + "/fill-mask", script, CONNECTIONS, 2.0)  # warm-up
            for round_ in range(1, args.rounds + 1):
                raw_ms.append(raw.cpu_ms_per_sequence(args.seconds))
                cpu0 = tree_cpu_seconds(proc.pid)
                result = wrk.run(url + "/fill-mask", script, CONNECTIONS, args.seconds)
                ms = (tree_cpu_seconds(proc.pid) - cpu0) * 1000.0 / max(1, result.requests)
                service_ms.append(ms)
                print(
                    f"round {round_}: service {result.rps:.0f} req/s, {ms:.2f} CPU ms/request "
                    f"({result.errors} errors); raw {raw_ms[-1]:.2f} CPU ms/sequence"
                )
        finally:
            proc.terminate()
            proc.wait(30)
    ratios = [s / r for s, r in zip(service_ms, raw_ms, strict=True)]
    print(
        f"median: service {statistics.median(service_ms):.2f} CPU ms/request, model "
        f"{statistics.median(raw_ms):.2f} CPU ms/sequence, ratio {statistics.median(ratios):.2f} "
        f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})"
    )


if __name__ == "__main__":
    main()
