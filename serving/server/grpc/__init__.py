"""The KServe v2 / Triton gRPC transport (the grpc extra) over the same data plane as HTTP."""
