"""/fill-mask through the service: each request at its own length vs every request at n tokens.

    make demo-models            # or: gmlp export checkpoints/gutenberg-gmlp-mlm --out models/...
    .venv/bin/python -m benchmarks.varlen_service --model-repository models [--users 1,8,32] \\
        [--duration 15s] [--rounds 3] [--out report.md]

Starts two `gmlp serve` processes on 127.0.0.1 over the same repository, one with the default
(batches padded to their longest text) and one with `--fixed-length` (every batch at n tokens with
all prediction slots), then runs locust's /fill-mask workload against them in turn, server order
alternating per round, at each user count: the held-out short sentences of
loadtests/data/sentences.tsv, and texts of n - 2 words that fill the whole window. An idle server
uses no CPU (its ORT threads do not spin), so the one being measured has the machine to itself,
less locust. Medians over the rounds; ratios are variable / fixed from the same rounds. The CPU's
model name and flags are printed with the table.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import command_line, cpu_line, gmlp_serve
from contract.formats import MASK_TOKEN
from contract.spec import discover
from contract.text import FillMaskCodec
from loadtests.runner import SweepConfig, parse_users, run_step
from loadtests.workload import BUNDLED_SENTENCES, read_sentences_tsv

SETTINGS = {"variable": [], "fixed": ["--fixed-length"]}


def long_texts(repository: Path, model: str, path: Path, count: int = 50) -> Path:
    """A TSV of texts that fill the model's window (n tokens with [CLS]/[SEP]), one [MASK] each."""
    spec = discover(repository)[model]
    codec = FillMaskCodec(spec.tokenizer_path(), spec.model_config)
    words = [s.text.replace(MASK_TOKEN, "the") for s in read_sentences_tsv(BUNDLED_SENTENCES)]
    pool = " ".join(words).split()
    lines = []
    for i in range(count):
        text = pool[i * 7 : i * 7 + codec.n]
        while len(codec.tokenizer.encode(" ".join(text)).ids) > codec.n:
            text = text[:-1]
        text[len(text) // 2] = MASK_TOKEN
        lines.append(f"{len(codec.tokenizer.encode(' '.join(text)).ids)}\t{' '.join(text)}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def step(url: str, users: int, texts: Path, duration: str, work: Path) -> tuple[float, float, int]:
    env = {
        "GMLP_LOADTEST_CLASSIFY_WEIGHT": "0",
        "GMLP_LOADTEST_FILL_MASK_WEIGHT": "1",
        "GMLP_LOADTEST_TEXT": str(texts),
    }
    result = run_step(SweepConfig(url=url, users=[users], duration=duration, out_dir=work, env=env), users)
    total = result.total
    return (total.rps if total else 0.0), (total.p50_ms if total and total.p50_ms else 0.0), result.failures


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--model-repository", type=Path, default=Path("models"))
    parser.add_argument("--model", default="gutenberg-gmlp-mlm")
    parser.add_argument("--users", type=parse_users, default=[1, 8, 32])
    parser.add_argument(
        "--long-users", type=parse_users, default=[1, 8], help="user counts for full-window texts"
    )
    parser.add_argument("--duration", default="15s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-fill-mask-"))
    workloads = {
        "short": BUNDLED_SENTENCES,
        "full window": long_texts(args.model_repository, args.model, work / "long.tsv"),
    }
    plan = [("short", u) for u in args.users] + [("full window", u) for u in args.long_users]
    results: dict[tuple[str, int, str], list[tuple[float, float, int]]] = {}
    with contextlib.ExitStack() as stack:  # every server started is stopped, even if another fails
        servers = {
            name: stack.enter_context(
                gmlp_serve(args.model_repository, log_path=work / f"server-{name}.log", serve_args=extra)
            )
            for name, extra in SETTINGS.items()
        }
        for rnd in range(args.rounds):
            for workload, users in plan:
                order = list(servers) if rnd % 2 == 0 else list(reversed(servers))
                for name in order:
                    out = work / f"r{rnd}-{workload.replace(' ', '-')}-{users}-{name}"
                    measured = step(servers[name].url, users, workloads[workload], args.duration, out)
                    results.setdefault((workload, users, name), []).append(measured)
                    print(f"round {rnd} {workload} users={users} {name}: {measured}", file=sys.stderr)
    table = report(results, plan, args)
    print(table)
    if args.out:
        args.out.write_text(table, encoding="utf-8")


def report(results: dict[tuple[str, int, str], list[Any]], plan: list[tuple[str, int]], args: Any) -> str:
    lines = [
        f"{cpu_line()}; {args.rounds} rounds of {args.duration}, medians",
        "",
        "| texts | users | variable req/s | fixed req/s | req/s ratio | variable p50 ms | fixed p50 ms "
        "| p50 ratio | failures |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for workload, users in plan:
        var, fix = results[(workload, users, "variable")], results[(workload, users, "fixed")]
        rps_v, rps_f = (statistics.median(r[0] for r in runs) for runs in (var, fix))
        p50_v, p50_f = (statistics.median(r[1] for r in runs) for runs in (var, fix))
        failures = sum(r[2] for r in var + fix)
        lines.append(
            f"| {workload} | {users} | {rps_v:.1f} | {rps_f:.1f} | {rps_v / rps_f:.2f}x | {p50_v:.0f} | "
            f"{p50_f:.0f} | {p50_v / p50_f:.2f} | {failures} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
