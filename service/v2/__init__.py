"""The Open Inference Protocol v2 (KServe / Triton).

`inference` (the protocol's semantics) and `tensors` (its tensor codec) are transport-free: they
import only the wings and `contract`. The transports are built on them: REST (`rest`, `schemas`, on
the HTTP transport's plumbing) and gRPC (`grpc_server`, `proto`, which never imports
`service.http`).
"""
