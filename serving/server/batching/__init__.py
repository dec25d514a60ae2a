"""Batching for the server: requests of one or more items go into a bounded queue, and their items run on one
worker thread, in one of two ways (``mtgate serve --batching``):

- ``request`` (:class:`DynamicBatcher`, ``serving.server.batching.dynamic``): batches of similar items form while the
  previous one runs, and run to the end;
- ``step`` (:class:`StepBatcher`, ``serving.server.batching.step``): sentences join the running decode batch at the next
  decoder step and leave it when they are done (:class:`DecoderRunner`, ``serving.server.batching.runner``, drives
  ``serving.engine.continuous``).

Both admit requests through :class:`Batcher` (``serving.server.batching.queue``): queue limits, deadlines,
cancellation, and admission by estimated completion against the deadline (``serving.server.batching.estimate``).
"""

from serving.server.batching.dynamic import DynamicBatcher, RunBatch
from serving.server.batching.queue import Batcher, BatchLimits, BatchObserver, BatchStats, Item, Pending
from serving.server.batching.runner import DecoderRunner, StepRunner
from serving.server.batching.step import StepBatcher

__all__ = [
    "BatchLimits",
    "BatchObserver",
    "BatchStats",
    "Batcher",
    "DecoderRunner",
    "DynamicBatcher",
    "Item",
    "Pending",
    "RunBatch",
    "StepBatcher",
    "StepRunner",
]
