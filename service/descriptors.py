"""The connection caps fitted to the file descriptors a process may open (`ulimit -n`)."""

from __future__ import annotations

import logging
import resource

from contract.errors import UserError
from service.settings import ServiceSettings

log = logging.getLogger(__name__)

# File descriptors a serving process keeps besides its connections: the listening sockets, model
# files and ONNX Runtime sessions, log and metrics files, gRPC core's and the event loop's own.
FD_RESERVE = 128


def fit_connection_caps(settings: ServiceSettings) -> ServiceSettings:
    """`settings` with connection caps that this process's file descriptor limit can hold.

    Each serving process (the one process, or each worker, with its share of the caps) holds up
    to two descriptors per HTTP connection at its cap (the refused newcomers linger up to as many
    again), one per gRPC connection, and `FD_RESERVE` besides. The default caps (1000 + 1000) need
    3,128 there, above the soft limit of 1024 that many systems start a process with; at that limit
    descriptors run out before either cap is reached, and idle gRPC connections would starve HTTP's
    accept (EMFILE) with nothing counted or reported. So the soft RLIMIT_NOFILE is first raised
    toward the hard limit, as far as the caps need; where they still do not fit, both caps are
    lowered in proportion, with one warning naming the numbers; where not even one connection of
    each fits, the service refuses to start (UserError) rather than fail at its first connections.
    """
    workers, grpc_on = settings.resolved_workers(), bool(settings.grpc_port)
    http = share(settings.max_connections, workers)
    grpc = share(settings.grpc_max_connections, workers) if grpc_on else 0
    need = 2 * http + grpc + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if need > soft:
        wanted = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:  # a hard limit the kernel caps lower (macOS's OPEN_MAX)
            log.debug("the soft descriptor limit stays %d: %s", soft, exc)
    if need <= soft:
        return settings
    room = soft - FD_RESERVE
    if room < 2 + int(grpc_on):
        raise UserError(
            f"this process may open {soft} file descriptors (ulimit -n), too few for one HTTP "
            f"{'and one gRPC connection ' if grpc_on else 'connection '}besides the {FD_RESERVE} the "
            f"service keeps for model files, sessions, logs and metrics; raise ulimit -n"
        )
    scale = room / (2 * http + grpc)
    fitted_http = max(1, int(http * scale))
    fitted_grpc = max(1, min(int(grpc * scale), room - 2 * fitted_http)) if grpc_on else 0
    update = {"max_connections": fitted_http * workers}
    if grpc_on:
        update["grpc_max_connections"] = fitted_grpc * workers
    log.warning(
        "the descriptor limit (ulimit -n) is %d (hard limit %s), too few for max_connections=%d and "
        "grpc_max_connections=%d (%d needed%s: 2 per HTTP connection, 1 per gRPC connection, %d in "
        "reserve); serving with max_connections=%d and grpc_max_connections=%s; raise ulimit -n to "
        "keep the settings' caps",
        soft, "unlimited" if hard == resource.RLIM_INFINITY else hard,
        settings.max_connections, settings.grpc_max_connections, need,
        f" in each of {workers} workers" if workers > 1 else "", FD_RESERVE,
        update["max_connections"], update.get("grpc_max_connections", "(gRPC off)"),
    )  # fmt: skip
    return settings.model_copy(update=update)


def share(total: int, workers: int) -> int:
    """Each of `workers` processes' part of a cap of `total`: rounded up, at least 1."""
    return max(1, -(-total // workers))
