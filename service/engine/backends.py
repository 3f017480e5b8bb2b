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
from collections.abc import Collection, Sequence
from pathlib import Path

from contract.cpu import BF16_FLAGS, OPENVINO_PRECISIONS, cpu_flags
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
    """One graph on OpenVINO's CPU plugin: one stream per execution instance, and an inference
    request per batch thread (a request runs one batch at a time)."""

    provider = "OpenVINO CPU"

    def __init__(self, path: Path, options: RuntimeOptions, *, name: str = "") -> None:
        import onnx
        import onnx.inliner
        import openvino as ov

        super().__init__(path, options, name)
        proto = onnx.inliner.inline_local_functions(onnx.load(str(path)))
        core = ov.Core()
        config = {
            "NUM_STREAMS": options.instances,
            "INFERENCE_NUM_THREADS": options.instances * options.intra_op_threads,
        }
        self.compiled = core.compile_model(core.read_model(proto.SerializeToString(), b""), "CPU", config)
        hint = self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        self.precision = OPENVINO_PRECISIONS.get(hint, hint)
        graph = proto.graph
        self.input_names = [value.name for value in graph.input]
        self.output_names = [value.name for value in graph.output]
        self._outputs = dict(zip(self.output_names, self.compiled.outputs, strict=True))
        self._dims = {
            value.name: [dim.dim_value if dim.HasField("dim_value") else None for dim in shape.dim]
            for value in graph.input
            for shape in [value.type.tensor_type.shape]
        }
        self.row_independent = rows_are_independent({p.key: p.value for p in proto.metadata_props}, path)
        self._local = threading.local()
        log.info(
            "model %s: %s on %s at %s, %d stream(s) of %d thread(s)",
            self.name,
            path.name,
            self.provider,
            self.precision,
            options.instances,
            options.intra_op_threads,
        )

    def run(self, feeds: Feeds, names: Sequence[str] | None = None) -> Feeds:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        results = request.infer(feeds)  # copies the outputs out: the request is run again
        return {name: results[self._outputs[name]] for name in names or self.output_names}

    def static_dims(self, name: str) -> list[int | None]:
        return list(self._dims[name])


def open_runtime(path: Path, options: RuntimeOptions, *, name: str = "") -> Runtime:
    """`path` loaded on the options' (resolved) backend."""
    if options.backend == OPENVINO:
        return OpenVinoModel(path, options, name=name)
    return OnnxModel(path, options, name=name)
