"""The repository poller's supervisor: a loop that fails (a bug, not a directory: directories cannot
make the scan raise) is restarted after one interval and counted, keeps scanning afterwards, and
stops when shutdown cancels it. And the scan report: each problem logged once, all of them counted."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from contract.repository import VersionPolicy
from contract.scan import ModelSource, VersionSource
from service.engine.runtime import Abandon
from service.lifecycle.poller import RepositoryPoller, ScanReport
from service.lifecycle.versions import VersionTable
from service.telemetry.metrics import LifecycleMetrics, ServiceMetrics


def _unloadable(source: VersionSource, abandon: Abandon) -> object:
    raise AssertionError("nothing is loaded here")


def test_a_failing_poll_loop_is_restarted_and_counted(tmp_path: Path) -> None:
    metrics = ServiceMetrics(8)
    scans: list[int] = []

    def scanner(repository: Path) -> dict[str, ModelSource]:
        scans.append(1)
        if len(scans) <= 2:
            raise RuntimeError("a bug in the scan")
        return {}

    async def run() -> None:
        table: VersionTable = VersionTable(
            _unloadable,
            policy=VersionPolicy(),
            drain_timeout_s=1,
            observer=LifecycleMetrics(metrics, lambda: None),
        )
        polled = asyncio.Event()
        poller = RepositoryPoller(
            table, tmp_path, 0.01, metrics, report=ScanReport(metrics), after_scan=polled.set, scanner=scanner
        )
        poller.start()
        await asyncio.wait_for(polled.wait(), 10)  # a scan completed after two failures
        await asyncio.wait_for(poller.stop(), 10)

    asyncio.run(run())
    assert metrics.registry.get_sample_value("gmlp_repository_poller_restarts_total") == 2
    assert len(scans) >= 3


def test_the_scan_report_logs_each_problem_once(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    metrics = ServiceMetrics(8)
    report = ScanReport(metrics)
    broken = VersionSource("m", 2, tmp_path, None, "incomplete: no config.json yet")
    sources = {"m": ModelSource("m", {2: broken}, notes=("directory '²' ignored",))}
    with caplog.at_level(logging.WARNING, logger="service.lifecycle.poller"):
        report(sources)
        report(sources)
        assert metrics.registry.get_sample_value("gmlp_repository_problems") == 2
        report({})
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2 and any("version 2: incomplete" in line for line in logged)
    assert metrics.registry.get_sample_value("gmlp_repository_problems") == 0
