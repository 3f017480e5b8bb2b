"""The connection caps fit the process's descriptor limit (`fit_connection_caps`): the soft limit is
raised toward the hard one, the caps lowered in proportion where it still does not hold them."""

from __future__ import annotations

import logging
import resource

import pytest

from contract.errors import UserError
from service.descriptors import FD_RESERVE, fit_connection_caps
from service.server import worker_settings
from service.settings import ServiceSettings


class Limits:
    """RLIMIT_NOFILE as the function sees it: `soft`, `hard`, and what it asked for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, soft: int, hard: int) -> None:
        self.soft, self.hard = soft, hard
        self.asked: list[tuple[int, int]] = []
        real_get, real_set = resource.getrlimit, resource.setrlimit

        def getrlimit(which: int) -> tuple[int, int]:
            return (self.soft, self.hard) if which == resource.RLIMIT_NOFILE else real_get(which)

        def setrlimit(which: int, limits: tuple[int, int]) -> None:
            if which != resource.RLIMIT_NOFILE:
                return real_set(which, limits)
            self.asked.append(limits)
            if limits[0] > self.hard:
                raise ValueError("not allowed to raise maximum limit")
            self.soft = limits[0]

        monkeypatch.setattr(resource, "getrlimit", getrlimit)
        monkeypatch.setattr(resource, "setrlimit", setrlimit)


def test_the_soft_limit_is_raised_as_far_as_the_caps_need(monkeypatch, caplog) -> None:
    limits = Limits(monkeypatch, soft=1024, hard=1 << 20)
    settings = ServiceSettings()
    assert fit_connection_caps(settings) is settings
    assert limits.asked == [(2 * 1000 + 1000 + FD_RESERVE, 1 << 20)]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_caps_the_hard_limit_cannot_hold_are_lowered_in_proportion(monkeypatch, caplog) -> None:
    Limits(monkeypatch, soft=1024, hard=1024)
    with caplog.at_level(logging.WARNING, logger="service.server"):
        fitted = fit_connection_caps(ServiceSettings())
    assert (fitted.max_connections, fitted.grpc_max_connections) == (298, 298)
    assert 2 * 298 + 298 + FD_RESERVE <= 1024
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "is 1024 (hard limit 1024), too few for max_connections=1000 and grpc" in warning
    assert "serving with max_connections=298 and grpc_max_connections=298" in warning


def test_each_worker_is_fitted_for_its_share(monkeypatch) -> None:
    Limits(monkeypatch, soft=1024, hard=1024)
    fitted = fit_connection_caps(ServiceSettings(workers=4, max_connections=4000, grpc_max_connections=4000))
    one = worker_settings(fitted, 8000)
    assert 2 * one.max_connections + one.grpc_max_connections + FD_RESERVE <= 1024
    assert one.max_connections == one.grpc_max_connections == 298


def test_without_grpc_http_has_the_room(monkeypatch) -> None:
    Limits(monkeypatch, soft=512, hard=512)
    fitted = fit_connection_caps(ServiceSettings(grpc_port=0))
    assert fitted.max_connections == (512 - FD_RESERVE) // 2


def test_a_limit_without_room_for_one_connection_refuses_to_start(monkeypatch) -> None:
    Limits(monkeypatch, soft=FD_RESERVE + 2, hard=FD_RESERVE + 2)
    refusal = r"may open 130 file descriptors \(ulimit -n\), too few for one HTTP and one gRPC"
    with pytest.raises(UserError, match=refusal):
        fit_connection_caps(ServiceSettings())
    assert fit_connection_caps(ServiceSettings(grpc_port=0)).max_connections == 1
