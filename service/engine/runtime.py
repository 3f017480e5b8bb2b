"""The runtime seam and its ONNX Runtime side: provider choice, thread count, IO binding. No HTTP,
no torch.

`Runtime` is what the pipelines and the batcher see of a loaded graph, whichever library runs it
(`service.engine.backends` opens the OpenVINO one and picks between them). `Runtime.run_batch`
takes a list of per-request feeds (one dict of arrays *without* the batch axis per request),
collates them (stacks them, or a task's own padding), runs the graph once and splits the outputs
back per request; it is what the `DynamicBatcher` calls from its worker threads (one per execution
instance; a session may be run from several threads at once).

Adaptive threading (docs/service.md): a run of one row that starts while no other run of any model
is going takes a second session over the same file, with `lone_threads` threads (ORT fixes a
session's pool when it opens it, OpenVINO a compiled model's streams and threads), on either
backend. Batches of several rows are left out: they form under load, when the next batch is about
to start beside them, and a wide run stalls on a preempted partner thread. Whether a model has a
lone session at all is the service's fixed rule or the user's setting
(`ServiceSettings.lone_threads_for`), never a timing taken at load.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
# The backends (`ServiceSettings.backend` once `auto` is resolved).
ONNXRUNTIME, OPENVINO = "onnxruntime", "openvino"

Feeds = dict[str, np.ndarray]
# Per-request feeds -> one batch of graph inputs (padding them to a common shape if needed).
Collate = Callable[[Sequence[Feeds]], Feeds]


def cuda_available() -> bool:
    return CUDA in ort.get_available_providers()


def resolve_device(requested: str) -> str:
    """`auto` -> cuda when ONNX Runtime was built with it; an unavailable `cuda` falls back to cpu."""
    if requested == "cpu":
        return "cpu"
    if cuda_available():
        return "cuda"
    if requested == "cuda":
        log.warning("device=cuda requested but this onnxruntime has no %s; running on CPU", CUDA)
    return "cpu"


def choose_variant(
    available: Mapping[str, str], device: str, requested: str | None, backend: str = ONNXRUNTIME
) -> str:
    """The variant to load: the requested one if exported, else the fastest sound one for the device.

    int8 (dynamic quantisation) is the fast path on CPU, fp16 on GPU; fp16 on CPU and int8 on
    CUDA are allowed when asked for explicitly but never chosen by default. OpenVINO takes the fp32
    graph by default: it computes it in bf16 where the CPU has bf16 instructions, and its reading of
    ONNX Runtime's int8 QDQ file is slower than that (docs/deploy.md, "Backends"). A requested
    variant a model lacks falls back to the default choice with a warning, so that one
    repository-wide setting works for models exported with different variants.
    """
    if requested is not None:
        if requested in available:
            return requested
        log.warning("variant %s not exported (have %s); choosing a default", requested, sorted(available))
    preferred = {"cpu": ["int8", "fp32"], "cuda": ["fp16", "fp32"]}[device]
    if backend == OPENVINO:
        preferred = ["fp32"]
    for variant in preferred:
        if variant in available:
            return variant
    if not available:
        raise ValueError("the served model lists no variants")
    return sorted(available)[0]


def rows_are_independent(metadata: Mapping[str, str], path: Path) -> bool:
    """Whether a batch row's outputs depend only on that row (so batching cannot change results).

    Dynamic int8 quantisation (`DynamicQuantizeLinear`) computes one activation scale per *tensor*,
    i.e. over the whole batch; static quantisation and float graphs compute each row on its own.
    `gmlp export` records the int8 mode in the file's metadata (`gmlp.int8` = static|dynamic),
    which ORT reads without the `onnx` package (absent from the serving image); `metadata` is the
    file's. Files without it are inspected with `onnx` when installed, else an `.int8.onnx` is
    taken to be dynamic.
    """
    mode = metadata.get("gmlp.int8")
    if mode is not None:
        return mode != "dynamic"
    try:
        import onnx
    except ImportError:
        return not path.name.endswith(".int8.onnx")
    model = onnx.load(str(path), load_external_data=False)
    nodes = [*model.graph.node, *(node for function in model.functions for node in function.node)]
    return all(node.op_type != "DynamicQuantizeLinear" for node in nodes)


@dataclass(frozen=True)
class RuntimeOptions:
    device: str = "cpu"  # resolved: cpu or cuda
    intra_op_threads: int = 1
    spinning: bool = False
    backend: str = ONNXRUNTIME  # resolved: onnxruntime or openvino
    instances: int = 1  # batches run at once (OpenVINO gives each its own stream)
    # Intra-op threads of a one-row run that starts while no other run goes; not above intra_op_threads: off.
    lone_threads: int = 0


def give_back_freed_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's `malloc_trim`; nothing where the C
    library has none): memory a library freed otherwise stays counted against the process."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_runs_lock = threading.Lock()
_runs_going = 0  # session runs going on now in this process, over every model


@contextmanager
def _running() -> Iterator[bool]:
    """Count a session run while the block lasts; yields whether no other run was going when it
    began, which decides its session (`Runtime.run`)."""
    global _runs_going
    with _runs_lock:
        alone = _runs_going == 0
        _runs_going += 1
    try:
        yield alone
    finally:
        with _runs_lock:
            _runs_going -= 1


class Abandon:
    """How a load stops its runtime's runs once the load is given up (past its deadline, or the
    service stopping), from any thread: the loader `watch`es the runtime as soon as it is open,
    the lifecycle calls `abandon`. A graph whose run never ends (a hostile Loop) then fails its
    run at once instead of burning a core for good, and its load's thread ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runtimes: list[Runtime] = []
        self.abandoned = False

    def watch(self, runtime: Runtime) -> None:
        with self._lock:
            self._runtimes.append(runtime)
            if self.abandoned:
                runtime.abort()

    def abandon(self) -> None:
        with self._lock:
            self.abandoned = True
            for runtime in self._runtimes:
                runtime.abort()


