"""Shadow traffic (``mtgate serve --shadow CANDIDATE``): a candidate model translates a sampled share of production's
requests off the critical path and is compared with it (``worker``: the queue and worker thread; ``compare``: a
pair's scores; ``summary``: ``GET /v1/shadow``; ``metrics``: its Prometheus series; ``log``: the JSONL pair log)."""

from serving.server.shadow.worker import Shadow, ShadowJob

__all__ = ["Shadow", "ShadowJob"]
