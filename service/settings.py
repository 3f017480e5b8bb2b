"""Service configuration: one pydantic-settings object read from `GMLP_*` environment variables.

Every setting can also be given as a `gmlp serve` flag (see `service.cli`); flags win over the
environment, which wins over the defaults below. Values that depend on the machine (variant, thread
count, device) default to `None`/`auto` and are resolved when the models are loaded, so that the
same container image does the right thing on a laptop, a CPU pod and a GPU node.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contract.formats import Variant
from contract.image import DEFAULT_MAX_RESIZED_PIXELS
from contract.repository import VersionPolicy

Device = Literal["auto", "cpu", "cuda"]

# A JSON answer of 16 MiB is about 670 000 numbers at the bound's 25 bytes: every ranked answer and the
# logits of a text's 16 [MASK]s over a BERT-sized vocabulary fit, while a 2 KB request for the logits
# of many texts is refused before it costs hundreds of megabytes. Raw bytes are 4 per float32 instead
# of about 20: 64 MiB is twice the largest answer a default batch of the shipped masked LM makes.
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_BINARY_RESPONSE_BYTES = 64 * 1024 * 1024

log = logging.getLogger(__name__)


class ServiceSettings(BaseSettings):
    """All knobs of the service. Field descriptions double as the `--help` text of `gmlp serve`."""

    model_config = SettingsConfigDict(env_prefix="GMLP_", extra="ignore", validate_default=True)

    # Both relative to the working directory, never to where the code is installed: at a checkout's
    # root they are the exported demo models and the committed demo checkpoints; anywhere else
    # ./checkpoints is normally absent and nothing is exported.
    model_repository: Path = Field(
        Path("models"),
        description="directory holding served-model directories (each with a gmlp-served-model config.json)",
    )
    checkpoint_dir: Path | None = Field(
        Path("checkpoints"),
        description="checkpoints that `gmlp serve` exports into the repository at start-up when their "
        "served directory is missing (needs torch); empty string to disable",
    )
    host: str = Field("127.0.0.1", description="interface to bind; 0.0.0.0 in a container")
    port: int = Field(8000, ge=0, le=65535, description="TCP port")
    grpc_port: int = Field(
        8081,
        ge=0,
        le=65535,
        description="TCP port of the Open Inference Protocol v2 gRPC service (same process, same models); "
        "0 disables it",
    )
    device: Device = Field("auto", description="auto|cpu|cuda; auto uses CUDA when ONNX Runtime has it")
    variant: Variant | None = Field(
        None, description="fp32|int8|fp16; default: int8 on CPU, fp16 on CUDA when exported, else fp32"
    )
    cpus: int | None = Field(
        None,
        ge=1,
        description="CPUs the models may use, shared out among instances and threads; default: the "
        "affinity mask capped by the cgroup CPU quota (set it from a Kubernetes limits.cpu)",
    )
    instances: int | None = Field(
        None,
        ge=1,
        le=64,
        description="execution instances per model: batches of one model run concurrently on this many "
        "workers of one session; default: 2 on a CPU with 2 or more cores (unless intra_op_threads "
        "alone fills them), 1 on CUDA",
    )
    intra_op_threads: int | None = Field(
        None,
        ge=1,
        description="ONNX Runtime intra-op threads of each instance; default: the CPUs available to us "
        "divided among the instances",
    )
    max_batch_size: int = Field(16, ge=1, le=1024, description="largest batch the batcher forms")
    max_queue_delay_ms: float = Field(
        2.0, ge=0, description="how long the first waiting request may wait for batch-mates being decoded"
    )
    queue_delay_policy: Literal["arriving", "always"] = Field(
        "arriving",
        description="arriving: a batch waits (up to max_queue_delay_ms) only for requests being decoded; "
        "always: the first waiting request always waits the full delay for batch-mates",
    )
    max_queue_size: int = Field(256, ge=1, description="waiting requests per model before 503")
    fixed_length: bool = Field(
        False,
        description="run masked LMs at their full window of n tokens and every prediction slot, "
        "instead of each batch at its longest text (for comparison, or runtimes that need static shapes)",
    )
    request_timeout_s: float = Field(30.0, gt=0, description="deadline of a request from arrival; 504 after")
    max_connections: int = Field(
        1000,
        ge=1,
        description="open HTTP connections (counted from accept, TLS handshakes included) or requests in "
        "flight beyond which a newcomer gets 503 at once (under TLS: is closed); at the cap the oldest "
        "idle keep-alive connection is closed to make room first",
    )
    max_header_bytes: int = Field(16384, ge=1024, description="largest request line plus headers; 431 above")
    max_upload_bytes: int = Field(
        8 * 1024 * 1024, ge=1, description="largest accepted request body; 413 above"
    )
    max_image_pixels: int = Field(
        40_000_000, ge=1, description="largest decoded image (width x height); decompression-bomb guard"
    )
    jpeg_draft: bool = Field(
        True,
        description="decode a large JPEG at the smallest DCT scale (1/2, 1/4, 1/8) that keeps both sides "
        "at least twice the resize target (a large photo costs a fraction of its full decode); off: every "
        "pixel is decoded, for models whose answers must match a full decode exactly",
    )
    # --- work and answer budget per request (docs/reliability.md, "Work and answer budget") ---
    max_resized_pixels: int = Field(
        DEFAULT_MAX_RESIZED_PIXELS,
        ge=1,
        description="largest image between the resize to the shorter side and the centre crop (width x "
        "height, computed from the header before decoding); 413 above. In effect an aspect-ratio limit: "
        "64:1 at a resize of 256",
    )
    max_decoding_pixels: int = Field(
        80_000_000,
        ge=1,
        description="pixels the whole process decodes at once (images decode in worker threads side by "
        "side); a larger image waits, within its deadline, for decodes in flight to finish. Bounds the "
        "memory of decoding to about 8 bytes a pixel of this",
    )
    max_response_bytes: int = Field(
        DEFAULT_MAX_RESPONSE_BYTES,
        ge=1024,
        description="largest JSON answer, computed from the element counts of the outputs before it is "
        "built; 413 above, naming the binary tensor data extension (v2 binary_data_output) for big tensors",
    )
    max_binary_response_bytes: int = Field(
        DEFAULT_MAX_BINARY_RESPONSE_BYTES,
        ge=1024,
        description="largest answer of raw tensor bytes (v2 REST binary outputs, gRPC raw contents); 413 "
        "(gRPC RESOURCE_EXHAUSTED) above",
    )
    send_timeout_s: float = Field(
        30.0,
        gt=0,
        description="how long an HTTP answer may wait for a client that takes none of its bytes; then the "
        "connection is dropped and its buffered answer freed",
    )
    default_classifier: str | None = Field(None, description="model used by /classify when none is named")
    default_fill_mask: str | None = Field(None, description="model used by /fill-mask when none is named")
    drain_timeout_s: float = Field(30.0, ge=0, description="how long shutdown waits for queued requests")
    ort_spinning: bool = Field(
        False, description="let ORT worker threads spin between runs (lower latency, burns idle CPU)"
    )
    access_log: bool = Field(False, description="log every request (uvicorn access log); metrics cover it")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="log level"
    )
    # --- playground and status ---
    ui: bool = Field(
        True,
        description="serve the playground page at / to browsers (its assets under /ui/); off: / answers "
        "the JSON index of the API to every client",
    )
    stats_window_s: float = Field(
        300.0, gt=0, description="how far back /stats reports request rate, latency, queue and batches"
    )
    stats_interval_s: float = Field(
        5.0, gt=0, description="how often /stats samples the metrics (one point of its series each)"
    )
    # --- access control ---
    api_keys_file: Path | None = Field(
        None,
        description="file of API keys with their scopes (infer, admin, metrics), names and rates, stored "
        "as SHA-256 digests (docs/security.md); re-read on change and on SIGHUP. Unset: every route but "
        "admin is open to whoever reaches the port",
    )
    reload_interval_s: float = Field(
        2.0, gt=0, description="how often the keys file and the TLS files are checked for changes"
    )
    tls_cert: Path | None = Field(
        None, description="PEM certificate chain: HTTPS and TLS on gRPC (TLS 1.2/1.3), re-read on change"
    )
    tls_key: Path | None = Field(None, description="PEM private key of tls_cert")
    tls_client_ca: Path | None = Field(
        None,
        description="PEM CA bundle: clients must present a certificate it issued (mutual TLS, both ports)",
    )
    cors_origins: str | None = Field(
        None,
        description="comma-separated origins allowed by CORS (e.g. https://app.example.com); unset: off",
    )
    cors_credentials: bool = Field(
        False,
        description="CORS: let browsers send credentials (cookies, Authorization) to the allowed origins",
    )
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="also serve /metrics, without a key, on this port (for scrapers on a private network)",
    )
    header_timeout_s: float = Field(
        5.0,
        gt=0,
        description="a request's line and headers must arrive within this time (408, connection closed); "
        "also the TLS handshake limit on both ports (closed after it)",
    )
    keep_alive_timeout_s: float = Field(
        5.0, gt=0, description="an idle keep-alive connection is closed after this"
    )
    grpc_max_connection_age_s: float = Field(
        3600.0,
        gt=0,
        description="a gRPC connection is closed (gracefully, after drain_timeout_s) at this age",
    )
    grpc_max_connection_idle_s: float = Field(
        300.0, gt=0, description="a gRPC connection without calls is closed after this"
    )
    grpc_max_connections: int = Field(
        1000,
        ge=1,
        description="open gRPC connections (counted from accept, TLS handshakes included) beyond which a "
        "new one is closed at once, before any handshake",
    )

    # --- observability ---
    log_format: Literal["text", "json"] = Field(
        "text",
        description="text: plain lines for a terminal; json: every line the process writes is one JSON "
        "object (time, level, logger, message, request id, trace and span ids, model, route, status, "
        "duration), uvicorn's, gRPC's and ONNX Runtime's included",
    )
    server_timing: bool = Field(
        True,
        description="add a Server-Timing header (queue, infer, total, in ms) to every task response "
        "(POST); off for those who do not want the server's timings exposed",
    )

    # --- model lifecycle ---
    model_control: Literal["none", "poll", "explicit"] = Field(
        "none",
        description="none: the repository is read once at start-up; poll: rescanned every "
        "repository_poll_s, new, changed and removed versions loaded or unloaded; explicit: only the v2 "
        "repository API loads and unloads (load_model at start-up)",
    )
    repository_poll_s: float = Field(
        5.0, gt=0, description="poll mode: seconds between two scans of the model repository"
    )
    version_policy: str = Field(
        "latest:1",
        description="versions of each model to serve: latest:N, all or specific:V,V (a model's "
        "policy.json or a load call's config wins)",
    )
    max_loaded_versions: int | None = Field(
        None,
        ge=1,
        description="most versions of one model loaded at once (each is one more session in memory; a "
        "swap holds two); a load beyond it is refused; default: no limit",
    )
    load_model: str | None = Field(
        None, description="explicit mode: comma-separated models to load at start-up (default: none)"
    )

    def cors_origin_list(self) -> list[str]:
        return [o.strip() for o in (self.cors_origins or "").split(",") if o.strip()]

    @model_validator(mode="before")
    @classmethod
    def _empty_means_none(cls, data: object) -> object:
        """`GMLP_VARIANT=` or `GMLP_CHECKPOINT_DIR=` (empty) means "not set", as shells make it easy."""
        if isinstance(data, dict):
            return {k: (None if v == "" else v) for k, v in data.items()}
        return data

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
    quota = _cgroup_cpu_quota()
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def _cgroup_cpu_quota() -> float | None:
    """The cgroup CPU limit in CPUs (v2 `cpu.max`, else v1 cfs quota/period), or None if unlimited."""
    try:
        text = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


__all__ = ["ServiceSettings", "available_cpus", "Device"]
