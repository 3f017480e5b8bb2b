"""Which library runs a served graph: ONNX Runtime (`service.engine.runtime`), or OpenVINO's runtime.

ONNX Runtime is the default and the only required runtime. OpenVINO (the `openvino` extra) is
faster on CPUs with bf16 instructions: there it computes the fp32 graph in bf16 (its default
inference precision on such CPUs), ahead of ONNX Runtime's int8 graph on the same cores; on the
other CPUs it computes in fp32 and has no such lead. `auto` chooses by the CPU's flags
(docs/deploy.md, "Backends").

OpenVINO's ONNX reader knows no ONNX local functions, so the fused graph's
`gmlp::SpatialGatingUnit` nodes are inlined when it is loaded (the `onnx` package, a dependency
of the extra); the file on disk stays the fused one.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Collection
from pathlib import Path
from typing import Any

from contract.cpu import BF16_FLAGS, OPENVINO_PRECISIONS, cpu_flags
from contract.external_data import refuse_external_data
from service.engine.runtime import (
    ONNXRUNTIME,
    OPENVINO,
    Feeds,
    OnnxModel,
    Runtime,
    RuntimeOptions,
    rows_are_independent,
)

log = logging.getLogger(__name__)


def auto_backend(device: str, flags: Collection[str], openvino: bool) -> str:
    """`auto`'s choice: OpenVINO on a CPU with AVX512-BF16 or AMX when it is installed, ONNX Runtime
    everywhere else (a GPU, or a CPU without bf16 instructions, where OpenVINO computes in fp32)."""
    if device == "cpu" and openvino and BF16_FLAGS & set(flags):
        return OPENVINO
    return ONNXRUNTIME


def resolve_backend(requested: str, device: str) -> str:
    """The backend to load with: the requested one, or `auto`'s choice on this machine."""
    if requested != "auto":
        return requested
    backend = auto_backend(device, cpu_flags(), importlib.util.find_spec("openvino") is not None)
    log.info("backend auto: %s", backend)
    return backend


class OpenVinoModel(Runtime):
    """One graph on OpenVINO's CPU plugin: one stream per execution instance, an inference request
    per batch thread (a request runs one batch at a time), and, for a lone run (`Runtime.run`), a
    second compiled model of one stream over `lone_threads` threads."""

    provider = "OpenVINO CPU"

    def __init__(self, path: Path, options: RuntimeOptions, *, name: str = "") -> None:
        import onnx
        import onnx.inliner
        import openvino as ov

        super().__init__(path, options, name)
        proto = onnx.inliner.inline_local_functions(onnx.load(str(path)))
        core = ov.Core()
        graph = core.read_model(proto.SerializeToString(), b"")

        def compiled(streams: int, threads: int) -> Any:
            # Unpinned: OpenVINO pins each stream's threads to cores of its own choosing, and the
            # worker processes of one server all chose the same ones (two workers' single-thread
            # streams shared one core). The event loop needs the cores too.
            config = {"NUM_STREAMS": streams, "INFERENCE_NUM_THREADS": threads, "ENABLE_CPU_PINNING": False}
            return core.compile_model(graph, "CPU", config)

        self.session = compiled(options.instances, options.instances * options.intra_op_threads)
        self.lone_session = compiled(1, options.lone_threads) if self.wide else None
        hint = self.session.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        self.precision = OPENVINO_PRECISIONS.get(hint, hint)
        self.input_names = [value.name for value in proto.graph.input]
        self.output_names = [value.name for value in proto.graph.output]
        self._output_index = {name: index for index, name in enumerate(self.output_names)}
        self._dims = {
            value.name: [dim.dim_value if dim.HasField("dim_value") else None for dim in shape.dim]
            for value in proto.graph.input
            for shape in [value.type.tensor_type.shape]
        }
        self.row_independent = rows_are_independent({p.key: p.value for p in proto.metadata_props}, path)
        self._local = threading.local()
        self._requests: list[Any] = []  # every inference request made, for `abort`
        self._aborted = False
        log.info(
            "model %s: %s on %s at %s, %d stream(s) of %d thread(s)%s",
            self.name,
            path.name,
            self.provider,
            self.precision,
            options.instances,
            options.intra_op_threads,
            f" ({options.lone_threads} for a lone run)" if self.lone_session else "",
        )

    def run_on(self, session: Any, feeds: Feeds, names: list[str]) -> Feeds:
        # This thread's inference request on each compiled model, made on its first run there.
        requests: dict[int, Any] = self._local.__dict__.setdefault("requests", {})
        if id(session) not in requests:
            requests[id(session)] = session.create_infer_request()
            self._requests.append(requests[id(session)])
        if self._aborted:
            raise RuntimeError(f"model {self.name}: its load was abandoned")
        results = requests[id(session)].infer(feeds)  # copies the outputs out: the request runs again
        return {name: results[self._output_index[name]] for name in names}

    def static_dims(self, name: str) -> list[int | None]:
        return list(self._dims[name])

    def abort(self) -> None:
        self._aborted = True
        for request in list(self._requests):
            request.cancel()


def open_runtime(path: Path, options: RuntimeOptions, *, name: str = "") -> Runtime:
    """`path` loaded on the options' (resolved) backend. Its external data is checked first
    (`refuse_external_data`, SpecError): both runtimes open the files a graph names themselves,
    and ONNX Runtime reads a hard link, OpenVINO's reader whatever `onnx` lets through."""
    refuse_external_data(path, "graph")
    if options.backend == OPENVINO:
        return OpenVinoModel(path, options, name=name)
    return OnnxModel(path, options, name=name)
