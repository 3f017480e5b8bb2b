"""The Open Inference Protocol's model-repository extension, shared by the REST and gRPC transports.

`index` lists every model version the service knows with its state (READY, LOADING, UNLOADING,
UNAVAILABLE) and, unless READY, the reason; `load` and `ServiceState.unload_model` answer the calls
Triton's clients make (`load_model`, `unload_model`), taken only in explicit model control. A load's `config`
parameter is a JSON model configuration; its `version_policy` (Triton's form, or `latest:N`,
`all`, `specific:V,...`) chooses the versions to serve. Other parameters (Triton's `file:`
overrides, `unload_dependents`) are accepted and ignored: models load from the repository only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract.errors import ErrorCode, InvalidInput
from service.lifecycle.state import ServiceState


def index(state: ServiceState, ready_only: bool = False) -> list[dict[str, str]]:
    return [vars(entry).copy() for entry in state.table.index(ready_only)]


def _config(parameters: Mapping[str, Any]) -> str | None:
    config = parameters.get("config")
    if config is None:
        return None
    if isinstance(config, bytes):
        config = config.decode("utf-8", "replace")
    if not isinstance(config, str):
        raise InvalidInput(
            ErrorCode.INVALID_VERSION_POLICY, "the config parameter must be a string holding a JSON object"
        )
    return config


async def load(state: ServiceState, name: str, parameters: Mapping[str, Any]) -> None:
    """Load `name` (beside what serves it now; switched to only once warmed up and checked)."""
    await state.load_model(name, _config(parameters))


__all__ = ["index", "load"]
