"""The PyTriton comparison's parts that run without PyTriton: its command line, the table built
from perf_analyzer CSV files (tests/data/perf_analyzer-pytriton/, kept from a real two-round run
with 1 s windows: figures of a busy machine, not results), the comparison of the two servers'
model configurations, and the PyTriton venv's install recipe. Nothing is installed or started."""

from __future__ import annotations

import csv
import json
import statistics
import sysconfig

import pytest

from benchmarks.harness import REPO
from benchmarks.peers import pytriton_bench as bench
from benchmarks.peers.peers import SHARED_PINS, install_spec, product_pins
from benchmarks.peers.pytriton_server import library_path, tensors
from benchmarks.perf_analyzer import csv_row

RUN = REPO / "tests" / "data" / "perf_analyzer-pytriton"


def _runs() -> list[bench.Run]:
    """The committed run's CSV files as the benchmark reads them (`roundR-SERVER-TRANSPORT-LOAD.csv`)."""
    runs = []
    for path in sorted(RUN.glob("round*.csv")):
        rnd, rest = path.stem.removeprefix("round").split("-", 1)
        server, transport, load = rest.rsplit("-", 2)
        load = bench.POISSON if load == bench.POISSON else load.replace("c", "c=")
        runs.append(
            bench.Run.from_csv_row(
                csv_row(path), round=int(rnd), server=server, transport=transport, load=load
            )
        )
    return runs


def _raw(server: str, transport: str, load: str, column: str) -> list[float]:
    """One column of the CSV files of (server, transport, load), read with the csv module alone."""
    values = []
    for path in RUN.glob(f"round*-{server}-{transport}-{load}.csv"):
        with path.open() as f:
            values.append(float(next(csv.DictReader(f))[column]))
    return values


def _row(table: str, transport: str, load_prefix: str) -> list[str]:
    (line,) = [ln for ln in table.splitlines() if ln.startswith(f"| {transport} | {load_prefix}")]
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_the_committed_run_has_both_servers_transports_and_loads_in_two_rounds() -> None:
    runs = _runs()
    for server in (bench.GMLP, bench.PYTRITON):
        for transport in ("http", "grpc"):
            for load in ("c=1", bench.POISSON):
                rounds = {
                    r.round for r in runs if (r.server, r.transport, r.load) == (server, transport, load)
                }
                assert rounds == {0, 1}, (server, transport, load)
    assert all(r.rate > 0 for r in runs if r.load == bench.POISSON)
    assert all(r.rate == 0 for r in runs if r.load != bench.POISSON)


@pytest.mark.parametrize(("transport", "label"), [("http", "REST"), ("grpc", "gRPC")])
def test_the_table_shows_medians_over_rounds_and_their_ratios(transport: str, label: str) -> None:
    table = bench.table(_runs(), ["http", "grpc"], ["c=1", bench.POISSON], 0.6)
    cells = _row(table, label, "1 client ")
    mine = statistics.median(_raw(bench.GMLP, transport, "c1", "Inferences/Second"))
    theirs = statistics.median(_raw(bench.PYTRITON, transport, "c1", "Inferences/Second"))
    assert cells[2:5] == [f"{mine:.0f}", f"{theirs:.0f}", f"{mine / theirs:.2f}x"]
    p50 = statistics.median(_raw(bench.GMLP, transport, "c1", "p50 latency")) / 1000
    p99 = statistics.median(_raw(bench.GMLP, transport, "c1", "p99 latency")) / 1000
    their_p99 = statistics.median(_raw(bench.PYTRITON, transport, "c1", "p99 latency")) / 1000
    assert cells[5] == f"{p50:.1f} / {p99:.1f}"
    assert cells[7] == f"{p99 / their_p99:.2f}x"


def test_the_poisson_row_names_the_rate_each_server_was_sent() -> None:
    table = bench.table(_runs(), ["http"], ["c=1", bench.POISSON], 0.6)
    cells = _row(table, "REST", "Poisson")
    rates = [
        statistics.median(_raw(s, "http", bench.POISSON, "Request Rate"))
        for s in (bench.GMLP, bench.PYTRITON)
    ]
    assert cells[1] == f"Poisson, 0.6x capacity ({rates[0]:.0f} / {rates[1]:.0f} per s)"


def test_a_server_that_measured_nothing_leaves_dashes_not_ratios() -> None:
    only_ours = [r for r in _runs() if r.server == bench.GMLP]
    cells = _row(bench.table(only_ours, ["grpc"], ["c=1", "c=8"], 0.6), "gRPC", "1 client ")
    assert cells[3] == "-" and cells[4] == "-" and cells[6] == "- / -" and cells[7] == "-"
    # A load nobody measured has no row at all.
    assert "8 clients" not in bench.table(only_ours, ["grpc"], ["c=1", "c=8"], 0.6)


def test_both_servers_list_the_same_required_input_and_the_encoded_one_is_left_out() -> None:
    configs = json.loads((RUN / "configs.json").read_text())
    ours, theirs = (configs[s]["config"] for s in (bench.GMLP, bench.PYTRITON))
    assert any(t.get("optional") for t in ours["input"])  # gmlp-serve's encoded input
    assert bench.required_inputs(ours) == bench.required_inputs(theirs)
    assert bench.required_inputs(ours) == [("pixel_values", "TYPE_FP32", [3, 32, 32])]
    assert theirs["max_batch_size"] == ours["max_batch_size"] == 16
    assert theirs["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert theirs["instance_group"][0]["count"] == ours["instance_group"][0]["count"] == 2


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


def test_the_command_line_defaults_and_refusals() -> None:
    args = bench.parse_args([])
    assert (args.rounds, args.concurrency, args.rate_fraction) == (3, [1, 8, 32], 0.6)
    assert (args.transports, args.instances, args.no_docs) == ("http,grpc", 2, False)
    args = bench.parse_args(
        ["--concurrency", "1,4", "--rounds", "1", "--no-docs", "--measurement-ms", "1000"]
    )
    assert (args.concurrency, args.rounds, args.no_docs, args.measurement_ms) == ([1, 4], 1, True, 1000)
    for bad in (
        ["--concurrency", "0,8"],
        ["--max-trials", "2"],
        ["--transports", "http,quic"],
        ["--rounds", "0"],
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_the_pytriton_venv_pins_pytriton_numpy_1_and_the_products_other_packages() -> None:
    spec = install_spec(bench.PYTRITON_PEER)
    assert spec[:2] == [bench.PYTRITON_PIN, bench.NUMPY_1]
    others = product_pins(tuple(n for n in SHARED_PINS if n != "numpy"))
    assert spec[2:-2] == others
    assert not any(p.startswith("numpy==") and p != bench.NUMPY_1 for p in spec)
    assert spec[-2:] == ["-e", str(REPO)]
