"""The Open Inference Protocol v2 (KServe / Triton): REST (`rest`) and gRPC (`grpc_server`)
transports over one tensor codec (`tensors`) and one set of semantics (`inference`)."""
