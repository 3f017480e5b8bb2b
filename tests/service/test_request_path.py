"""How much of the service one request goes through: the files of this repository (service/ and
contract/) whose code runs while a request is served, and the model lookups it makes.

The server is a real one (uvicorn on 127.0.0.1 with the gRPC server on its event loop, in a thread
of this process) started after a profiler is installed for new threads (`threading.setprofile`),
so that the server's thread, the batchers' worker threads and the encoders' threads report every
Python function they enter. After warm-up, one request is recorded: from before it is sent until
the server's event loop has finished with it (the tail of the request, the access log and the
metrics, runs in the same loop step as the answer's last write; a callback scheduled on the loop
after the answer arrived runs after it). A file is counted when two requests in a row both ran it,
so that a periodic task that happens to run meanwhile (the status sampler) is not counted.

Run with `-s` to see the lists. The ceilings are the design's: a request should not wander
through the house.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from support.servers import RunningServer, free_port

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
COUNTED = tuple(str(REPO / part) + "/" for part in ("service", "contract"))

# The most files of ours one request may pass through, and the model lookups it may make: the
# design's (15 files for /classify, 12 for a gRPC infer, one lookup per request), lowered to what
# the path meets; lower these if it gets shorter, never raise them.
CLASSIFY_FILES = 15
CLASSIFY_LOOKUPS = 1  # the task's default model, leased once
GRPC_INFER_FILES = 11
GRPC_INFER_LOOKUPS = 1  # the model leased before the inputs are decoded, handed down to run them
# Where a request's model name (and version) is resolved to a served version: the version table's
# doors (service.lifecycle.versions). A call from outside that module is one lookup.
LOOKUP_MODULE = str(REPO / "service" / "lifecycle" / "versions.py")
LOOKUP_DOORS = frozenset({"serving", "require", "pick", "lease"})


class Recorder:
    """The profile function of every thread started while it is installed: while `on`, the files
    of ours whose functions run, and the lookups made."""

    def __init__(self) -> None:
        self.on = False
        self.files: set[str] = set()
        self.lookups = 0
        self.entered: list[FrameType] = []  # the lookup frames seen while recording
        self.lock = threading.Lock()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event != "call":
            return
        filename = frame.f_code.co_filename
        if not filename.startswith(COUNTED):
            return
        with self.lock:
            self.files.add(filename)
            if filename == LOOKUP_MODULE and frame.f_code.co_name in LOOKUP_DOORS:
                caller = frame.f_back
                # A lease is a generator: resuming it (leaving the `with`) is a call event of the
                # same frame, not another lookup.
                fresh = all(frame is not seen for seen in self.entered)
                if fresh and (caller is None or caller.f_code.co_filename != LOOKUP_MODULE):
                    self.lookups += 1
                self.entered.append(frame)

    def record(self, request: Callable[[], Any], settle: Callable[[], None]) -> tuple[set[str], int]:
        """The files and lookups of one `request`; `settle` returns once the server is done with it."""
        with self.lock:
            self.files, self.lookups, self.entered = set(), 0, []
        self.on = True
        try:
            request()
            settle()
        finally:
            self.on = False
        with self.lock:
            return set(self.files), self.lookups


Recorded = tuple[RunningServer, Recorder, Callable[[], None]]


@pytest.fixture(scope="module")
def recorded(make_settings: Callable[..., Any]) -> Iterator[Recorded]:
    """A server started under the recorder, and a function that waits until its loop is idle."""
    recorder = Recorder()
    settings = make_settings(grpc_port=free_port(), stats_interval_s=3600.0, reload_interval_s=3600.0)
    server = RunningServer(settings)
    loops: list[asyncio.AbstractEventLoop] = []
    inner = server.app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        loops.append(asyncio.get_running_loop())
        async with inner(app) as state:
            yield state

    server.app.router.lifespan_context = lifespan

    async def nothing() -> None:
        return None

    def settle() -> None:
        for _ in range(2):  # anything the first callback's step scheduled runs before the second's
            asyncio.run_coroutine_threadsafe(nothing(), loops[0]).result(timeout=10)

    threading.setprofile(recorder)
    try:
        server.start().wait_ready()
    finally:
        threading.setprofile(None)  # only the server's threads (and theirs) are profiled
    yield server, recorder, settle
    server.stop()


def measure(
    recorder: Recorder, settle: Callable[[], None], request: Callable[[], Any]
) -> tuple[list[str], int]:
    """The files both of two requests ran (after two of warm-up), relative to the repository, and
    the most lookups one of them made."""
    for _ in range(2):
        request()
    runs = [recorder.record(request, settle) for _ in range(2)]
    files = set.intersection(*(found for found, _ in runs))
    return sorted(str(Path(f).relative_to(REPO)) for f in files), max(lookups for _, lookups in runs)


def report(what: str, files: list[str], lookups: int) -> None:
    print(f"\n{what}: {len(files)} files, {lookups} model lookup(s)")
    for name, count in sorted(Counter(str(Path(f).parent) for f in files).items()):
        print(f"  {name}/: {count}")
    for name in files:
        print(f"    {name}")


def test_classify_request_path(recorded: Recorded, cifar_images: list[bytes]) -> None:
    server, recorder, settle = recorded
    with server.client() as client:

        def classify() -> None:
            answer = client.post("/classify", params={"top_k": 2}, content=cifar_images[0])
            assert answer.status_code == 200, answer.text

        files, lookups = measure(recorder, settle, classify)
    report("POST /classify", files, lookups)
    assert "service/http/routes.py" in files  # the recorder sees the route itself
    assert len(files) <= CLASSIFY_FILES
    assert lookups <= CLASSIFY_LOOKUPS


def test_grpc_infer_path(recorded: Recorded) -> None:
    server, recorder, settle = recorded
    triton = grpcclient.InferenceServerClient(url=f"127.0.0.1:{server.settings.grpc_port}")
    batch = np.zeros((1, 3, 32, 32), dtype=np.float32)
    tensor = grpcclient.InferInput("pixel_values", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch)

    def infer() -> None:
        assert triton.infer("tiny-vision", [tensor]).as_numpy("logits").shape[0] == 1

    try:
        files, lookups = measure(recorder, settle, infer)
    finally:
        triton.close()
    report("gRPC ModelInfer", files, lookups)
    assert "service/v2/grpc_server.py" in files
    assert len(files) <= GRPC_INFER_FILES
    assert lookups <= GRPC_INFER_LOOKUPS
