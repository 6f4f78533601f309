"""StepLogger: TPUEstimator's log lines at their cadence, rates from an injected clock, and the tqdm bar; where
the lines go (the estimator logger's own handler only while the application has configured no logging)."""

import contextlib
import io
import logging

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import estimator as est
from estimator.loop import progress
from estimator.loop.progress import StepLogger, default_log_handler


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


def test_quiet_measures_the_rates_and_logs_nothing(caplog, clock):
    caplog.set_level(logging.INFO, logger="estimator")
    log = StepLogger(every_steps=10, examples_per_step=4, bar=False, quiet=True, clock=clock)
    log.update(10, loss=1.0, input_wait_s=0.0)
    clock.now += 2.0
    assert log.update(20, loss=0.5, input_wait_s=1.0) == {"global_step/sec": 5.0, "examples/sec": 20.0,
                                                          "input_wait_share": 0.5}
    assert messages(caplog) == []


# --- where the lines go -----------------------------------------------------------------------

@contextlib.contextmanager
def unconfigured_logging():
    """The state of a program that has configured no logging (pytest's own handlers set aside), restored after."""
    root, logger = logging.getLogger(), logging.getLogger("estimator")
    saved = root.handlers[:], logger.handlers[:], logger.level, logger.propagate, progress._LEVEL_SET.copy()
    root.handlers[:], logger.handlers[:] = [], []
    logger.setLevel(logging.NOTSET)
    progress._LEVEL_SET.clear()
    try:
        yield logger
    finally:
        root.handlers[:], logger.handlers[:] = saved[:2]
        logger.setLevel(saved[2])
        logger.propagate = saved[3]
        progress._LEVEL_SET.clear()
        progress._LEVEL_SET.update(saved[4])


class Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_the_estimator_logger_gets_a_handler_only_when_the_application_has_configured_none(capsys):
    with unconfigured_logging() as logger:
        assert default_log_handler() and logger.level == logging.INFO
        assert default_log_handler() and len(logger.handlers) == 1          # once, however often asked
        logger.info("loss = 0.5, step = 100")
        assert capsys.readouterr().err == "INFO:estimator:loss = 0.5, step = 100\n"
        app = Collect()
        logging.getLogger().addHandler(app)          # a root handler later (the application's, or absl's)
        logger.info("step = 200")
        assert capsys.readouterr().err == "" and app.lines == ["step = 200"]       # once, through the root's
        assert default_log_handler() and logger.level == logging.INFO              # the level stays
        assert not default_log_handler(enabled=False)                              # quiet: all taken back
        assert logger.handlers == [] and logger.level == logging.NOTSET
    with unconfigured_logging() as logger:
        app = Collect()
        logging.getLogger().addHandler(app)          # the application configured logging first: its handlers only
        assert not default_log_handler() and logger.handlers == [] and logger.level == logging.INFO
        logger.info("step = 300")
        assert capsys.readouterr().err == "" and app.lines == ["step = 300"]
        default_log_handler(enabled=False)
    with unconfigured_logging() as logger:
        own = Collect()
        logger.addHandler(own)                       # or a handler of its own on the estimator logger
        assert not default_log_handler() and logger.handlers == [own]
    with unconfigured_logging() as logger:
        logger.setLevel(logging.WARNING)             # a level the application chose is kept, and stays
        assert default_log_handler() and logger.level == logging.WARNING
        assert not default_log_handler(enabled=False) and logger.handlers == [] and logger.level == logging.WARNING


def model_fn(variables, features, labels, mode, params):
    return est.EstimatorSpec(mode, loss=jnp.mean((features["x"] @ variables["params"]["w"] - labels) ** 2))


class Repeat:
    """One batch again and again, from an iterator that says where it is (so train() does not warn)."""

    def __init__(self, batch):
        self.batch = batch

    def __iter__(self):
        return self

    def __next__(self):
        return self.batch

    def get_state(self):
        return {}

    def set_state(self, state):
        pass


def train(model_dir, log_step_count_steps, max_steps=20, **config):
    x = np.ones((8, 3), np.float32)
    config = est.RunConfig(model_dir=str(model_dir), **{"iterations_per_loop": 5, "save_summary_steps": 10,
                                                       "log_step_count_steps": log_step_count_steps, **config})
    e = est.Estimator(model_fn, lambda rng, features: {"params": {"w": jnp.zeros(3)}}, optax.sgd(0.1), config,
                      train_batch_size=8)
    e.train(lambda params: Repeat(({"x": x}, np.ones(8, np.float32))), max_steps=max_steps)
    return e


