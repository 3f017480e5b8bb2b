"""Load-test tooling: response checks, workload data, CSV/metrics parsing, report; then a real sweep.

The end-to-end tests start the real service (`python -m gmlp serve` as a subprocess on
127.0.0.1 and a free port, serving the tiny exported models) and run `gmlp loadtest` against it.
They assert outcomes (zero failures, files written, user counts and batch sizes reported), never
timings: throughput on a shared CI machine means nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from gmlp.server_process import ServerProcess, gmlp_serve
from loadtests.checks import check_classify, check_fill_mask
from loadtests.report import render_markdown, write_report
from loadtests.runner import (
    StepResult,
    batch_delta,
    batch_stats,
    overall,
    parse_duration,
    parse_metrics,
    parse_users,
    read_failures_csv,
    read_stats_csv,
    rejections_delta,
)
from loadtests.workload import (
    BUNDLED_DIR,
    BUNDLED_SENTENCES,
    LoadConfig,
    estimate_tokens,
    fitting,
    jpeg_body,
    mask_one_word,
    read_sentences_tsv,
    split_sentences,
)
from support.helpers import REPO_ROOT

# -- response checks -------------------------------------------------------------------------------


def _classify_body(scores: list[float]) -> dict:
    return {"model": "m", "predictions": [{"label": f"c{i}", "score": s} for i, s in enumerate(scores)]}


def test_classify_check_accepts_a_good_answer() -> None:
    assert check_classify(_classify_body([0.5, 0.2, 0.1]), top_k=3) is None
    assert check_classify(_classify_body([0.5, 0.2, 0.1]), top_k=3, expected_model="m") is None


@pytest.mark.parametrize(
    ("body", "top_k", "fragment"),
    [
        (_classify_body([0.5, 0.2]), 3, "2 predictions"),
        (_classify_body([0.2, 0.5, 0.1]), 3, "not sorted"),
        (_classify_body([0.5, float("nan"), 0.1]), 3, "finite"),
        (_classify_body([1.5, 0.2, 0.1]), 3, "probability"),
        (_classify_body([0.9, 0.8, 0.1]), 3, "sum"),
        ({"predictions": []}, 3, "missing"),
        ({"model": "m", "predictions": [{"label": "a"}]}, 1, "expected"),
        ([], 1, "JSON object"),
        (
            {"model": "m", "predictions": [{"label": "a", "score": 0.5}, {"label": "a", "score": 0.1}]},
            2,
            "dup",
        ),
    ],
)
def test_classify_check_rejects_wrong_answers(body: object, top_k: int, fragment: str) -> None:
    error = check_classify(body, top_k)
    assert error is not None and fragment in error


def test_classify_check_names_the_wrong_model() -> None:
    error = check_classify(_classify_body([0.5]), top_k=1, expected_model="other")
    assert error is not None and "other" in error


def _mask_list(scores: list[float], sequence: str = "a b c") -> list[dict]:
    return [
        {"score": s, "token": 1000 + i, "token_str": f"t{i}", "sequence": sequence}
        for i, s in enumerate(scores)
    ]


def test_fill_mask_check() -> None:
    one = "the [MASK] sat."
    good = {"model": "mlm", "predictions": [_mask_list([0.4, 0.3])]}
    assert check_fill_mask(good, one, top_k=2) is None
    two = "the [MASK] sat on the [MASK]."
    assert check_fill_mask({"model": "mlm", "predictions": [_mask_list([0.4, 0.3])] * 2}, two, 2) is None
    assert "1 prediction lists for 2" in check_fill_mask(good, two, top_k=2)
    assert "top_k=3" in check_fill_mask(good, one, top_k=3)
    unsorted = {"model": "mlm", "predictions": [_mask_list([0.3, 0.4])]}
    assert "not sorted" in check_fill_mask(unsorted, one, top_k=2)
    unfilled = {"model": "mlm", "predictions": [_mask_list([0.4, 0.3], "the [MASK] sat.")]}
    assert "still holds" in check_fill_mask(unfilled, one, top_k=2)
    bad_token = {"model": "mlm", "predictions": [[{**_mask_list([0.4])[0], "token": "x"}]]}
    assert "vocabulary id" in check_fill_mask(bad_token, one, top_k=1)
    missing = {"model": "mlm", "predictions": [[{"score": 0.4, "token": 1}]]}
    assert "keys" in check_fill_mask(missing, one, top_k=1)


# -- workload --------------------------------------------------------------------------------------


def test_split_and_mask_real_prose() -> None:
    text = (
        'Mr. Bowen was stout and jolly, and his wife agreed with him.\n"Well, well, how do you do?"\n'
        "said the hostess as they arrived at the house.\n\nCHAPTER ONE AND THE NEXT ONE TOO\n\n"
        "[Illustration: a man with a pin in his hand and a hat]"
    )
    sentences = split_sentences(text)
    assert "Mr. Bowen was stout and jolly, and his wife agreed with him." in sentences
    assert not any("CHAPTER" in s or "Illustration" in s for s in sentences)
    rng = random.Random(0)
    for sentence in sentences:
        masked = mask_one_word(sentence, rng)
        assert masked is not None and masked.count("[MASK]") == 1
        assert len(masked.split()) == len(sentence.split())


def test_token_estimate_is_pessimistic_on_the_bundled_sentences() -> None:
    sentences = read_sentences_tsv(BUNDLED_SENTENCES)
    assert len(sentences) >= 100
    assert all(s.text.count("[MASK]") == 1 for s in sentences)
    under = sum(estimate_tokens(s.text) < s.n_tokens for s in sentences)
    assert under <= len(sentences) // 50
    assert all(s.n_tokens <= 32 for s in fitting(sentences, 32)) and fitting(sentences, 32)


def test_bundled_images_are_jpegs() -> None:
    images = sorted(BUNDLED_DIR.glob("*.jpg"))
    assert len(images) == 8
    assert all(p.read_bytes()[:3] == b"\xff\xd8\xff" for p in images)


def test_load_config_from_env() -> None:
    config = LoadConfig.from_env({"GMLP_LOADTEST_CLASSIFY_WEIGHT": "3", "GMLP_LOADTEST_UPLOAD": "raw"})
    assert (config.classify_weight, config.fill_mask_weight, config.upload) == (3, 1, "raw")
    with pytest.raises(ValueError, match="both 0"):
        LoadConfig.from_env({"GMLP_LOADTEST_CLASSIFY_WEIGHT": "0", "GMLP_LOADTEST_FILL_MASK_WEIGHT": "0"})
    with pytest.raises(ValueError, match="UPLOAD"):
        LoadConfig.from_env({"GMLP_LOADTEST_UPLOAD": "carrier-pigeon"})


def test_jpeg_body_parses_as_form_data() -> None:
    from email.parser import BytesParser

    assert jpeg_body(b"\xff\xd8\xffdata", multipart=False) == (b"\xff\xd8\xffdata", "image/jpeg")
    body, content_type = jpeg_body(b"\xff\xd8\xffdata", multipart=True)
    message = BytesParser().parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    (part,) = message.get_payload()
    assert part.get_param("name", header="content-disposition") == "file"
    assert part.get_content_type() == "image/jpeg"
    assert part.get_payload(decode=True) == b"\xff\xd8\xffdata"


# -- runner and metrics parsing --------------------------------------------------------------------


def test_parse_duration_and_users() -> None:
    assert parse_duration("30s") == 30 and parse_duration("2m") == 120 and parse_duration("1m30s") == 90
    assert parse_duration("45") == 45
    for bad in ("", "abc", "5x", "0s"):
        with pytest.raises(ValueError, match="invalid duration"):
            parse_duration(bad)
    assert parse_users("1,4, 16,64") == [1, 4, 16, 64]
    for bad in ("", "0", "a,b"):
        with pytest.raises(ValueError, match="invalid --users"):
            parse_users(bad)


_STATS_CSV = """Type,Name,Request Count,Failure Count,Median Response Time,Average Response Time,\
Min Response Time,Max Response Time,Average Content Size,Requests/s,Failures/s,50%,66%,75%,80%,90%,95%,\
98%,99%,99.9%,99.99%,100%
POST,/classify,287,2,15,15.7,2.7,52.6,270.7,95.7,0.0,15,17,19,21,26,30,40,50,53,53,53
POST,/fill-mask,0,0,0,0,0,0,0,0.0,0.0,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A
,Aggregated,287,2,19,21.0,2.7,68.6,519.4,185.4,0.0,19,23,26,28,38,43,52,57,69,69,69
"""


def test_read_locust_csvs(tmp_path: Path) -> None:
    (tmp_path / "s_stats.csv").write_text(_STATS_CSV)
    rows = read_stats_csv(tmp_path / "s_stats.csv")
    assert rows["Aggregated"]["rps"] == pytest.approx(185.4) and rows["Aggregated"]["p95_ms"] == 43
    assert rows["/classify"]["failures"] == 2 and rows["/fill-mask"]["p99_ms"] is None
    (tmp_path / "s_failures.csv").write_text(
        "Method,Name,Error,Occurrences\nPOST,/classify,x,1\nPOST,/classify,y,5\n"
    )
    assert [f["error"] for f in read_failures_csv(tmp_path / "s_failures.csv")] == ["y", "x"]
    assert read_failures_csv(tmp_path / "missing.csv") == []
    (tmp_path / "s_exceptions.csv").write_text("Count,Message,Traceback,Nodes\n3,boom,tb,local\n")
    assert read_failures_csv(tmp_path / "s_exceptions.csv") == [
        {"method": "exception", "name": "locustfile", "error": "boom", "occurrences": 3}
    ]


def _metrics_text(batches: dict[str, tuple[float, float]], rejected: float = 0.0) -> str:
    lines = ["# HELP gmlp_batch_size requests per executed batch", "# TYPE gmlp_batch_size histogram"]
    for model, (total, count) in batches.items():
        lines += [
            f'gmlp_batch_size_bucket{{le="+Inf",model="{model}"}} {count}',
            f'gmlp_batch_size_count{{model="{model}"}} {count}',
            f'gmlp_batch_size_sum{{model="{model}"}} {total}',
        ]
    lines += [
        "# HELP gmlp_rejections requests refused",
        "# TYPE gmlp_rejections counter",
        f'gmlp_rejections_total{{model="v",reason="queue_full"}} {rejected}',
    ]
    return "\n".join(lines) + "\n"


def test_batch_size_delta_from_prometheus_text() -> None:
    before = parse_metrics(_metrics_text({"v": (2.0, 2.0), "m": (1.0, 1.0)}))
    after = parse_metrics(_metrics_text({"v": (102.0, 27.0), "m": (1.0, 1.0)}, rejected=3.0))
    delta = batch_delta(before, after)
    assert delta == {"v": batch_stats(25, 100)}  # "m" had no batches: left out
    assert delta["v"]["mean"] == 4.0
    assert overall(delta.values())["mean"] == 4.0 and overall([])["mean"] is None
    assert rejections_delta(before, after) == {"v/queue_full": 3}


# -- report rendering ------------------------------------------------------------------------------


def test_report_renders_without_a_server(tmp_path: Path) -> None:
    rows = read_stats_csv(_write(tmp_path / "s_stats.csv", _STATS_CSV))
    total = rows.pop("Aggregated")
    steps = [
        StepResult(users=u, duration_s=5, total=total, endpoints=rows, batch_size_all=batch_stats(10, 25))
        for u in (1, 8)
    ]
    steps.append(StepResult(users=64, duration_s=5, total=None, error="locust did not finish"))
    results = {
        "schema": "x",
        "url": "http://127.0.0.1:1",
        "started": "s",
        "finished": "f",
        "workload": {"duration": "5s", "classify_weight": 1, "fill_mask_weight": 1},
        "server_models": [],
        "steps": [s.to_json() for s in steps],
        "total_failures": sum(s.failures for s in steps),
    }
    md = render_markdown(results)
    assert "| 8 | 287 | 185.4 | 19 | 43 | 57 | 2 | 2.50 |" in md
    assert "locust did not finish" in md and results["total_failures"] == 5
    paths = write_report(tmp_path / "out", results)
    assert paths["png"].read_bytes()[:4] == b"\x89PNG"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_gmlp_cli_has_the_loadtest_command_and_no_benchmarks() -> None:
    from gmlp.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["loadtest", "--users", "2,4", "--duration", "8s"])
    assert args.users == "2,4" and callable(args.handler)
    # Benchmarks are programs of the checkout (python -m benchmarks.NAME), not commands of the wheel.
    (commands,) = (a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert "loadtest" in commands and not {"bench", "loadtest-compare"} & set(commands)


# -- end to end against the real service -----------------------------------------------------------


@pytest.fixture(scope="module")
def live_server(model_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`python -m gmlp serve` on 127.0.0.1, a free port, the tiny models; stopped at teardown."""
    log_path = tmp_path_factory.mktemp("loadtest-server") / "server.log"
    server = gmlp_serve(
        model_repository,
        log_path=log_path,
        serve_args=["--intra-op-threads", "1", "--max-batch-size", "8"],
        ready_timeout_s=60,
    )
    with server:
        yield server