class Runtime:
    """One loaded graph of a served model, as the pipelines and the batcher use it: `run_on` (one
    batch of graph inputs on one of its sessions) and `static_dims` are the backend's own, the
    rest is shared, the choice of session included.

    `session` runs the instances' batches; `lone_session`, where the options give a lone run more
    threads than an instance has, runs one row alone (module docstring). `provider` names what runs
    the graph; `precision` is what its arithmetic is done in when the backend chooses that itself
    (OpenVINO's inference precision: fp32 or bf16), None where it is the file's own (ONNX Runtime).
    """

    provider: str
    precision: str | None = None
    input_names: list[str]
    output_names: list[str]
    row_independent: bool  # a batch row's outputs depend on that row alone
    session: Any
    lone_session: Any | None = None

    def __init__(self, path: Path, options: RuntimeOptions, name: str) -> None:
        self.path = path
        self.name = name or path.parent.name
        self.options = options
        self._every_session = False

    @property
    def wide(self) -> bool:
        """Whether the options ask for a lone session: more threads for a lone run, on a CPU."""
        return self.options.device == "cpu" and self.options.lone_threads > self.options.intra_op_threads

    def run(self, feeds: Feeds, names: Sequence[str] | None = None) -> Feeds:
        """One run over already batched inputs, returning the outputs `names` (default: all; those
        not asked for are not copied out). One row runs on the lone session, all its threads, when
        no other run is going as it starts (module docstring)."""
        names = list(names or self.output_names)
        if self._every_session and self.lone_session is not None:
            self.run_on(self.lone_session, feeds, names)
            return self.run_on(self.session, feeds, names)
        with _running() as alone:
            one_row = next(iter(feeds.values())).shape[0] == 1
            lone = alone and one_row and self.lone_session is not None
            return self.run_on(self.lone_session if lone else self.session, feeds, names)

    def run_on(self, session: Any, feeds: Feeds, names: list[str]) -> Feeds:
        """The outputs `names` of one run of `session` (`self.session` or `self.lone_session`)."""
        raise NotImplementedError

    def abort(self) -> None:
        """Make every run going on and every later run fail at once (an abandoned load's)."""
        raise NotImplementedError

    @property
    def lone_threads(self) -> int:
        """Threads of a lone one-row run: the lone session's, 0 where every run takes an instance's."""
        return self.options.lone_threads if self.lone_session is not None else 0

    def collate_rows(self, items: Sequence[Feeds], collate: Collate | None = None) -> Feeds:
        """Per-request feeds as one batch of graph inputs: the task's `collate`, else stacked."""
        return collate(items) if collate else {n: np.stack([r[n] for r in items]) for n in self.input_names}

    def static_dims(self, name: str) -> list[int | None]:
        """An input's shape as the graph declares it: an int where fixed, None where dynamic."""
        raise NotImplementedError

    @contextmanager
    def warming(self) -> Iterator[None]:
        """Within the block, each run gives the memory it took back when it ends, and after it the
        freed memory goes back to the system: the warm-up's shapes and full batch are a guess at
        what clients send, and its peak would otherwise stay with the process (docs/benchmarks.md,
        "Processes": loading gMLP-S/16 grew a server by 8.2x its int8 file, now 3.6x). A client's
        first batch of a size then allocates its memory, milliseconds beside its run."""
        try:
            yield
        finally:
            give_back_freed_memory()

    @contextmanager
    def on_every_session(self) -> Iterator[None]:
        """Within the block, every run runs on each session (the warm-up: each allocates its memory
        for each shape before a client's request would)."""
        self._every_session = True
        try:
            yield
        finally:
            self._every_session = False

    def run_batch(
        self, items: Sequence[Feeds], collate: Collate | None = None, names: Sequence[str] | None = None
    ) -> list[Feeds]:
        """Collate per-request feeds (default: equal shapes stacked on a new batch axis), run once,
        split the outputs `names` (default: all) per request."""
        if not self.row_independent and len(items) > 1:
            return [self.run_batch([item], collate, names)[0] for item in items]
        outputs = self.run(self.collate_rows(items, collate), names)
        return [{name: out[i] for name, out in outputs.items()} for i in range(len(items))]


