"""StepLogger: TPUEstimator's log lines at their cadence, rates from an injected clock, and the tqdm bar."""

import io
import logging

import numpy as np
import pytest

from estimator.progress import StepLogger


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return FakeClock()


def messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "estimator"]


def test_logs_loss_and_rates_at_each_multiple_like_tpuestimator(caplog, clock):
    caplog.set_level(logging.INFO, logger="estimator")
    log = StepLogger(total_steps=1000, every_steps=100, examples_per_step=128, bar=False, clock=clock)
    clock.now += 30.0                                       # compilation: never in a rate
    assert log.update(100, loss=0.75) == {}
    assert messages(caplog) == ["loss = 0.75, step = 100"]
    caplog.clear()
    clock.now += 2.0
    rates = log.update(300, loss=np.float32(0.5), extra={"learning_rate": 1e-3})
    assert rates == {"global_step/sec": 100.0, "examples/sec": 12800.0}
    assert messages(caplog) == ["loss = 0.5, learning_rate = 0.001, step = 300 (2.000 sec)",
                                "global_step/sec: 100", "examples/sec: 12800"]


def test_one_line_per_multiple_crossed_whatever_the_loop_size(caplog, clock):
    caplog.set_level(logging.INFO, logger="estimator")
    log = StepLogger(every_steps=100, bar=False, clock=clock)
    logged = []
    for step in range(30, 601, 30):                         # loops of 30 steps: 30, 60, ..., 600
        clock.now += 1.0
        caplog.clear()
        log.update(step, loss=1.0)
        if messages(caplog):
            logged.append(step)
    assert logged == [120, 210, 300, 420, 510, 600]         # the first update reaching each multiple


def test_rates_cover_the_steps_since_the_last_log_line(caplog, clock):
    caplog.set_level(logging.INFO, logger="estimator")
    log = StepLogger(every_steps=10, bar=False, clock=clock)
    log.update(10)
    clock.now += 1.0
    assert log.update(15) == {}                             # no multiple crossed: no rate
    clock.now += 1.0
    assert log.update(20) == {"global_step/sec": 5.0}       # 10 steps in 2 seconds; no examples_per_step
    clock.now += 0.5
    assert log.update(30) == {"global_step/sec": 20.0}
    assert messages(caplog) == ["global_step/sec: 5", "global_step/sec: 20"]    # no loss: no loss line


def test_a_resumed_run_logs_from_its_initial_step(caplog, clock):
    caplog.set_level(logging.INFO, logger="estimator")
    log = StepLogger(every_steps=100, initial_step=5050, bar=False, clock=clock)
    log.update(5080, loss=1.0)
    assert messages(caplog) == []
    log.update(5110, loss=2.0)
    assert messages(caplog) == ["loss = 2, step = 5110"]


def test_a_clock_that_has_not_moved_gives_no_rate(clock):
    log = StepLogger(every_steps=1, bar=False, clock=clock)
    log.update(1)
    assert log.update(2) == {}


def test_no_bar_unless_stderr_is_a_terminal(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert not StepLogger(total_steps=10).has_bar
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    with StepLogger(total_steps=10) as log:
        assert log.has_bar
        log.update(10)
    assert "10/10" in terminal.getvalue()


def test_a_forced_bar_counts_steps_to_the_total(clock):
    out = io.StringIO()
    log = StepLogger(total_steps=500, every_steps=100, initial_step=100, bar=True, bar_file=out, desc="train",
                     clock=clock)
    assert log.has_bar
    for step in (200, 300, 400, 500):
        log.update(step, loss=0.25)
    log.close()
    final = out.getvalue().split("\r")[-1]
    assert final.startswith("train: 100%") and "500/500" in final and "loss=0.25" in final
    assert not log.has_bar
    log.close()                                             # idempotent
    assert out.getvalue().split("\r")[-1] == final


def test_an_unknown_total_still_counts(clock):
    out = io.StringIO()
    with StepLogger(bar=True, bar_file=out, clock=clock) as log:
        log.update(42)
    assert "42" in out.getvalue().split("\r")[-1]


def test_every_steps_must_be_positive():
    with pytest.raises(ValueError, match="every_steps"):
        StepLogger(every_steps=0, bar=False)


def test_logs_the_share_of_time_spent_waiting_for_input(caplog, clock):
    caplog.set_level(logging.INFO, logger="estimator")
    log = StepLogger(every_steps=100, bar=False, clock=clock)
    assert log.update(100, loss=1.0, input_wait_s=5.0) == {}        # the first line: no interval yet
    clock.now += 4.0
    caplog.clear()
    rates = log.update(200, loss=1.0, input_wait_s=6.0)
    assert rates == {"global_step/sec": 25.0, "input_wait_share": 0.25}
    assert messages(caplog)[-1] == "input wait: 25 % of the time"
    clock.now += 4.0
    assert "input_wait_share" not in log.update(300, loss=1.0)       # no figure given: none logged
