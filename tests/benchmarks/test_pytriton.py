"""The PyTriton comparison's parts that run without PyTriton: the table built from perf_analyzer CSV
files (tests/data/perf_analyzer-pytriton/, kept from a real two-round run with 1 s windows: figures
of a busy machine, not results), the PyTriton server's tensor binding and stub library path, its
venv's pins and the command line. Nothing is installed or started."""

from __future__ import annotations

import csv
import statistics
import sysconfig
from pathlib import Path

import pytest

from benchmarks import perf_analyzer as pa
from benchmarks.harness import REPO
from benchmarks.peers.peers import SHARED_PINS, install_spec, product_pins
from benchmarks.peers.pytriton_server import library_path, tensors

RUN = REPO / "tests" / "data" / "perf_analyzer-pytriton"
LOADS = {"c1": "1 client", "poisson": "Poisson 0.6x"}


def _csv(path: Path) -> dict[str, str]:
    with path.open() as f:
        return next(csv.DictReader(f))


def _results() -> dict[pa.Key, list[dict[str, float]]]:
    """The committed run as the benchmark collects it (`roundR-SERVER-TRANSPORT-LOAD.csv`)."""
    results: dict[pa.Key, list[dict[str, float]]] = {}
    for path in sorted(RUN.glob("round*.csv")):
        server, transport, load = path.stem.split("-", 1)[1].rsplit("-", 2)
        key = (server, "cifar10-gmlp", transport, "random", LOADS[load])
        results.setdefault(key, []).append(pa.figures(_csv(path), None))
    return results


def _median(server: str, transport: str, load: str, column: str) -> float:
    return statistics.median(
        float(_csv(p)[column]) for p in RUN.glob(f"round*-{server}-{transport}-{load}.csv")
    )


def _cells(table: str, *prefix: str) -> list[str]:
    (line,) = [ln for ln in table.splitlines() if ln.startswith("| " + " | ".join(prefix) + " |")]
    return [cell.strip() for cell in line.strip("|").split("|")]


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_the_table_shows_medians_over_rounds_and_gmlp_serves_ratios(transport: str) -> None:
    table = pa.table(_results())
    for server in (pa.GMLP, pa.PYTRITON):
        cells = _cells(table, server, "cifar10-gmlp", transport, "random", "1 client")
        assert cells[5] == f"{_median(server, transport, 'c1', 'Inferences/Second'):.0f}"
        assert cells[7] == f"{_median(server, transport, 'c1', 'p99 latency') / 1000:.1f}"
        assert cells[10] == ""  # no CPU figure was recorded for these runs
    ratio = _cells(table, "cifar10-gmlp", transport, "random", "1 client")
    mine, theirs = (_median(s, transport, "c1", "Inferences/Second") for s in (pa.GMLP, pa.PYTRITON))
    p99s = [_median(s, transport, "c1", "p99 latency") for s in (pa.GMLP, pa.PYTRITON)]
    assert ratio[4:] == [f"{mine / theirs:.2f}x", f"{p99s[0] / p99s[1]:.2f}x"]


def test_the_poisson_row_names_the_rate_each_server_was_sent() -> None:
    table = pa.table(_results())
    for server in (pa.GMLP, pa.PYTRITON):
        rate = _median(server, "http", "poisson", "Request Rate")
        assert _cells(table, server, "cifar10-gmlp", "http", "random", f"Poisson 0.6x ({rate:.0f}/s)")


def test_a_server_measured_alone_has_no_ratio_table() -> None:
    ours = {k: v for k, v in _results().items() if k[0] == pa.GMLP}
    table = pa.table(ours)
    assert "ratio" not in table and "pytriton" not in table
    assert len(table.splitlines()) == 2 + len(ours)


def test_the_server_binds_each_tensor_less_its_batch_axis_with_named_axes_free() -> None:
    entries = [
        {"name": "pixel_values", "dtype": "float32", "shape": ["batch", 3, 32, 32]},
        {"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]},
    ]
    assert [(n, str(d), s) for n, d, s in tensors(entries)] == [
        ("pixel_values", "float32", (3, 32, 32)),
        ("input_ids", "int64", (-1,)),
    ]


def test_the_stub_library_path_puts_the_interpreters_libpython_folder_first() -> None:
    libdir = str(sysconfig.get_config_var("LIBDIR"))
    assert library_path(None) == libdir
    assert library_path(f"/opt/a:{libdir}:/opt/b") == f"{libdir}:/opt/a:/opt/b"


def test_the_pytriton_venv_keeps_its_numpy_1_and_the_products_other_pins() -> None:
    spec = install_spec(pa.PYTRITON_PEER)
    assert spec[:2] == ["nvidia-pytriton==0.7.0", "numpy==1.26.4"]
    assert spec[2:-2] == product_pins(tuple(n for n in SHARED_PINS if n != "numpy"))
    assert spec[-2:] == ["-e", str(REPO)]


def test_the_command_line_refuses_no_rounds_and_unknown_peers() -> None:
    cli = pa.parser()
    args = cli.parse_args(["--against", "pytriton", "--rounds", "3"])
    assert (args.against, args.rounds, args.instances, args.classifier) == ("pytriton", 3, 2, "cifar10-gmlp")
    for bad in (["--rounds", "0"], ["--against", "triton"]):
        with pytest.raises(SystemExit):
            pa.window_flags(cli, cli.parse_args(bad))