def _gmlp_loadtest(url: str, out: Path, *extra: str, env: dict[str, str] | None = None) -> CompletedProcess:
    relative_out = os.path.relpath(out, REPO_ROOT)  # as users type it; locust runs in each step's folder
    return subprocess.run(
        [sys.executable, "-m", "gmlp", "loadtest", "--url", url, "--out", relative_out, *extra],
        cwd=REPO_ROOT,
        # The caller's own GMLP_LOADTEST_* settings must not change what is tested.
        env={**{k: v for k, v in os.environ.items() if not k.startswith("GMLP_LOADTEST_")}, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_loadtest_sweep_against_the_real_service(live_server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = _gmlp_loadtest(live_server.url, out, "--users", "2,4", "--duration", "8s")
    assert result.returncode == 0, result.stdout + result.stderr + live_server.log_tail()

    results = json.loads((out / "results.json").read_text())
    assert [s["users"] for s in results["steps"]] == [2, 4]
    assert results["total_failures"] == 0
    for step in results["steps"]:
        assert step["error"] is None and step["failures"] == 0
        assert step["total"]["requests"] > 0
        assert set(step["endpoints"]) == {"/classify", "/fill-mask"}
        assert all(e["requests"] > 0 and e["failures"] == 0 for e in step["endpoints"].values())
        assert set(step["batch_size"]) == {"tiny-vision", "tiny-mlm"}
        mean = step["batch_size_all"]["mean"]
        assert mean is not None and 1.0 <= mean <= 8.0 and math.isfinite(mean)
        assert (out / step["files"]["stats_csv"]).is_file() and (out / step["files"]["html"]).is_file()

    md = (out / "report.md").read_text()
    assert "| 2 |" in md and "| 4 |" in md and "avg batch size" in md
    assert f"{results['steps'][0]['batch_size_all']['mean']:.2f}" in md
    assert (out / "report.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_wrong_answers_fail_the_run(live_server: ServerProcess, tmp_path: Path) -> None:
    """top_k=20 > the 10 labels of the tiny classifier: every /classify is a 422, so the run fails."""
    out = tmp_path / "report"
    env = {"GMLP_LOADTEST_TOP_K": "20", "GMLP_LOADTEST_FILL_MASK_WEIGHT": "0"}
    result = _gmlp_loadtest(live_server.url, out, "--users", "1", "--duration", "2s", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["total_failures"] > 0
    assert "invalid_top_k" in results["steps"][0]["failure_messages"][0]["error"]
    assert "failed requests" in result.stderr


@pytest.mark.slow
def test_a_named_missing_model_counts_its_refusals(live_server: ServerProcess, tmp_path: Path) -> None:
    """A fill-mask model asked for by name but not served is still sent to (its 404s are the
    failures), while /classify, in both upload forms, answers well."""
    out = tmp_path / "report"
    env = {"GMLP_LOADTEST_FILL_MASK_MODEL": "nope", "GMLP_LOADTEST_UPLOAD": "mixed"}
    result = _gmlp_loadtest(live_server.url, out, "--users", "2", "--duration", "2s", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    step = json.loads((out / "results.json").read_text())["steps"][0]
    assert step["endpoints"]["/classify"]["requests"] > 0 and step["endpoints"]["/classify"]["failures"] == 0
    assert step["endpoints"]["/fill-mask"]["failures"] == step["endpoints"]["/fill-mask"]["requests"] > 0
    (failure,) = step["failure_messages"]  # one row: every refusal has the same code
    assert failure["name"] == "/fill-mask" and "HTTP 404 model_not_found" in failure["error"]
