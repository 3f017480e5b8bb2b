"""A real-size model end to end: raw ONNX Runtime, the served figures, the GEMM peak and int8 agreement.

    .venv/bin/python -m benchmarks.realsize                                  # gMLP-S/16, 3 rounds x 5 s
    .venv/bin/python -m benchmarks.realsize --arch gmlp_b16_224 --rounds 3 --seconds 10
    .venv/bin/python -m benchmarks.realsize --model-dir DIR --rounds 1 --seconds 1    # a smoke run

Without `--model-dir`, builds the named config with random weights (moved off the init) and
exports it (fp32 + static int8). Rounds interleave every row: raw `session.run` of both files at
batch 1 and 8, `gmlp serve` with its defaults and with `GMLP_LONE_THREADS=0` under closed-loop
clients (each server started for its rows and alone on the machine), a square GEMM per precision
for the peak (fp32 `torch.matmul`, int8 ORT `MatMulInteger`, bf16 `torch.matmul` where the CPU
computes bf16), and the model's achieved FLOP/s at batch 8 from the MACs its shapes imply. Where
the `openvino` package is installed, the second backend gets the same rows: OpenVINO raw on the
fp32 graph (in the precision it chose on this CPU) and on the int8 one, and `gmlp serve --backend
openvino`. Prints one
JSON line per round, then the medians and each other graph's top-1 agreement with ORT fp32 over
256 CIFAR-10 photos (docs/benchmarks.md, "A real-size model").
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks.harness import REPO, command_line, cpu_facts, median_seconds
from contract.calibration import image_bytes
from contract.cpu import BF16_FLAGS, cpu_flags
from contract.image import ImageTransform
from contract.work import vision_macs
from gmlp.server_process import ServerProcess, gmlp_serve, link_repository
from loadtests.engine import PreparedRequest, classify_request, run_closed_loop
from loadtests.runner import parse_users
from service.engine.backends import open_runtime
from service.engine.runtime import ONNXRUNTIME, OPENVINO, Runtime, RuntimeOptions
from service.settings import available_cpus

CALIBRATION = REPO / "checkpoints" / "cifar10-gmlp" / "calibration.npz"
GEMM_SIDE = 1024
HAS_OPENVINO = importlib.util.find_spec("openvino") is not None


def build(arch: str, work: Path) -> Path:
    """A served directory of `arch` with random weights, exported by `gmlp export`."""
    import torch

    from model import build_model, get_config, save_checkpoint
    from model.checkpoint import TIMM_PREPROCESSING

    torch.manual_seed(0)
    model = build_model(get_config(arch))
    with torch.no_grad():  # off the init (zero head, spatial W ~ 0), so that answers differ per photo
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    labels = [f"class_{i}" for i in range(get_config(arch).to_dict()["num_classes"])]
    checkpoint = save_checkpoint(
        model.eval(), work / "checkpoint", labels=labels, preprocessing=TIMM_PREPROCESSING
    )
    out = work / arch.replace("_", "-")
    export = [sys.executable, "-m", "gmlp", "export", str(checkpoint), "--out", str(out)]
    subprocess.run([*export, "--calibration", str(CALIBRATION), "--calibration-samples", "64"], check=True)
    return out


def int8_gemm(threads: int, side: int = GEMM_SIDE) -> Callable[[], object]:
    """One ORT `MatMulInteger` of two side x side matrices (uint8 activations, int8 weights)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.integers(-64, 64, (side, side), dtype=np.int8), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
        "gemm",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [side, side])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [side, side])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    gemm = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    a = rng.integers(0, 255, (side, side), dtype=np.uint8)
    return lambda: gemm.run(None, {"a": a})


def torch_gemm(threads: int, dtype: str, side: int = GEMM_SIDE) -> Callable[[], object]:
    """One `torch.matmul` of two side x side matrices of `dtype` (float32 or bfloat16)."""
    import torch

    torch.set_num_threads(threads)
    a, b = (torch.randn(side, side).to(getattr(torch, dtype)) for _ in range(2))
    return lambda: torch.matmul(a, b)


# The graphs measured raw: (row, variant, backend). OpenVINO reads both files where installed: the
# fp32 one is what it serves by default, the int8 one (ORT's QDQ quantisation) shows its int8 path.
ROWS = [("fp32", "fp32", ONNXRUNTIME), ("int8", "int8", ONNXRUNTIME)]
ROWS += [("openvino", "fp32", OPENVINO), ("openvino_int8", "int8", OPENVINO)] if HAS_OPENVINO else []


def graphs(directory: Path, files: dict[str, str], threads: int) -> dict[str, Runtime]:
    """The `ROWS` by name, each on one stream or session of every thread (a lone batch)."""
    return {
        row: open_runtime(directory / files[variant], RuntimeOptions("cpu", threads, backend=backend))
        for row, variant, backend in ROWS
    }


def precisions(runtimes: dict[str, Runtime]) -> dict[str, str]:
    """What each row computes its matrix products in: int8 for the int8 file on either backend (its
    quantised products), else the runtime's choice (OpenVINO's bf16 or fp32), else the file's."""
    variants = {row: variant for row, variant, _ in ROWS}
    return {
        row: "int8" if variants[row] == "int8" else runtime.precision or variants[row]
        for row, runtime in runtimes.items()
    }


