"""The Open Inference Protocol v2 (KServe / Triton): transport-free semantics (`inference`), REST
on the HTTP transport's plumbing (`rest`, `schemas`) and gRPC (`grpc_server`, `proto`, which never
imports `service.http`)."""
