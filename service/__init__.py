"""gmlp-serve: served-model directories -> HTTP (see docs/service.md).

Wings of one concern each (`engine`, `tasks`, `lifecycle`, `access`, `telemetry`, with `settings`),
all transport-free; the transports `service.http` (task routes, Hugging Face API) and `service.v2`
(Open Inference Protocol over REST and gRPC); and the composition root here (`app`, `cli`,
`healthcheck`). The data path is route -> contract image/text -> task pipeline -> batcher ->
runtime -> postprocess -> response; below the transports nothing knows HTTP (errors are
`contract.errors` types, mapped to status codes in one table per API), and nothing here imports
torch, `model` or `export`. The package imports nothing itself, so that `gmlp --help` (which
imports `service.cli`) does not pay for FastAPI and ONNX Runtime.
"""