def test_a_30_step_run_logs_as_tpuestimator_does(tmp_path, capsys):
    """TPUEstimator's lines, with the default cadence (log_step_count_steps=100): the first step's loss, each
    save, the final step's loss; the checkpoints that keep_checkpoint_max deletes only at DEBUG."""
    with unconfigured_logging():
        train(tmp_path, est.RunConfig.log_step_count_steps, max_steps=30, save_checkpoints_steps=10,
              keep_checkpoint_max=1)
        err = capsys.readouterr().err.splitlines()
    directory = tmp_path / "checkpoints"
    assert [line.split(" = ")[0] if line.startswith("INFO:estimator:loss") else line.rsplit(": ", 1)[0]
            for line in err] == [
        "INFO:estimator:loss",
        f"INFO:estimator.checkpoints:Saving checkpoints for 10 into {directory}.",
        f"INFO:estimator.checkpoints:Saving checkpoints for 20 into {directory}.",
        f"INFO:estimator.checkpoints:Saving checkpoints for 30 into {directory}.",
        "INFO:estimator:Loss for final step"]
    first_loss = float(err[0].split("loss = ")[1].split(",")[0])
    assert err[0] == f"INFO:estimator:loss = {first_loss:g}, step = 1"
    assert first_loss == pytest.approx(1.0)                  # w = 0: the loss of step 1 is mean(1 ** 2)
    final_loss = float(err[-1].rsplit(": ", 1)[1].rstrip("."))
    assert 0 <= final_loss < first_loss and err[-1].endswith(f"{final_loss:g}.")
    assert sorted(p.name for p in directory.iterdir() if p.name.isdigit()) == ["30"]       # 10 and 20 deleted


def test_the_first_step_is_logged_once_when_it_ends_a_logged_loop(caplog, clock):
    caplog.set_level(logging.INFO, logger="estimator")
    log = StepLogger(every_steps=1, bar=False, clock=clock)
    log.first_step(1, loss=2.0)
    log.update(1, loss=2.0)
    clock.now += 1.0
    log.update(2, loss=1.0)
    assert messages(caplog) == ["loss = 2, step = 1", "loss = 1, step = 2 (1.000 sec)", "global_step/sec: 1"]


def test_a_resumed_train_call_logs_its_own_first_step_and_quiet_logs_neither_loss_line(tmp_path, capsys):
    with unconfigured_logging():
        e = train(tmp_path, 100, max_steps=10)
        capsys.readouterr()
        e.train(lambda params: Repeat(({"x": np.ones((8, 3), np.float32)}, np.ones(8, np.float32))), max_steps=15)
        err = capsys.readouterr().err.splitlines()
        assert [line for line in err if ", step = " in line][0].endswith(", step = 11")
        assert err[-1].startswith("INFO:estimator:Loss for final step: ")
        train(tmp_path / "quiet", None, max_steps=10)
        assert capsys.readouterr().err == ""


def test_an_estimator_logs_its_progress_at_info_by_default_and_nothing_when_quiet(tmp_path, capsys):
    with unconfigured_logging():
        train(tmp_path / "default", 10)
        err = capsys.readouterr().err.splitlines()
        assert [line.split(", step = ")[1].split()[0] for line in err if ", step = " in line] == ["1", "10", "20"]
        assert err[0].startswith("INFO:estimator:loss = ")
        assert any(line.startswith("INFO:estimator:global_step/sec: ") for line in err)
        assert any(line.startswith("INFO:estimator:examples/sec: ") for line in err)
        assert any(line.startswith("INFO:estimator:input wait: ") for line in err)
        train(tmp_path / "quiet", None)
        assert capsys.readouterr().err == "" and logging.getLogger("estimator").handlers == []
        assert "global_step/sec" in est.summaries.read_scalars(tmp_path / "quiet")        # still measured
        logging.getLogger("estimator").warning("a warning")          # still shown (a root handler or Python's
        assert capsys.readouterr().err.endswith("a warning\n")      # last resort)


def test_an_application_that_configured_logging_gets_each_line_once(tmp_path, capsys):
    with unconfigured_logging():
        app, root = Collect(), logging.getLogger()
        root.addHandler(app)
        level = root.level
        root.setLevel(logging.INFO)                  # as logging.basicConfig(level=logging.INFO) does
        try:
            train(tmp_path, 10)
        finally:
            root.setLevel(level)
        assert capsys.readouterr().err == ""
        assert [line.split(", step = ")[1].split()[0] for line in app.lines if ", step = " in line] == \
            ["1", "10", "20"]
