"""Service configuration: one pydantic-settings object read from `GMLP_*` environment variables.

Every setting can also be given as a `gmlp serve` flag (see `service.cli`); flags win over the
environment, which wins over the defaults below. Each field is declared once, with its group and
its docstring: `gmlp serve --help` and docs/service.md's "Settings" tables are made from them.
Values that depend on the machine (variant, thread count, device) default to `None`/`auto` and are
resolved when the models are loaded, so that the same container image does the right thing on a
laptop, a CPU pod and a GPU node.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
from contextlib import suppress
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from contract.formats import Variant
from contract.image import DEFAULT_MAX_RESIZED_PIXELS
from contract.repository import VersionPolicy

# A JSON answer of 16 MiB is about 670 000 numbers at the bound's 25 bytes: every ranked answer and the
# logits of a text's 16 [MASK]s over a BERT-sized vocabulary fit, while a 2 KB request for the logits
# of many texts is refused before it costs hundreds of megabytes. Raw bytes are 4 per float32 instead
# of about 20: 64 MiB is twice the largest answer a default batch of the shipped masked LM makes.
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_BINARY_RESPONSE_BYTES = 64 * 1024 * 1024
# An `allowed_hosts` entry: `*`, or a DNS name (a leading dot for a domain and its subdomains).
_HOST_ENTRY = re.compile(r"\*|\.?[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?")


class Group(Enum):
    """What a setting is about: one table of docs/service.md and one `--help` section each (its
    heading, and what the table is about)."""

    SERVER = ("Server", "Where the service listens, and how long its HTTP and gRPC connections may live")
    MODELS = ("Models", "Which models are served, on what hardware, with how many CPUs")
    BATCHING = ("Batching", "How requests are gathered into batches and queued")
    LIMITS = ("Limits", "The deadline of a request and the sizes of what it may send and receive")
    ACCESS = ("Access", "API keys, TLS, CORS and the metrics port (docs/security.md)")
    LIFECYCLE = ("Lifecycle", "What the model repository loads, when it is re-read, and shutdown")
    OBSERVABILITY = ("Observability", "Logs and the timings an answer carries")
    UI = ("UI", "The playground page and the /stats series behind it")

    def __init__(self, heading: str, about: str) -> None:
        self.heading, self.about = heading, about


def setting(group: Group, default: Any, **constraints: Any) -> Any:
    """A settings field with its group in the field's metadata. Its description is the docstring under
    it, the only text about it: `gmlp serve --help` and docs/service.md's tables are made from it."""
    return Field(default, json_schema_extra={"group": group.name}, **constraints)


def group_of(field: FieldInfo) -> Group:
    extra = field.json_schema_extra
    assert isinstance(extra, dict), "every setting is declared with setting(...)"
    return Group[str(extra["group"])]


# A lone row gains from a second thread only where each operator's work outweighs waking that thread
# for it. The demo classifier's int8 row, 7.3 million multiply-adds a block, took 1.85 ms on two
# threads against 1.34 ms on one (a 2-vCPU Xeon with AMX): about 0.12 ms a block lost beyond an even
# split, so a block breaks even near 13 million there (fewer on a slower core, where the same
# wake-up buys less arithmetic). gMLP-S/16's 145 million gain (36 against 46 ms a row on that
# machine). The threshold keeps a margin of more than twice the break-even on the fastest core
# measured (docs/benchmarks.md, "A real-size model").
LONE_MIN_BLOCK_MACS = 32_000_000
# Unset `workers`: one process up to this many usable CPUs, else a front-end for every this many
# (`ServiceSettings.resolved_workers`).
CPUS_PER_FRONT_END = 4


