"""Traffic and per-replica counts for the live Swarm test (scripts/swarm-test.sh).

`load`: a small, bounded load through the load balancer. Workers alternate POST /classify (a
CIFAR-10 test JPEG) and POST /fill-mask (a masked sentence), each on its own keep-alive
connection, and check every answer: status 200 and the documented response schema. A request
fails when it gets another status, a malformed body, or no answer (refused, reset, timed out).
It stops at the first of --duration, --max-requests, or the --stop-file appearing, and writes
the totals and the first failures as JSON.

`replicas`: per replica, the POST requests it answered with 200 and the batches it ran (count
and requests in them), read from the replica's own /metrics inside its container (`docker exec`),
so the figures are the replica's, not the balancer's. Counters are cumulative: compare two calls.
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from loadtests.checks import check_classify, check_fill_mask

ROOT = Path(__file__).resolve().parents[1]
IMAGE = ROOT / "loadtests" / "data" / "cifar10-test-03000-cat.jpg"
TEXT = "the cat sat on the [MASK]."
TOP_K = 3
KEPT_FAILURES = 50


def _classify_request(image: bytes) -> tuple[str, bytes, dict[str, str]]:
    boundary = uuid.uuid4().hex
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="cat.jpg"\r\n'
            "Content-Type: image/jpeg\r\n\r\n"
        ).encode()
        + image
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return f"/classify?top_k={TOP_K}", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def _fill_mask_request() -> tuple[str, bytes, dict[str, str]]:
    body = json.dumps({"text": TEXT, "top_k": TOP_K}).encode()
    return "/fill-mask", body, {"Content-Type": "application/json"}


class Load:
    """Worker threads sharing counters; `run` returns the summary."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        url = urlsplit(args.url)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        image = IMAGE.read_bytes()
        self.requests = [
            (*_classify_request(image), lambda b: check_classify(b, TOP_K)),
            (*_fill_mask_request(), lambda b: check_fill_mask(b, TEXT, TOP_K)),
        ]
        self.lock = threading.Lock()
        self.sent = 0
        self.outcomes: Counter[str] = Counter()
        self.failures: list[dict[str, object]] = []
        self.latencies: list[float] = []
        self.start = time.monotonic()
        self.deadline = self.start + args.duration

    def _claim(self) -> bool:
        """Reserve one request of the budget; False once any stop condition holds."""
        with self.lock:
            stop_file = self.args.stop_file and Path(self.args.stop_file).exists()
            if stop_file or time.monotonic() >= self.deadline or self.sent >= self.args.max_requests:
                return False
            self.sent += 1
            return True

    def _record(self, path: str, error: str | None, seconds: float) -> None:
        with self.lock:
            self.outcomes["ok" if error is None else "failed"] += 1
            if error is None:
                self.latencies.append(seconds)
            if error is not None and len(self.failures) < KEPT_FAILURES:
                at = round(time.monotonic() - self.start, 2)
                self.failures.append({"t_s": at, "path": path, "error": error})

    def _one(self, conn: http.client.HTTPConnection, i: int) -> str | None:
        path, body, headers, check = self.requests[i % len(self.requests)]
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            return f"HTTP {response.status}: {data[:200].decode(errors='replace')}"
        return check(json.loads(data))

    def _worker(self, offset: int) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.args.timeout)
        i = offset
        while self._claim():
            path = self.requests[i % len(self.requests)][0]
            began = time.perf_counter()
            try:
                error = self._one(conn, i)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                error = f"{type(exc).__name__}: {exc}"
                conn.close()  # the next request opens a fresh connection
            self._record(path, error, time.perf_counter() - began)
            i += 1
            time.sleep(self.args.pause)
        conn.close()

    def run(self) -> dict[str, object]:
        threads = [threading.Thread(target=self._worker, args=(w,)) for w in range(self.args.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - self.start
        latencies = sorted(self.latencies) or [float("nan")]
        quantile_ms = {
            f"p{q}_ms": round(1000 * latencies[min(len(latencies) - 1, int(q / 100 * len(latencies)))], 1)
            for q in (50, 95, 99)
        }
        return {
            "requests": self.outcomes["ok"] + self.outcomes["failed"],
            "ok": self.outcomes["ok"],
            "failed": self.outcomes["failed"],
            "seconds": round(elapsed, 1),
            "ok_per_s": round(self.outcomes["ok"] / elapsed, 1),
            **quantile_ms,
            "failures": self.failures,
        }


def replica_counts(containers: list[str]) -> dict[str, dict[str, float]]:
    """Per container: POSTs answered 200 (`posts`), batches run and the requests in them."""
    from prometheus_client.parser import text_string_to_metric_families

    scrape = (
        "import urllib.request as u; "
        "print(u.urlopen('http://127.0.0.1:8000/metrics', timeout=5).read().decode())"
    )
    counts = {}
    for container in containers:
        text = subprocess.run(
            ["docker", "exec", container, "python", "-c", scrape],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        totals = Counter()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if sample.name == "gmlp_http_requests_total":
                    if labels.get("method") == "POST" and labels.get("status") == "200":
                        totals["posts"] += sample.value
                elif sample.name == "gmlp_batch_size_count":
                    totals["batches"] += sample.value
                elif sample.name == "gmlp_batch_size_sum":
                    totals["batched_requests"] += sample.value
        counts[container] = {key: totals[key] for key in ("posts", "batches", "batched_requests")}
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    load = sub.add_parser("load", help="bounded load through the load balancer")
    load.add_argument("--url", default="http://127.0.0.1:8000")
    load.add_argument("--workers", type=int, default=4)
    load.add_argument("--duration", type=float, default=60.0, help="seconds at most")
    load.add_argument("--max-requests", type=int, default=5000, help="requests at most")
    load.add_argument("--pause", type=float, default=0.02, help="seconds between a worker's requests")
    load.add_argument("--timeout", type=float, default=40.0, help="seconds per request")
    load.add_argument("--stop-file", help="stop as soon as this file exists")
    load.add_argument("--out", required=True, help="JSON summary")
    replicas = sub.add_parser("replicas", help="POSTs answered and batches run by each replica container")
    replicas.add_argument("containers", nargs="+")
    args = parser.parse_args(argv)

    if args.command == "replicas":
        print(json.dumps(replica_counts(args.containers)))
        return 0
    summary = Load(args).run()
    Path(args.out).write_text(json.dumps(summary, indent=2))
    print(
        f"{summary['requests']} requests in {summary['seconds']} s: {summary['failed']} failed; "
        f"{summary['ok_per_s']}/s, p50 {summary['p50_ms']} ms, p99 {summary['p99_ms']} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
