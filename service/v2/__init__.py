"""The Open Inference Protocol v2 (KServe / Triton).

`inference` (the protocol's semantics, its configuration and statistics documents) is
transport-free: it imports only the wings and `contract` (whose `tensors` is the protocol's tensor
codec). The transports are built on it: REST (`rest`, `schemas`, on the HTTP transport's plumbing)
and gRPC (`grpc_server`, `proto`, which never imports `service.http`).
"""