def agreement(runtimes: dict[str, Runtime], config: dict[str, Any]) -> dict[str, Any]:
    """Per graph other than ORT fp32, the share of photos whose top-1 class it gives as ORT fp32
    does; and how many photos."""
    transform = ImageTransform.for_model(config, max_pixels=50_000_000)
    photos = np.stack([transform(data) for data in image_bytes(CALIBRATION, 256, seed=0)])
    name = config["inputs"][0]["name"]
    chunks = np.array_split(photos, 32)
    top1 = {
        row: np.concatenate([run.run({name: c}, ["logits"])["logits"] for c in chunks]).argmax(-1)
        for row, run in runtimes.items()
    }
    shares = {row: float(np.mean(top1["fp32"] == top1[row])) for row in runtimes if row != "fp32"}
    return {"photos": len(photos), **shares}


def peaks(threads: int, seconds: float) -> dict[str, float]:
    """GFLOP/s (GOP/s for int8) of a square GEMM in each precision this CPU computes natively."""
    gemms = {"fp32": torch_gemm(threads, "float32"), "int8": int8_gemm(threads)}
    if BF16_FLAGS & cpu_flags():
        gemms["bf16"] = torch_gemm(threads, "bfloat16")
    flops = 2 * GEMM_SIDE**3
    return {f"peak_{p}_g": flops / median_seconds(gemm, seconds) / 1e9 for p, gemm in gemms.items()}


def one_round(
    spec: dict[str, Any],
    runtimes: dict[str, Runtime],
    servers: dict[str, ServerProcess],
    requests: list[PreparedRequest],
    args: Any,
) -> dict:
    """Every row's figures once: each graph raw on random inputs of the served input `spec`, the
    GEMM peaks, each server at each number of clients sent `requests` in turn."""
    row: dict[str, Any] = {}
    for graph, runtime in runtimes.items():
        for batch in (1, 8):
            x = np.random.default_rng(batch).standard_normal((batch, *spec["shape"][1:])).astype(np.float32)
            per_call = median_seconds(lambda: runtime.run({spec["name"]: x}, ["logits"]), args.seconds)  # noqa: B023
            row[f"raw_{graph}_b{batch}_ms"] = 1000 * per_call
            row[f"raw_{graph}_b{batch}_img_s"] = batch / per_call
    row |= peaks(available_cpus(), args.seconds)
    for name, server in servers.items():
        # Each server runs alone, started for its rows: idle servers beside it slowed one client
        # by a third on a 2-vCPU machine (docs/benchmarks.md, "A real-size model").
        with server:
            for clients in args.clients:
                load = run_closed_loop(
                    server.base_url, requests, concurrency=clients, seconds=args.seconds, warmup_s=1
                )
                row[f"{name}_c{clients}_rps"], row[f"{name}_c{clients}_failed"] = load.rps, load.failed
                row[f"{name}_c{clients}_p50_ms"] = load.percentile_ms(50)
    return row


def summary(
    rounds: list[dict], macs: int, clients: list[int], computed_in: dict[str, str], servers: list[str]
) -> dict[str, Any]:
    """Medians over the rounds of every figure, each raw graph's achieved share of the GEMM peak of
    the precision it computes in (`computed_in`, by row), and the served rows against raw int8:
    throughput against batch 8, one client's p50 against batch 1's latency."""
    out = {"gmacs_per_image": macs / 1e9} | {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    for graph, precision in computed_in.items():
        achieved = out[f"raw_{graph}_b8_img_s"] * 2 * macs / 1e9
        out[f"achieved_{graph}_b8_g"] = achieved
        if f"peak_{precision}_g" in out:
            out[f"achieved_{graph}_of_{precision}_peak"] = achieved / out[f"peak_{precision}_g"]
    for name in servers:
        if 8 in clients:
            out[f"{name}_c8_over_raw_int8_b8"] = out[f"{name}_c8_rps"] / out["raw_int8_b8_img_s"]
        if 1 in clients:
            out[f"{name}_c1_over_raw_int8_b1"] = out[f"{name}_c1_p50_ms"] / out["raw_int8_b1_ms"]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = command_line(__doc__)
    parser.add_argument("--arch", default="gmlp_s16_224", help="named config to build (without --model-dir)")
    parser.add_argument("--model-dir", type=Path, help="an exported served directory instead")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per row and round")
    parser.add_argument("--clients", type=parse_users, default=[8, 1], help="e.g. 1,8,32")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gmlp-realsize-") as tmp:
        work = Path(tmp)
        directory = args.model_dir or build(args.arch, work)
        config = json.loads((directory / "config.json").read_text())
        if (macs := vision_macs(config["model"])) is None:
            raise SystemExit(f"{directory}: not a gMLP image classifier's config (no shapes to count)")
        (spec,) = config["inputs"]  # a vision classifier: one image input
        photos = image_bytes(CALIBRATION, 16, seed=1)
        requests = [classify_request(photo, 5, model=directory.name) for photo in photos]
        repository = link_repository(work, directory)
        runtimes = graphs(directory, config["variants"], available_cpus())
        computed_in = precisions(runtimes)
        print(json.dumps({"machine": cpu_facts(), "model": str(directory), "gmacs": macs / 1e9}), flush=True)
        top1 = agreement(runtimes, config)
        print(json.dumps({"precisions": computed_in, "top1_vs_ort_fp32": top1}), flush=True)
        variants = {"served": {}, "served_lone_off": {"GMLP_LONE_THREADS": "0"}}
        if HAS_OPENVINO:
            variants["served_openvino"] = {"GMLP_BACKEND": "openvino"}
        servers = {
            name: gmlp_serve(repository, log_path=work / f"{name}.log", env=env)
            for name, env in variants.items()
        }
        rounds = []
        for index in range(args.rounds):
            rounds.append(one_round(spec, runtimes, servers, requests, args))
            print(json.dumps({"round": index + 1, **rounds[-1]}), flush=True)
        medians = summary(rounds, macs, args.clients, computed_in, list(servers))
        print(json.dumps({"medians": medians}), flush=True)


if __name__ == "__main__":
    main()
