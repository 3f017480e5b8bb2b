"""The transport-free core of the service: settings, the ONNX Runtime sessions, the dynamic batcher,
deadlines, the task pipelines, the service's state and lifecycle, and the metrics registry.

Nothing here imports a transport (no FastAPI, Starlette, uvicorn or gRPC, nothing of
`service.http` or `service.v2`): refusals are `contract.errors` errors, which each transport maps
to its own status codes. This package imports nothing on its own, so that `service.core.runtime`
can be used without the rest (the peer benchmark does).
"""