class ServiceSettings(BaseSettings):
    """All knobs of the service, grouped (`Group`); flags, `--help` and the docs' tables come from here."""

    model_config = SettingsConfigDict(
        env_prefix="GMLP_", extra="ignore", validate_default=True, use_attribute_docstrings=True
    )

    host: str = setting(Group.SERVER, "127.0.0.1")
    """interface to bind; 0.0.0.0 in a container"""
    port: int = setting(Group.SERVER, 8000, ge=0, le=65535)
    """TCP port of HTTP"""
    grpc_port: int = setting(Group.SERVER, 8081, ge=0, le=65535)
    """TCP port of the Open Inference Protocol v2 gRPC service, on the same host, in the same process (same
    models, batchers and limits); 0 disables it. Triton's 8001 is taken by compose's GPU service, so the
    default is KServe's"""
    workers: int | None = setting(Group.SERVER, None, ge=1, le=64)
    """front-end processes serving both ports: with more than one, an engine process holds the models (one
    copy of the weights, one batcher per model for every client, the repository calls) and the front-ends
    do each request's own work (parsing, access, decoding, answers) on event loops of their own, handing
    rows to the engine through shared memory (docs/service.md, "Processes"). The connection caps are shared
    out among the front-ends; an API key's rate holds for the whole server. Unset: one process up to 4
    usable CPUs, else a front-end for every 4 (rounded up)"""
    max_connections: int = setting(Group.SERVER, 1000, ge=1)
    """open HTTP connections, counted from accept (TLS handshakes included), or requests in flight: at the cap
    the oldest idle keep-alive connection is closed to make room; when none is idle a newcomer gets 503
    too_many_connections at once, with Retry-After and Connection: close (under TLS it is closed before its
    handshake), so idle or slow clients cannot exhaust file descriptors"""
    grpc_max_connections: int = setting(Group.SERVER, 1000, ge=1)
    """open gRPC connections, counted from accept (TLS handshakes included); a newcomer beyond it is closed at
    once, before any handshake"""
    header_timeout_s: float = setting(Group.SERVER, 5.0, gt=0)
    """the request line and headers must arrive within this time from the connection's start (or a kept-alive
    request's first byte): 408 and closed; a connection that sends nothing is closed. Also the TLS handshake
    limit on both ports, and gRPC's HTTP/2 handshake limit"""
    keep_alive_timeout_s: float = setting(Group.SERVER, 5.0, gt=0)
    """an idle keep-alive connection is closed after this"""
    send_timeout_s: float = setting(Group.SERVER, 30.0, gt=0)
    """how long an HTTP answer may wait for a client that takes none of its bytes; then the connection is
    aborted and the buffered answer freed (gmlp_refusals_total{code="send_timeout"})"""
    grpc_max_connection_age_s: float = setting(Group.SERVER, 3600.0, gt=0)
    """a gRPC connection is closed at this age (its calls get drain_timeout_s to finish); clients reconnect"""
    grpc_max_connection_idle_s: float = setting(Group.SERVER, 300.0, gt=0)
    """a gRPC connection without calls is closed after this (GOAWAY)"""

    # Both relative to the working directory, never to where the code is installed: at a checkout's
    # root they are the exported demo models and the committed demo checkpoints; anywhere else
    # ./checkpoints is normally absent and nothing is exported.
    model_repository: Path = setting(Group.MODELS, Path("models"))
    """directory (relative to the working directory) holding served-model directories, each with a
    gmlp-served-model config.json; may also be one served-model directory"""
    checkpoint_dir: Path | None = setting(Group.MODELS, Path("checkpoints"))
    """checkpoints whose served directory (the repository's directory of the checkpoint's name) is missing are
    exported (fp32 + int8) at start-up when torch is installed; otherwise start-up fails with the `gmlp
    export` command to run. Relative to the working directory (at a checkout's root: the demo checkpoints; an
    installed package ships none); empty to disable"""
    device: Literal["auto", "cpu", "cuda"] = setting(Group.MODELS, "auto")
    """auto, cpu or cuda; auto uses CUDA when ONNX Runtime has it; cuda without it falls back to CPU with a
    warning"""
    backend: Literal["onnxruntime", "openvino", "auto"] = setting(Group.MODELS, "auto")
    """what runs the graphs: auto: openvino on a CPU with AVX512-BF16 or AMX where the `openvino` extra is
    installed (the container image has it), else onnxruntime (docs/deploy.md, "Backends"); onnxruntime;
    openvino (CPU only), which loads the fp32 graph (by default) and computes it in bf16 on such a CPU, else
    in fp32. openvino without the package refuses to start"""
    variant: Variant | None = setting(Group.MODELS, None)
    """fp32, int8 or fp16; unset: int8 on CPU, fp16 on CUDA when exported, else fp32. A variant a model lacks
    falls back to that default (warning)"""
    cpus: int | None = setting(Group.MODELS, None, ge=1)
    """CPUs the models may use, shared out among instances and intra-op threads; unset: the affinity mask
    capped by the cgroup cpu.max quota (the Kubernetes manifests set it from limits.cpu)"""
    instances: int | None = setting(Group.MODELS, None, ge=1, le=64)
    """execution instances per model: up to this many batches of one model run at once, each on a worker
    thread of the one ORT session (Triton's instance groups); unset: 2 on a CPU with at least 2 usable cores
    (1 if intra_op_threads alone takes them all), 1 on CUDA"""
    intra_op_threads: int | None = setting(Group.MODELS, None, ge=1)
    """ONNX Runtime intra-op threads of each instance; unset: the usable CPUs divided by the instances"""
    lone_threads: int | None = setting(Group.MODELS, None, ge=0)
    """intra-op threads of a one-row batch that starts while no other batch of any model runs (a lone request
    at low load), on a second session of the model (ORT's, or OpenVINO's of one stream: a second copy of its
    weights); unset: the usable CPUs for a model whose blocks each take at least 32 million multiply-adds a
    row at its full window (from its config's shapes), else off; 0, or not above intra_op_threads: off, every
    batch on its instance's threads. CPU only. `gmlp tune` searches it"""
    ort_spinning: bool = setting(Group.MODELS, False)
    """let ORT worker threads spin between runs (lower latency at low load, burns idle CPU)"""
    fixed_length: bool = setting(Group.MODELS, False)
    """masked LMs: run every batch at the full window of n tokens and every prediction slot instead of at its
    longest text (for comparison, or a runtime that needs static shapes); a graph exported with static shapes
    always runs so"""
    jpeg_draft: bool = setting(Group.MODELS, True)
    """decode a large JPEG at the smallest DCT scale (1/2, 1/4, 1/8) that keeps both sides at least twice the
    resize target (a large photo costs a fraction of its full decode); off: every pixel is decoded, for models
    whose answers must match a full decode exactly"""
    default_classifier: str | None = setting(Group.MODELS, None)
    """model used by /classify when the request names none; unset: the first classifier by directory order"""
    default_fill_mask: str | None = setting(Group.MODELS, None)
    """model used by /fill-mask when the request names none; unset: the first masked LM"""

    max_batch_size: int = setting(Group.BATCHING, 16, ge=1, le=1024)
    """largest batch the batcher forms"""
    max_queue_delay_ms: float = setting(Group.BATCHING, 2.0, ge=0)
    """how long the first waiting request may wait for batch-mates that are being decoded (a batch never waits
    for requests that have not arrived)"""
    queue_delay_policy: Literal["arriving", "always"] = setting(Group.BATCHING, "arriving")
    """arriving: a batch waits (up to max_queue_delay_ms) only while requests are being decoded; always: the
    first waiting request always waits the full delay for batch-mates, as Ray Serve and TorchServe do"""
    max_queue_size: int = setting(Group.BATCHING, 256, ge=1)
    """requests waiting per model; more: 503 with Retry-After"""

    # --- limits: the work and answer budget of a request (docs/reliability.md) ---
    request_timeout_s: float = setting(Group.LIMITS, 30.0, gt=0)
    """deadline of a request from its arrival (body read, decoding, queue, run); 504 after, or 408 with the
    connection closed when the body has not all arrived by then"""
    max_header_bytes: int = setting(Group.LIMITS, 16384, ge=1024)
    """largest request line plus headers; 431 above"""
    max_upload_bytes: int = setting(Group.LIMITS, 8 * 1024 * 1024, ge=1)
    """largest request body; 413 above (from Content-Length before reading, and on the bytes read)"""
    max_image_pixels: int = setting(Group.LIMITS, 40_000_000, ge=1)
    """largest image (width x height), checked from the header before decoding; 413 above (decompression-bomb
    guard)"""
    max_resized_pixels: int = setting(Group.LIMITS, DEFAULT_MAX_RESIZED_PIXELS, ge=1)
    """largest image between the resize to the shorter side and the centre crop (2048 x 2048), computed from
    the header before decoding; 413 image_too_large above. In effect an aspect-ratio limit: 64:1 at a resize
    of 256, 4096:1 at 32"""
    max_decoding_pixels: int = setting(Group.LIMITS, 80_000_000, ge=1)
    """pixels the whole process decodes at once (images decode in worker threads side by side); an image that
    does not fit waits, within its deadline, for decodes in flight to finish (one larger than the budget runs
    alone). Bounds the memory of decoding to about 8 bytes a pixel of this"""
    max_response_bytes: int = setting(Group.LIMITS, DEFAULT_MAX_RESPONSE_BYTES, ge=1024)
    """largest JSON answer of the v2 API, bounded from the outputs' element counts before it is built; 413
    response_too_large above, naming the binary tensor data extension"""
    max_binary_response_bytes: int = setting(Group.LIMITS, DEFAULT_MAX_BINARY_RESPONSE_BYTES, ge=1024)
    """largest raw tensor data of one v2 answer (REST binary outputs, gRPC raw contents); 413 /
    RESOURCE_EXHAUSTED response_too_large above"""

    api_keys_file: Path | None = setting(Group.ACCESS, None)
    """file of API keys with their scopes (infer, admin, metrics), names and rates, stored as SHA-256 digests
    (docs/security.md); re-read on change and on SIGHUP. Unset: every route but admin is open to whoever
    reaches the port, so keep such a server behind a mesh or a private network"""
    reload_interval_s: float = setting(Group.ACCESS, 2.0, gt=0)
    """how often the keys file and the TLS files are checked for changes"""
    tls_cert: Path | None = setting(Group.ACCESS, None)
    """PEM certificate chain: HTTPS and TLS on gRPC (TLS 1.2/1.3 only), re-read on change"""
    tls_key: Path | None = setting(Group.ACCESS, None)
    """PEM private key of tls_cert"""
    tls_client_ca: Path | None = setting(Group.ACCESS, None)
    """PEM CA bundle: clients on both ports must present a certificate it issued (mutual TLS)"""
    cors_origins: str | None = setting(Group.ACCESS, None)
    """comma-separated origins CORS allows (e.g. https://app.example.com), preflights answered; unset: CORS
    off"""
    cors_credentials: bool = setting(Group.ACCESS, False)
    """CORS: let browsers send credentials (cookies, Authorization) to the allowed origins"""
    allowed_hosts: str | None = setting(Group.ACCESS, None)
    """comma-separated names the service answers for without API keys, besides IP addresses and localhost (a
    leading dot: a domain and its subdomains, as .example.com; * any): a request for another Host gets 421
    host_not_allowed, so that no web page can reach the server by a name of its own (DNS rebinding). With an
    API keys file every name is answered"""
    metrics_port: int | None = setting(Group.ACCESS, None, ge=1, le=65535)
    """also serve /metrics, without a key, on this port (for scrapers on a private network)"""

    model_control: Literal["none", "poll", "explicit"] = setting(Group.LIFECYCLE, "none")
    """none: the repository is read once at start-up; poll: it is rescanned every repository_poll_s, new,
    changed and removed versions loaded or unloaded; explicit: only the v2 repository API loads and unloads
    (load_model at start-up)"""
    repository_poll_s: float = setting(Group.LIFECYCLE, 5.0, gt=0)
    """poll mode: seconds between two scans of the model repository"""
    version_policy: str = setting(Group.LIFECYCLE, "latest:1")
    """versions of each model to serve: latest:N, all or specific:V,V (a model's policy.json or a load call's
    config wins)"""
    max_loaded_versions: int | None = setting(Group.LIFECYCLE, None, ge=1)
    """most versions of one model loaded at once (each is one more session in memory; a swap holds two); a
    load beyond it is refused (too_many_versions) and nothing is unloaded; unset: no limit"""
    load_model: str | None = setting(Group.LIFECYCLE, None)
    """explicit mode: comma-separated models to load at start-up; unset: none"""
    drain_timeout_s: float = setting(Group.LIFECYCLE, 30.0, ge=0)
    """how long shutdown waits for queued and running requests"""
    load_timeout_s: float = setting(Group.LIFECYCLE, 300.0, gt=0, le=86400)
    """how long a version's load may take (its sessions, the warm-up of every input shape, the recorded
    check); past it the load is abandoned, its runs terminated, and the version listed UNAVAILABLE with the
    reason. Shutdown abandons loads still going"""

    log_level: Literal["critical", "error", "warning", "info", "debug"] = setting(Group.OBSERVABILITY, "info")
    """log level"""
    log_format: Literal["text", "json"] = setting(Group.OBSERVABILITY, "text")
    """text: plain lines for a terminal; json: every line the process writes is one JSON object (time, level,
    logger, message, request id, trace and span ids, model, route, status, duration), uvicorn's, gRPC's and
    ONNX Runtime's included"""
    access_log: bool = setting(Group.OBSERVABILITY, False)
    """one access line per answered request, in the log format (the metrics already count every request)"""
    server_timing: bool = setting(Group.OBSERVABILITY, True)
    """add a Server-Timing header (queue, infer, total, in ms) to every task answer; off for those who do not
    want the server's timings exposed"""

    ui: bool = setting(Group.UI, True)
    """serve the playground page at / to browsers (its assets under /ui/); off: / answers the JSON index of
    the API to every client"""
    stats_window_s: float = setting(Group.UI, 300.0, gt=0)
    """how far back /stats reports request rate, latency, queue and batches"""
    stats_interval_s: float = setting(Group.UI, 5.0, gt=0)
    """how often /stats samples the metrics (one point of its series each)"""

    def cors_origin_list(self) -> list[str]:
        return [o.strip() for o in (self.cors_origins or "").split(",") if o.strip()]

    @model_validator(mode="before")
    @classmethod
    def _empty_means_none(cls, data: object) -> object:
        """`GMLP_VARIANT=` or `GMLP_CHECKPOINT_DIR=` (empty) means "not set", as shells make it easy."""
        if isinstance(data, dict):
            return {k: (None if v == "" else v) for k, v in data.items()}
        return data

    @field_validator("backend")
    @classmethod
    def _backend_installed(cls, value: str) -> str:
        if value == "openvino" and importlib.util.find_spec("openvino") is None:
            raise ValueError("backend openvino needs the openvino package: pip install gmlp-serve[openvino]")
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, value: str | None) -> str | None:
        """Names only: a scheme or a port would never match a Host, and the server would refuse what
        the operator meant to allow."""
        for entry in (e.strip() for e in (value or "").split(",")):
            if entry and not _HOST_ENTRY.fullmatch(entry):
                raise ValueError(
                    f"allowed_hosts entry {entry!r} is not a host name: give names such as api, "
                    "gmlp.example.com or .example.com (no scheme, no port), or *"
                )
        return value

    @field_validator("version_policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        VersionPolicy.parse(value)  # PolicyError (a ValueError) names the accepted forms
        return value

    @property
    def startup_models(self) -> list[str]:
        """Explicit mode: the models `load_model` names."""
        return [n.strip() for n in (self.load_model or "").split(",") if n.strip()]

    def resolved_instances(self, device: str) -> int:
        """How many batches of one model may run at once.

        On a CPU, one session run on two single-threaded workers does more work per core than one
        run on two threads: a small model's operators are too short to split well, every thread
        pays for the synchronisation at each operator, and a worker preempted by the event loop
        stalls its partner (docs/benchmarks.md, "Execution instances"). A GPU runs one stream."""
        if self.instances is not None:
            return self.instances
        if device != "cpu":
            return 1
        return max(1, min(2, self.usable_cpus() // (self.intra_op_threads or 1)))

    def resolved_threads(self, instances: int = 1) -> int:
        """Intra-op threads per instance: the explicit setting, or the usable CPUs shared out."""
        return self.intra_op_threads or max(1, self.usable_cpus() // instances)

    def resolved_lone_threads(self, device: str) -> int:
        """Intra-op threads of a lone batch where it has a session of its own: the explicit setting,
        else every usable CPU (0 on CUDA): the other instances are idle when a run is lone. (With
        front-ends, the sessions are the engine's, which has every CPU of the server.)"""
        if device != "cpu":
            return 0
        if self.lone_threads is not None:
            return self.lone_threads
        return self.usable_cpus()

    def lone_threads_for(self, device: str, block_macs: int | None) -> int:
        """Intra-op threads of a lone batch of a model whose blocks each take `block_macs` a row
        (`contract.work.block_macs`; None where its config does not say): the explicit setting as
        given; unset, every CPU only where a block is at least `LONE_MIN_BLOCK_MACS`, a fixed rule
        from the model's shapes, so that a model runs the same way whatever the machine was doing
        when it loaded."""
        if self.lone_threads is None and (block_macs or 0) < LONE_MIN_BLOCK_MACS:
            return 0
        return self.resolved_lone_threads(device)

    def resolved_workers(self) -> int:
        """Front-end processes: the explicit setting, else a fixed rule from the usable CPUs.

        A front-end's share of a request (parsing, access, decoding, the answer) is about a fifth
        of the CPU time of the demo classifier's request, its batched inference the rest
        (docs/benchmarks.md, "Processes"), and a bigger model's share is smaller. So one event loop
        keeps up with the inference of up to about 4 CPUs, where the engine's extra hop costs more
        than it frees; above that, a front-end for every 4 CPUs leaves the request work a quarter
        of the machine."""
        if self.workers is not None:
            return self.workers
        cpus = self.usable_cpus()
        return 1 if cpus <= CPUS_PER_FRONT_END else -(-cpus // CPUS_PER_FRONT_END)

    def usable_cpus(self) -> int:
        return self.cpus or available_cpus()


def available_cpus() -> int:
    """CPUs this process can really use: the affinity mask capped by the cgroup CPU quota.

    `os.cpu_count()` reports the host's cores; in a container limited to 2 CPUs on a 64-core host,
    ORT would start 64 threads that fight over 2 cores. Affinity covers `taskset`/cpusets, the
    cgroup quota covers `docker run --cpus` and Kubernetes CPU limits.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        cpus = os.cpu_count() or 1
    if (quota := _cgroup_cpu_quota()) is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def _cgroup_cpu_quota() -> float | None:
    """The cgroup CPU limit in CPUs (v2 `cpu.max`, else v1 cfs quota/period), or None if unlimited."""
    with suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    try:
        quota_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None
