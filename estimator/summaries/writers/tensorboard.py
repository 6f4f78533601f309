"""``TensorBoardWriter``: a MetricWriter writing TensorBoard event files (``estimator.summaries.SummaryWriter``).

>>> import tempfile
>>> from estimator.summaries import read_scalars
>>> logdir = tempfile.mkdtemp()
>>> with TensorBoardWriter(logdir) as w:
...     w.write_scalars(10, {"loss": 0.5})
>>> read_scalars(logdir)
{'loss': [(10, 0.5)]}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from estimator.summaries.event_files import SummaryWriter

__all__ = ["TensorBoardWriter"]


class TensorBoardWriter:
    """Writes to a new event file in ``logdir``: scalars (Scalars tab), histograms (Histograms and
    Distributions), images as PNG (Images; a batch [N, H, W, C] under ``tag/0`` ... ``tag/N-1``), texts
    (Text) and hyperparameters (HParams). ``num_buckets``: a histogram's buckets unless a call asks for
    others. Writes are queued and flushed every ``flush_secs``, on :meth:`flush` and :meth:`close`.

    The default of ``RunConfig.writers``: training's summaries go to ``model_dir``, evaluation's to
    ``model_dir/eval`` (``eval_<name>``), two runs of one TensorBoard.
    """

    def __init__(self, logdir, *, num_buckets: int | None = None, flush_secs: float = 10, max_queue: int = 100):
        self.num_buckets = num_buckets
        self.summary_writer = SummaryWriter(logdir, flush_secs=flush_secs, max_queue=max_queue)

    @property
    def path(self) -> str:
        """The event file written."""
        return self.summary_writer.path

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        if scalars:
            self.summary_writer.scalars(scalars, step)

    def write_histograms(self, step: int, arrays: Mapping[str, Any],
                         num_buckets: Mapping[str, int] | None = None) -> None:
        for tag, values in arrays.items():
            buckets = (num_buckets or {}).get(tag, self.num_buckets)
            self.summary_writer.histogram(tag, values, step, num_buckets=buckets)

    def write_images(self, step: int, images: Mapping[str, Any]) -> None:
        for tag, image in images.items():
            self.summary_writer.image(tag, image, step)

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        for tag, text in texts.items():
            self.summary_writer.text(tag, text, step)

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        if hparams:
            self.summary_writer.hparams(hparams)

    def flush(self) -> None:
        self.summary_writer.flush()

    def close(self) -> None:
        self.summary_writer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TensorBoardWriter({self.path!r})"
