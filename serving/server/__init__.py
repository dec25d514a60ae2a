"""The server: one data plane (service, batchers, model runners, repository and versions, metrics and
statistics, settings) and its two thin transports, HTTP (``serving.server.http``) and gRPC
(``serving.server.grpc``)."""
