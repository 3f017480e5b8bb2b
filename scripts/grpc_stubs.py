"""Generate the committed gRPC modules of service/v2/proto/ from grpc_predict_v2.proto.

    python scripts/grpc_stubs.py            # rewrite service/v2/proto/grpc_predict_v2_pb2*.py(i)
    python scripts/grpc_stubs.py --check    # exit 1 when the committed modules are stale

The modules are committed because the serving image installs grpcio and protobuf but not
grpcio-tools. One change to protoc's output: the messages are registered in a private descriptor
pool instead of protobuf's default one. Clients ship their own copy of the same protocol under the
same names (tritonclient's `grpc_service.proto`, KServe's `grpc_predict_v2.proto`), and the default
pool refuses a second file that defines `inference.ModelInferRequest`; with a private pool the
server imports next to either of them (tests run the clients in the server's process).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO = Path("service/v2/proto/grpc_predict_v2.proto")
OUTPUTS = ("grpc_predict_v2_pb2.py", "grpc_predict_v2_pb2.pyi", "grpc_predict_v2_pb2_grpc.py")
DEFAULT_POOL, PRIVATE_POOL = "_descriptor_pool.Default()", "_descriptor_pool.DescriptorPool()"


def generate(out: Path) -> None:
    """protoc into `out` (the package layout is kept: out/service/v2/proto/...), then the pool patch."""
    from grpc_tools import protoc  # dev-only dependency

    args = ["protoc", f"-I{ROOT}", f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}"]
    if protoc.main([*args, str(ROOT / PROTO)]) != 0:
        raise SystemExit("protoc failed")
    pb2 = out / PROTO.parent / OUTPUTS[0]
    text = pb2.read_text()
    if text.count(DEFAULT_POOL) != 1:
        raise SystemExit(f"{pb2}: expected one {DEFAULT_POOL} to replace; protoc's output changed")
    pb2.write_text(text.replace(DEFAULT_POOL, PRIVATE_POOL))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = []
        for name in OUTPUTS:
            fresh, committed = Path(tmp) / PROTO.parent / name, ROOT / PROTO.parent / name
            if args.check:
                if not committed.exists() or committed.read_bytes() != fresh.read_bytes():
                    stale.append(str(committed.relative_to(ROOT)))
            else:
                shutil.copyfile(fresh, committed)
    if stale:
        print(f"stale gRPC modules (run `make grpc-stubs`): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
