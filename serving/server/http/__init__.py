"""The HTTP layer of ``mtgate serve``: FastAPI routes over the batcher and the engine."""

from serving.server.http.app import create_app

__all__ = ["create_app"]
