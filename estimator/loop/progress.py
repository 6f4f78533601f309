"""Progress logs like TPUEstimator's, and a progress bar on a terminal.

:class:`StepLogger` is told the global step after each compiled loop (many
steps at a time). As TensorFlow's LoggingTensorHook, it logs the loss of the
first step a ``train`` call runs (:meth:`StepLogger.first_step`); then, every
``every_steps`` steps, what LoggingTensorHook and StepCounterHook logged::

    loss = 0.123, step = 1200 (1.172 sec)
    global_step/sec: 85.3
    examples/sec: 10918.4
    input wait: 12 % of the time

The last line (the share of the time between two log lines that the work
waited for its input, from the feeder's counters) is what TPUEstimator left
to its profiler: above a few percent, the input is a bottleneck (``infeed
stats`` or ``Daemon.stats()`` say which stage).

The rates cover the steps since the previous log line; the first log line has
none, so that compilation is never counted (as StepCounterHook's first
trigger). :meth:`StepLogger.update` returns the rates, for the estimator to
write as summaries too (``quiet=True``: only that, no log line).

Where the lines go (:func:`default_log_handler`): the ``estimator`` logger is
at INFO unless the application set its level, and gets a handler on stderr only
when the application has configured no logging (no handler on the root logger
or on ``estimator``), as TensorFlow's logger does. That handler writes only
while no other handler would: a root handler added later (the application's,
or the one absl's ``basicConfig()`` adds at a library's first absl log line)
takes the lines over, so no line is written twice.
``RunConfig(log_step_count_steps=None)`` turns all this, and the progress
lines, off.

>>> import logging, sys
>>> logger = logging.getLogger("estimator.example")
>>> logger.addHandler(logging.StreamHandler(sys.stdout)); logger.setLevel(logging.INFO)
>>> ticks = iter([0.0, 2.0, 4.0])
>>> log = StepLogger(every_steps=100, examples_per_step=128, logger=logger, bar=False, clock=lambda: next(ticks))
>>> log.first_step(1, loss=2.5)
loss = 2.5, step = 1
>>> log.update(100, loss=0.5)
loss = 0.5, step = 100
{}
>>> log.update(200, loss=0.25)
loss = 0.25, step = 200 (2.000 sec)
global_step/sec: 50
examples/sec: 6400
{'global_step/sec': 50.0, 'examples/sec': 6400.0}
>>> log.update(250, loss=0.2)                  # no multiple of 100 crossed: nothing logged
{}
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Self

import tqdm

from estimator.errors import InvalidArgumentError

__all__ = ["StepLogger", "batch_bar", "default_log_handler"]

_LOGGER = logging.getLogger("estimator")


class StepLogger:
    """Logs loss and rates every ``every_steps`` steps, and drives an optional tqdm bar.

    ``total_steps`` is the step the work ends at (the bar's total; None when
    unknown) and ``initial_step`` the step it starts from (a resumed run starts
    past 0). A log line is written at the first update that reaches each
    multiple of ``every_steps``. ``bar``: True shows a tqdm bar (written to
    ``bar_file``, default stderr), False never, None when stderr is a
    terminal. ``quiet``: rates measured and returned, nothing logged. ``clock`` (seconds, monotonic)
    is injectable for tests.
    """

    def __init__(self, total_steps: int | None = None, every_steps: int = 100, examples_per_step: int | None = None,
                 logger: logging.Logger = _LOGGER, bar: bool | None = None, *,
                 initial_step: int = 0, desc: str | None = None, bar_file=None, quiet: bool = False,
                 clock: Callable[[], float] = time.monotonic):
        if not (isinstance(every_steps, int) and every_steps >= 1):
            raise InvalidArgumentError(f"every_steps must be a positive int, got {every_steps!r}")
        self.every_steps = every_steps
        self.examples_per_step = examples_per_step
        self.logger = logger
        self._quiet = quiet
        self._clock = clock
        self._step = initial_step
        self._logged_multiple = initial_step // every_steps
        self._last_log: tuple[int, float] | None = None              # (step, time) of the last log line
        self._last_wait: float | None = None                          # input wait (s) at the last log line
        self._first_step: int | None = None                           # the step first_step logged
        if bar is None:
            bar = sys.stderr.isatty()
        self._bar = tqdm.tqdm(total=total_steps, initial=initial_step, desc=desc, unit="step",
                              file=bar_file, dynamic_ncols=True) if bar else None

    @property
    def has_bar(self) -> bool:
        """Whether a progress bar is shown (until :meth:`close`)."""
        return self._bar is not None

    def first_step(self, step: int, loss) -> None:
        """Logs ``loss = X, step = S`` for the first step of the work (LoggingTensorHook's first line), unless
        quiet; the rates still start from the first :meth:`update` (compilation is never counted)."""
        if not self._quiet:
            self.logger.info("loss = %g, step = %d", float(loss), int(step))
            self._first_step = int(step)

    def update(self, step: int, loss=None, extra: Mapping[str, object] | None = None,
               input_wait_s: float | None = None) -> dict[str, float]:
        """Records that the work reached ``step``; logs when it crossed a multiple of ``every_steps``.

        ``loss`` and the scalars in ``extra`` (numbers or numpy/JAX scalars)
        appear in the log line. ``input_wait_s``: the seconds the work has waited
        for its input so far (a running total). Returns ``{"global_step/sec": ...}``
        (and ``"examples/sec"`` when ``examples_per_step`` is known, and
        ``"input_wait_share"``, the share of the time since the last log line
        spent waiting for input, when ``input_wait_s`` is) when this update
        logged rates, else ``{}``.
        """
        step = int(step)
        if self._bar is not None:
            self._bar.update(step - self._step)
            if loss is not None:
                self._bar.set_postfix(loss=f"{float(loss):.4g}", refresh=False)
        self._step = step
        if step // self.every_steps <= self._logged_multiple:
            return {}
        self._logged_multiple = step // self.every_steps
        now = self._clock()
        tensors = {"loss": loss} if loss is not None else {}
        tensors.update(extra or {})
        if tensors and not self._quiet and step != self._first_step:      # not the same line twice
            line = ", ".join(f"{name} = {float(value):g}" for name, value in tensors.items()) + f", step = {step}"
            if self._last_log is not None:
                line += f" ({now - self._last_log[1]:.3f} sec)"
            self.logger.info("%s", line)
        rates = {}
        if self._last_log is not None and now > self._last_log[1]:
            rates["global_step/sec"] = (step - self._last_log[0]) / (now - self._last_log[1])
            if self.examples_per_step is not None:
                rates["examples/sec"] = rates["global_step/sec"] * self.examples_per_step
            for name, rate in rates.items():
                if not self._quiet:
                    self.logger.info("%s: %g", name, rate)
            if input_wait_s is not None and self._last_wait is not None:
                rates["input_wait_share"] = share = min((input_wait_s - self._last_wait) / (now - self._last_log[1]), 1)
                if not self._quiet:
                    self.logger.info("input wait: %.0f %% of the time", 100 * share)
        self._last_log = (step, now)
        self._last_wait = input_wait_s
        return rates

    def close(self) -> None:
        """Closes the bar, if any; closing again does nothing."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def batch_bar(desc: str, quiet: bool = False) -> tqdm.tqdm:
    """A bar counting batches (evaluation, prediction), shown only when stderr is a terminal (never when ``quiet``)."""
    return tqdm.tqdm(desc=desc, unit="batch", dynamic_ncols=True, disable=quiet or not sys.stderr.isatty())


#: The loggers whose level :func:`default_log_handler` set (to INFO), to unset when it is disabled.
_LEVEL_SET: set[str] = set()


class _DefaultHandler(logging.Handler):
    """The ``estimator`` logger's own handler, for an application that configured no logging: each record on
    the stderr of the moment (through tqdm, so that a progress bar is redrawn below it), as
    ``INFO:estimator:message``. Silent while another handler would write it (no line twice)."""

    def __init__(self, logger: logging.Logger):
        super().__init__()
        self.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
        self.logger = logger

    def emit(self, record: logging.LogRecord) -> None:
        if _configured(self.logger):
            return
        try:
            tqdm.tqdm.write(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)


def _configured(logger: logging.Logger) -> bool:
    """Whether the application has configured logging: a handler on the root logger or one of its own on
    ``logger``."""
    return bool(logging.getLogger().handlers) or any(not isinstance(h, _DefaultHandler) for h in logger.handlers)


def default_log_handler(enabled: bool = True, logger: logging.Logger = _LOGGER) -> bool:
    """Sets ``logger`` (the ``estimator`` logger) to INFO when its level is unset and, if the application has
    configured no logging (no handler on the root logger, none on ``logger``), gives it a handler on stderr;
    with ``enabled`` False, takes both back. The Estimator calls it as it is made and at each ``train`` and
    ``evaluate``. The handler stays, writing only while no other handler would. Returns whether it is on.

    >>> import logging
    >>> app = logging.getLogger("app_example")
    >>> saved, logging.root.handlers[:] = logging.root.handlers[:], []
    >>> default_log_handler(logger=app), app.level == logging.INFO
    (True, True)
    >>> default_log_handler(enabled=False, logger=app), app.handlers, app.level
    (False, [], 0)
    >>> logging.root.addHandler(logging.NullHandler())        # an application that configured logging
    >>> default_log_handler(logger=app), app.handlers, app.level == logging.INFO
    (False, [], True)
    >>> _ = default_log_handler(enabled=False, logger=app); logging.root.handlers[:] = saved
    """
    ours = [h for h in logger.handlers if isinstance(h, _DefaultHandler)]
    if not enabled:
        for handler in ours:
            logger.removeHandler(handler)
        if logger.name in _LEVEL_SET and logger.level == logging.INFO:
            logger.setLevel(logging.NOTSET)
        _LEVEL_SET.discard(logger.name)
        return False
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
        _LEVEL_SET.add(logger.name)
    if ours:
        return True
    if _configured(logger):
        return False
    logger.addHandler(_DefaultHandler(logger))
    return True
