"""The shared-memory ring of batch slots between decoding workers and the trainer: its segment, layout,
hand-off, liveness checks, failure record, CUDA pinning and the collection of orphaned segments."""

from infeed.ring.ring import Ring

__all__ = ["Ring"]
