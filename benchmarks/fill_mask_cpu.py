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
ratio is the figure to read. Each round also times the bare fill-mask pipeline
(`benchmarks.bare_pipeline`: tokenise, run at the batch's padded length, top 5 per mask, the
same threads), the limit for the service's CPU per request. A benchmark, not a test; prints the
machine's CPU flags with it.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import urllib.request
from pathlib import Path

from benchmarks import wrk
from benchmarks.bare_pipeline import BareFillMask, sentences, timed
from benchmarks.harness import REPO, ServerProcess, command_line, cpu_line, gmlp_serve, link_repository
from benchmarks.proc import tree_cpu_seconds
from service.settings import ServiceSettings

DEFAULT_SERVED = REPO / "models" / "gutenberg-gmlp-mlm"
TOP_K = 5
CONNECTIONS = 32


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


def server(served: Path, work: Path) -> ServerProcess:
    """`gmlp serve` of `served` alone with its default settings (not started yet)."""
    repository = link_repository(work, served)
    return gmlp_serve(
        repository, log_path=work / "server.log", serve_args=["--log-level", "warning"], ready_timeout_s=180
    )


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--served", type=Path, default=DEFAULT_SERVED)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    texts = sentences()
    print(cpu_line())
    bare = BareFillMask(args.served, ServiceSettings(), texts)
    bare.bare(0)
    bare.raw(0)
    service_ms: list[float] = []
    raw_ms: list[float] = []
    bare_ms: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="gmlp-fill-mask-cpu-") as tmp,
        server(args.served, Path(tmp)) as proc,
    ):
        url = proc.url
        check_answer(url + "/fill-mask", texts[0])
        script = Path(tmp) / "fill_mask.lua"
        script.write_text(lua_script(texts))
        wrk.run(url + "/fill-mask", script, CONNECTIONS, 2.0)  # warm-up
        for round_ in range(1, args.rounds + 1):
            raw_ms.append(timed(bare.raw, bare.instances, args.seconds, bare.batch).cpu_ms_per_request)
            bare_ms.append(timed(bare.bare, bare.instances, args.seconds, bare.batch).cpu_ms_per_request)
            cpu0 = tree_cpu_seconds(proc.pid)
            result = wrk.run(url + "/fill-mask", script, CONNECTIONS, args.seconds)
            ms = (tree_cpu_seconds(proc.pid) - cpu0) * 1000.0 / max(1, result.requests)
            service_ms.append(ms)
            print(
                f"round {round_}: service {result.rps:.0f} req/s, {ms:.2f} CPU ms/request "
                f"({result.errors} errors); raw {raw_ms[-1]:.2f}, bare pipeline {bare_ms[-1]:.2f}"
                " CPU ms/sequence"
            )
    ratios = [s / r for s, r in zip(service_ms, raw_ms, strict=True)]
    bare_ratios = [s / b for s, b in zip(service_ms, bare_ms, strict=True)]
    print(
        f"median: service {statistics.median(service_ms):.2f} CPU ms/request, model "
        f"{statistics.median(raw_ms):.2f} CPU ms/sequence, ratio {statistics.median(ratios):.2f} "
        f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)}); bare pipeline "
        f"{statistics.median(bare_ms):.2f} CPU ms/sequence, ratio {statistics.median(bare_ratios):.2f} "
        f"(rounds: {', '.join(f'{r:.2f}' for r in bare_ratios)})"
    )


if __name__ == "__main__":
    main()
