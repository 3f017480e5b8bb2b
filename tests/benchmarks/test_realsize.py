"""The real-size benchmark: one short run on the tiny classifier whose every row is there and well
formed (its MAC count is `contract.work`'s, tested in tests/contract/test_work.py). Its figures are
never checked (a benchmark, not a test)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from benchmarks import realsize

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None


def test_a_short_run_reports_every_row(tiny_vision_served, capsys: pytest.CaptureFixture[str]) -> None:
    realsize.main(
        ["--model-dir", str(tiny_vision_served), "--rounds", "1", "--seconds", "0.2", "--clients", "1"]
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [next(iter(line)) for line in lines] == ["machine", "precisions", "round", "medians"]
    graphs = ["fp32", "int8", *(["openvino", "openvino_int8"] if HAS_OPENVINO else [])]
    precisions, top1 = lines[1]["precisions"], lines[1]["top1_vs_ort_fp32"]
    assert list(precisions) == graphs and precisions["int8"] == "int8"
    assert precisions.get("openvino_int8", "int8") == "int8"
    assert precisions.get("openvino") in {None, "fp32", "bf16"}
    assert top1["photos"] == 256 and set(top1) == {"photos", *graphs[1:]}
    assert all(0.0 <= top1[graph] <= 1.0 for graph in graphs[1:])
    medians = lines[3]["medians"]
    for graph in graphs:
        assert medians[f"raw_{graph}_b8_img_s"] > 0 and medians[f"achieved_{graph}_b8_g"] > 0
    servers = ["served", "served_lone_off", *(["served_openvino"] if HAS_OPENVINO else [])]
    for server in servers:
        assert medians[f"{server}_c1_failed"] == 0 and medians[f"{server}_c1_rps"] > 0
        assert f"{server}_c1_over_raw_int8_b1" in medians
    assert not any(key.startswith("served_openvino") for key in medians) or HAS_OPENVINO
    assert {"peak_fp32_g", "peak_int8_g"} <= set(medians)