@dataclass(frozen=True)
class RuntimeFacts:
    """What a process that does not run a graph knows of the runtime that does: the names, shapes
    and settings its requests are checked and described against. A front-end process
    (`service.processes`) serves the models of an engine process that holds their sessions; the
    engine hands it these with each model, and they answer what `Runtime` would."""

    path: Path
    options: RuntimeOptions
    provider: str
    precision: str | None
    input_names: list[str]
    output_names: list[str]
    row_independent: bool
    lone_threads: int
    static: dict[str, list[int | None]]

    @classmethod
    def of(cls, runtime: Runtime) -> RuntimeFacts:
        return cls(
            runtime.path,
            runtime.options,
            runtime.provider,
            runtime.precision,
            list(runtime.input_names),
            list(runtime.output_names),
            runtime.row_independent,
            runtime.lone_threads,
            {name: runtime.static_dims(name) for name in runtime.input_names},
        )

    def static_dims(self, name: str) -> list[int | None]:
        return self.static[name]


class OnnxModel(Runtime):
    """One ORT session over one variant of a served model."""

    def __init__(self, path: Path, options: RuntimeOptions, *, name: str = "") -> None:
        super().__init__(path, options, name)
        # Every run carries these options, so that `abort` can stop the runs going on; the
        # warm-up's also shrink the memory arena at the end of each run (`warming`).
        self._run_options = self._serving = ort.RunOptions()
        self._shrinking = ort.RunOptions()
        device = "gpu" if options.device == "cuda" else "cpu"
        self._shrinking.add_run_config_entry("memory.enable_memory_arena_shrinkage", f"{device}:0")
        self.session = self._open(options.intra_op_threads)
        self.lone_session = self._open(options.lone_threads) if self.wide else None
        self.provider = self.session.get_providers()[0]
        if options.device == "cuda" and self.provider != CUDA:
            log.warning(
                "model %s: CUDA provider failed to load, falling back to %s", self.name, self.provider
            )
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        # A request's result must not depend on its batch-mates: graphs where it would run row by row.
        metadata = self.session.get_modelmeta().custom_metadata_map
        self.row_independent = rows_are_independent(metadata, path)
        log.info(
            "model %s: %s on %s, %d intra-op threads%s%s",
            self.name,
            path.name,
            self.provider,
            options.intra_op_threads,
            f" ({options.lone_threads} for a lone run)" if self.lone_session else "",
            "" if self.row_independent else " (per-tensor dynamic quantisation: rows run one at a time)",
        )

    def _open(self, threads: int) -> ort.InferenceSession:
        so = ort.SessionOptions()
        # Explicit threads: ORT otherwise sizes its pool from the host's cores (oversubscription in
        # containers). inter-op 1: our graphs are a chain, parallelism is inside the ops.
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Several sessions share the CPU with the event loop; spinning workers would burn it.
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if self.options.spinning else "0")
        so.log_severity_level = 3
        providers = [CUDA, CPU] if self.options.device == "cuda" else [CPU]
        return ort.InferenceSession(str(self.path), sess_options=so, providers=providers)

    def run_on(self, session: Any, feeds: Feeds, names: list[str]) -> Feeds:
        return dict(zip(names, session.run(names, feeds, self._run_options), strict=True))

    def abort(self) -> None:
        # ORT checks the flag before each operator, a Loop's body included.
        self._serving.terminate = self._shrinking.terminate = True

    @contextmanager
    def warming(self) -> Iterator[None]:
        self._run_options = self._shrinking
        try:
            with super().warming():
                yield
        finally:
            self._run_options = self._serving

    def run(self, feeds: Feeds, names: Sequence[str] | None = None) -> Feeds:
        if self.provider != CUDA:
            return super().run(feeds, names)
        names = list(names or self.output_names)
        # IO binding: inputs are copied to the GPU once, outputs stay there until one copy back,
        # instead of ORT allocating and copying per run.
        binding = self.session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in names:
            binding.bind_output(name, "cuda")
        self.session.run_with_iobinding(binding, self._run_options)
        return dict(zip(names, binding.copy_outputs_to_cpu(), strict=True))

    def static_dims(self, name: str) -> list[int | None]:
        (shape,) = [i.shape for i in self.session.get_inputs() if i.name == name]
        return [d if isinstance(d, int) else None for d in shape]
