"""`gmlp tune` on the tiny models: the real server started per candidate, loaded by the closed-loop
client; the env file it writes is read back by `ServiceSettings`, the report lists every candidate
measured, and the chosen one met the SLO in the tool's own measurement."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gmlp.cli import main
from gmlp.tune.space import Candidate, Measured, Space, coordinate_descent, parse_values
from service.settings import ServiceSettings

# Generous: the machine running the tests is shared; what is checked is the tool's own verdict.
SLO_MS = 20_000.0
SMALL = ("--seconds", "0.5", "--warmup", "0.2", "--concurrency", "1,2")


def _tune(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["tune", *args])
    return code, capsys.readouterr().out


def _check_outputs(out_dir: Path, printed: str) -> dict[str, Any]:
    document = json.loads((out_dir / "results.json").read_text())
    measured = re.findall(r"^\[(\d+)\] (.+?) \(", printed, flags=re.M)
    assert len(document["candidates"]) == len(measured) >= 1
    report = (out_dir / "report.md").read_text()
    for entry, (_, label) in zip(document["candidates"], measured, strict=True):
        assert entry["label"] == label
        assert f"| {entry['label']} |" in report
        assert entry["error"] is None, entry["error"]
    chosen = document["chosen"]
    assert chosen is not None
    best = chosen["best_level"]
    assert best["failures"] == 0 and best["requests"] > 0 and best["p99_ms"] <= document["slo_p99_ms"]
    # The highest throughput among the candidates that met the SLO.
    met = [c["best_level"]["rps"] for c in document["candidates"] if c["met_slo"]]
    assert best["rps"] == max(met)
    settings = ServiceSettings(_env_file=out_dir / "tuned.env")  # type: ignore[call-arg]
    for name, value in chosen["settings"].items():
        assert getattr(settings, name) == value, name
    assert (out_dir / "report.png").stat().st_size > 0
    return document


@pytest.mark.slow
def test_the_search_writes_settings_the_service_reads(
    tmp_path: Path, model_repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tune"
    code, printed = _tune(
        capsys,
        *("--model-repository", str(model_repository), "--model", "tiny-vision"),
        *("--slo-p99-ms", str(SLO_MS), "--budget-minutes", "1", "--out", str(out), *SMALL),
        *("--variant", "int8,fp32", "--workers", "1,2", "--instances", "1", "--intra-op-threads", "1"),
        *("--max-batch-size", "4,8", "--max-queue-delay-ms", "2", "--queue-delay-policy", "arriving"),
    )
    assert code == 0, printed
    document = _check_outputs(out, printed)
    assert document["mode"] == "coordinate descent"
    assert {entry["settings"]["workers"] for entry in document["candidates"]} == {1, 2}
    # What the server reported running is what the candidate asked for.
    for entry in document["candidates"]:
        assert entry["served"]["variant"] == entry["settings"]["variant"]
        assert entry["served"]["instances"] == entry["settings"]["instances"]
        lone = entry["settings"]["lone_threads"]  # used where above an instance's threads
        assert entry["served"]["lone_threads"] == (
            lone if lone > entry["settings"]["intra_op_threads"] else 0
        )


@pytest.mark.slow
def test_the_grid_measures_every_combination(
    tmp_path: Path, model_repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "grid"
    code, printed = _tune(
        capsys,
        *("--model-repository", str(model_repository), "--model", "tiny-mlm", "--grid"),
        *("--slo-p99-ms", str(SLO_MS), "--out", str(out), *SMALL),
        *("--variant", "int8", "--workers", "1", "--instances", "1", "--intra-op-threads", "1"),
        *("--max-batch-size", "4,8", "--max-queue-delay-ms", "0", "--queue-delay-policy", "arriving"),
        # Every knob pinned but one: the backend's default adds OpenVINO on a bf16 CPU where it is installed.
        *("--backend", "onnxruntime", "--lone-threads", "0"),
    )
    assert code == 0, printed
    document = _check_outputs(out, printed)
    labels = {c["label"] for c in document["candidates"]}
    assert document["grid_size"] == 2
    assert {"int8 1w1x1t b4 0ms arriving", "int8 1w1x1t b8 0ms arriving"} <= labels


def test_no_candidate_meeting_the_slo_writes_no_env_file(tmp_path: Path, model_repository: Path) -> None:
    """An SLO nobody can meet: the report says so, no env file (an old one is removed), exit 1."""
    out = tmp_path / "tune"
    out.mkdir()
    (out / "tuned.env").write_text("GMLP_INSTANCES=3\n")
    code = main(
        [
            "tune",
            *("--model-repository", str(model_repository), "--model", "tiny-vision"),
            *("--slo-p99-ms", "0.001", "--out", str(out), *SMALL, "--concurrency", "1"),
            *("--variant", "int8", "--workers", "1", "--instances", "1", "--intra-op-threads", "1"),
            *("--max-batch-size", "4", "--max-queue-delay-ms", "0", "--queue-delay-policy", "arriving"),
            *("--budget-minutes", "0.01"),
        ]
    )
    assert code == 1
    assert not (out / "tuned.env").exists()
    assert "No candidate met the SLO" in (out / "report.md").read_text()


def test_every_knob_is_a_setting_the_service_accepts() -> None:
    candidate = Candidate("fp32", 2, 2, 1, 8, 0.5, "always", lone_threads=2)
    env = dict(line.split("=", 1) for line in candidate.env_lines())
    settings = ServiceSettings(**{k.removeprefix("GMLP_").lower(): v for k, v in env.items()})
    assert settings.model_dump(include=set(candidate.settings())) == candidate.settings()
    flags = candidate.flags()
    assert flags[flags.index("--max-queue-delay-ms") + 1] == "0.5"


@pytest.mark.parametrize(
    ("knob", "text"),
    [
        ("instances", "0,2"),
        ("workers", "1,x"),
        ("max_batch_size", "x"),
        ("queue_delay_policy", "sometimes"),
        ("variant", ","),
        ("backend", "onnxruntime,tensorrt"),
        ("lone_threads", "0,-1"),
    ],
)
def test_bad_knob_values_are_refused(knob: str, text: str) -> None:
    from contract.errors import UserError

    with pytest.raises(UserError, match=knob.replace("_", "-")):
        parse_values(knob, text)


def test_descent_reaches_the_best_of_a_separable_score_with_fewer_measurements() -> None:
    """On a score whose best is known (each knob has one best value, independently of the others),
    coordinate descent ends there, measuring fewer candidates than the grid holds."""
    space = Space(
        {
            "variant": ("fp32", "int8"),
            "workers": (1, 2),
            "instances": (1, 2, 4),
            "intra_op_threads": (1, 2),
            "max_batch_size": (4, 8, 16, 32),
            "max_queue_delay_ms": (0.0, 2.0, 5.0),
            "queue_delay_policy": ("arriving", "always"),
            "backend": ("onnxruntime", "openvino"),
            "lone_threads": (0, 4),
        },
        cpus=4,
    )
    best = {"variant": "int8", "workers": 2, "instances": 2, "intra_op_threads": 1, "max_batch_size": 16}
    best |= {
        "max_queue_delay_ms": 2.0,
        "queue_delay_policy": "always",
        "backend": "openvino",
        "lone_threads": 4,
    }

    def measure(c: Candidate) -> Measured:
        misses = sum(getattr(c, k) != v for k, v in best.items())
        level = {"concurrency": 8, "requests": 100, "failures": 0, "rps": 100.0 - 10 * misses}
        return Measured(c, levels=[level | {"p99_ms": 10.0}])

    start = Candidate("fp32", 1, 1, 1, 4, 0.0, "arriving")
    walked = list(coordinate_descent(space, start, measure, slo_p99_ms=50.0))
    top = max(walked, key=lambda m: m.rank(50.0))
    assert top.candidate.settings() == best
    assert len({m.candidate for m in walked}) == len(walked) < len(space.grid())


def test_descent_skips_a_knob_whose_values_do_not_fit_beside_the_centre() -> None:
    """A start outside the values given (2 instances x 1 thread, the service's default split) with
    threads pinned to 2 on 2 CPUs: no thread value fits beside 2 instances, so the descent moves
    on to the next knob instead of failing, and measures nothing over the CPUs. (`gmlp tune` itself
    starts from the values given, where the defaults are not among them.)"""
    values: dict[str, tuple[Any, ...]] = {
        "variant": ("int8",),
        "workers": (1,),
        "instances": (1, 2),
        "intra_op_threads": (2,),
        "max_batch_size": (8,),
        "max_queue_delay_ms": (2.0,),
        "queue_delay_policy": ("arriving",),
        "backend": ("onnxruntime",),
        "lone_threads": (0,),
    }
    space = Space(values, cpus=2)

    def measure(c: Candidate) -> Measured:
        level = {"concurrency": 1, "requests": 10, "failures": 0, "rps": 10.0 * c.intra_op_threads}
        return Measured(c, levels=[level | {"p99_ms": 1.0}])

    walked = list(coordinate_descent(space, Candidate("int8", 1, 2, 1, 8, 2.0, "arriving"), measure, 50.0))
    assert [(m.candidate.instances, m.candidate.intra_op_threads) for m in walked] == [(2, 1), (1, 1)]
