"""The decoding daemon: a :class:`Dataset` fixes the batch sequence, worker processes decode it into a
ring, and the trainer iterates a :class:`Feed` of zero-copy batches, in order, resumable."""

from infeed.daemon.daemon import Daemon
from infeed.daemon.dataset import Dataset
from infeed.daemon.feed import Batch, Feed, attach
from infeed.daemon.input_stats import InputStats

__all__ = ["Batch", "Daemon", "Dataset", "Feed", "InputStats", "attach"]
