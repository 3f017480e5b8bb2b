"""The keys file: its format, the refusals that never echo a key, the decision, the token bucket."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from contract.errors import PermissionDenied, RateLimited, Unauthenticated, UserError
from gmlp.cli import main
from service.access.keys import KeyStore, LocalRates, TokenBucket, digest, new_key, parse_keys
from service.access.scope import Scope, grpc_scope
from service.telemetry.metrics import ServiceMetrics


def decide(store: KeyStore, credential: str | None, scope: Scope, transport: str) -> str:
    """The store's decision, made outside an event loop."""
    return asyncio.run(store.authorize(credential, scope, transport))


def test_a_line_holds_name_scopes_digest_and_options() -> None:
    key = new_key()
    (parsed,) = parse_keys(f"# comment\n\nci  infer,metrics  {digest(key)}  rate=2.5 burst=4  # trailing\n")
    assert parsed.name == "ci" and parsed.scopes == {Scope.INFER, Scope.METRICS}
    assert (parsed.rate, parsed.burst) == (2.5, 4)
    assert parsed.digest.hex() == digest(key).removeprefix("sha256:")
    (default_burst,) = parse_keys(f"a infer {digest(key)} rate=2.5")
    assert default_burst.burst == 3


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("ci infer", "expected NAME SCOPES"),
        ("c/i infer {d}", "name 'c/i'"),
        ("anonymous infer {d}", "name 'anonymous'"),
        ("ci write {d}", "comma list of infer, admin, metrics"),
        ("ci infer {d} rate=0", "positive number"),
        ("ci infer {d} burst=3", "needs a rate="),
        ("ci infer {d} colour=red", "unknown option"),
        ("ci infer sha256:abc", "sha256:<64 hex digits>"),
    ],
)
def test_malformed_lines_say_which_and_why(line: str, says: str) -> None:
    with pytest.raises(ValueError, match="line 1") as caught:
        parse_keys(line.format(d=digest(new_key())))
    assert says in str(caught.value)


def test_a_key_pasted_in_plain_is_never_echoed() -> None:
    key = new_key()
    with pytest.raises(ValueError, match="must be given as sha256") as caught:
        parse_keys(f"ci infer {key}")
    assert key not in str(caught.value)


def test_names_and_keys_are_unique() -> None:
    key = digest(new_key())
    with pytest.raises(ValueError, match="used twice"):
        parse_keys(f"a infer {digest(new_key())}\na admin {digest(new_key())}")
    with pytest.raises(ValueError, match="also another key's"):
        parse_keys(f"a infer {key}\nb admin {key}")


def test_the_decision(tmp_path: Path) -> None:
    keys = {"user": new_key(), "boss": new_key()}
    path = tmp_path / "keys"
    path.write_text(f"user infer {digest(keys['user'])}\nboss admin {digest(keys['boss'])}\n")
    metrics = ServiceMetrics(8)
    store = KeyStore(path, metrics)
    assert decide(store, keys["user"], Scope.INFER, "http") == "user"
    with pytest.raises(Unauthenticated, match="needs an API key"):
        decide(store, None, Scope.INFER, "http")
    with pytest.raises(Unauthenticated, match="not valid"):
        decide(store, new_key(), Scope.INFER, "http")
    with pytest.raises(PermissionDenied, match="needs admin"):
        decide(store, keys["user"], Scope.ADMIN, "http")
    assert decide(store, keys["boss"], Scope.ADMIN, "grpc") == "boss"
    # An empty file locks everything rather than opening it; no file opens all but admin.
    path.write_text("# nobody\n")
    assert store.reload()
    with pytest.raises(Unauthenticated):
        decide(store, keys["user"], Scope.INFER, "http")
    open_store = KeyStore(None, ServiceMetrics(1))
    assert decide(open_store, None, Scope.METRICS, "http") == "anonymous"
    with pytest.raises(PermissionDenied, match="admin routes are closed"):
        decide(open_store, None, Scope.ADMIN, "http")


def test_a_broken_file_keeps_the_keys_in_force_and_an_unusable_one_stops_the_start(tmp_path: Path) -> None:
    key = new_key()
    path = tmp_path / "keys"
    path.write_text(f"user infer {digest(key)}\n")
    store = KeyStore(path, ServiceMetrics(8))
    path.write_text("user infer not-a-digest\n")
    assert store.changed() and not store.reload() and not store.changed()
    assert decide(store, key, Scope.INFER, "http") == "user"
    with pytest.raises(UserError, match="cannot be used"):
        KeyStore(tmp_path / "missing", ServiceMetrics(1))


def test_the_rate_limit_refills_with_time() -> None:
    bucket = TokenBucket(rate=2.0, burst=2)
    start = bucket.at
    assert bucket.take(start) == 0 and bucket.take(start) == 0
    assert bucket.take(start) == pytest.approx(0.5)
    assert bucket.take(start + 0.5) == 0  # one token back after 1/rate seconds


def test_a_changed_limit_starts_full_and_full_buckets_are_dropped_when_many() -> None:
    rates = LocalRates()
    rates.LIMIT = 3
    assert rates.take_now("k", 1e-6, 1) == 0 and rates.take_now("k", 1e-6, 1) > 0
    assert rates.take_now("k", 1e-6, 2) == 0  # new limits, a new bucket, full
    assert rates.take_now("quick", 1e9, 1) == 0  # full again a nanosecond later
    rates.take_now("fourth", 1.0, 1)  # over the limit: the full bucket goes, those in use stay
    assert set(rates.buckets) == {("k", 1e-6, 1), ("k", 1e-6, 2), ("fourth", 1.0, 1)}
    assert rates.take_now("k", 1e-6, 1) > 0


def test_rate_limited_keys_answer_with_the_wait(tmp_path: Path) -> None:
    key = new_key()
    path = tmp_path / "keys"
    path.write_text(f"slow infer {digest(key)} rate=0.001 burst=1\n")
    store = KeyStore(path, ServiceMetrics(1))
    decide(store, key, Scope.INFER, "http")
    with pytest.raises(RateLimited) as caught:
        decide(store, key, Scope.INFER, "http")
    assert caught.value.retry_after_s >= 900


def test_the_scope_table() -> None:
    assert grpc_scope("/inference.GRPCInferenceService/RepositoryModelLoad") is Scope.ADMIN
    assert grpc_scope("/inference.GRPCInferenceService/ModelReady") is None
    assert grpc_scope("/inference.GRPCInferenceService/ModelInfer") is Scope.INFER


def test_the_command_prints_a_key_and_its_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "new", "ci", "infer,metrics", "rate=5"]) == 0
    out = capsys.readouterr().out
    key = out.split("not stored): ")[1].split()[0]
    line = out.strip().splitlines()[-1]
    (parsed,) = parse_keys(line)
    assert parsed.name == "ci" and key not in line and digest(key) in line
    assert main(["keys", "new", "ci", "write"]) == 1  # no such scope: a user error, said in one line
    assert "must be a comma list of" in capsys.readouterr().err
