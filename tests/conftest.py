import atexit
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Multi-device code runs on 8 CPU "devices"; XLA reads this when JAX first starts, so set it before any import.
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# numpy's BLAS on one thread in the suite's processes and every child of theirs (examples, bench suites): the
# xdist workers already take a CPU each, and an OpenBLAS pool of a thread per CPU in each process costs about
# 0.15 CPU-seconds at start-up alone. The daemon's workers default to it anyway (WORKER_THREAD_DEFAULTS).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# One persistent XLA cache for the run, made by the first process (pytest, or xdist's controller, before it starts
# its workers, which inherit it) and removed by it at the end: the suite compiles the same small programs in many
# tests (an estimator's loop, evaluation and export), and a program compiled once is read back in the others
# (about a fifth of the estimator tests' CPU time). Every program is kept, however quick to compile (JAX's floor is
# 1 s). The tests of the cache itself clear it first (the ``jax_cache_settings`` fixture, fresh processes).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    SUITE_XLA_CACHE = tempfile.mkdtemp(prefix="infeed-suite-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = SUITE_XLA_CACHE
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    atexit.register(shutil.rmtree, SUITE_XLA_CACHE, ignore_errors=True)

import pytest

# A suite started in the background of a shell without job control (`make test &` in a script, nohup) inherits
# SIGINT ignored, and so would every child it starts: Python installs no handler in a process started so, and the
# tests that interrupt a child with Ctrl-C would wait for it in vain. The suite's own processes take the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True, scope="session")
def _kept_indexes_apart(tmp_path_factory):
    """The suite's indexes kept apart from the data go to a directory of its own, never the user's cache
    (``INFEED_INDEX_DIR``: the default index_dir of every Dataset, `infeed` command and child process)."""
    saved = os.environ.get("INFEED_INDEX_DIR")
    os.environ["INFEED_INDEX_DIR"] = str(tmp_path_factory.mktemp("kept-indexes"))
    yield
    if saved is None:
        os.environ.pop("INFEED_INDEX_DIR", None)
    else:
        os.environ["INFEED_INDEX_DIR"] = saved


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """pytest-benchmark tests run once, as plain tests, unless timing is asked for (``--benchmark-only`` or
    ``--benchmark-enable``): so ``make test`` stays quick and ``pytest --benchmark-only`` times the kernels."""
    if not (config.getoption("benchmark_only", False) or config.getoption("benchmark_enable", False)):
        config.option.benchmark_disable = True


def _inherited_signal_state() -> str:
    """What a child started now would inherit that stops Ctrl-C or SIGTERM reaching it: either ignored, or signals
    blocked in this thread ('' when none)."""
    notes = []
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        notes.append("SIGINT is ignored in this process: children inherit SIG_IGN and Python installs no handler")
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        notes.append("SIGTERM is ignored in this process: children inherit SIG_IGN, and SIGTERM kills none of them")
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if blocked:
        notes.append(f"signals blocked in this thread, inherited by children: {sorted(s.name for s in blocked)}")
    return "\n".join(notes)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report says so when this process would start children deaf to SIGINT (how the suite's
    background launch was found: four tests that interrupt a child failed together, in the runs started so)."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        state = _inherited_signal_state()
        if state:
            report.sections.append(("signal state", state))


#: Where each test's CPU time goes, when set: a file per pytest process, ``<value>.<pid>.tsv``, a line a test with
#: this process's CPU-seconds, its waited-for children's, the wall seconds and the test's id (where to look when
#: the suite outgrows its 6 minutes: ``make test`` is CPU-bound on 2 cores, so its time is its CPU over 2).
CPU_LOG = os.environ.get("INFEED_TEST_CPU_LOG")


def _cpu_seconds() -> tuple[float, float]:
    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, waited.ru_utime + waited.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not CPU_LOG:
        yield
        return
    (own, waited), started = _cpu_seconds(), time.monotonic()
    yield
    own_after, waited_after = _cpu_seconds()
    with open(f"{CPU_LOG}.{os.getpid()}.tsv", "a") as log:
        log.write(f"{own_after - own:.2f}\t{waited_after - waited:.2f}\t{time.monotonic() - started:.2f}\t"
                  f"{item.nodeid}\n")


#: TensorFlow-written conformance files, beside the project's checkout.
FIXTURES = Path(os.environ.get("INFEED_FIXTURES", Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "tfrecord"))


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not (FIXTURES / "expected.json").exists():
        pytest.skip(f"TensorFlow fixtures not found at {FIXTURES} (set INFEED_FIXTURES)")
    return FIXTURES

ROOT = str(Path(__file__).resolve().parents[1])


#: The first line of each two-process worker (whose source starts with an empty line, so its line numbers stay):
#: a process whose main code raises prints the traceback and exits at once (else jax.distributed's shutdown at
#: exit would wait for the other, which waits for it in a collective), and SIGUSR1 prints every thread's stack.
_WORKER_PREAMBLE = ("import faulthandler, os, signal, sys, traceback; "
                    "faulthandler.register(signal.SIGUSR1, all_threads=True); "
                    "sys.excepthook = lambda kind, value, tb: (traceback.print_exception(kind, value, tb), "
                    "sys.stdout.flush(), sys.stderr.flush(), os._exit(1))")


@pytest.fixture
def run_two_processes(tmp_path):
    """``run(worker, *args, timeout=, env=)``: runs the Python source ``worker`` in two processes on 4 CPU
    devices each, with ``sys.argv[1:] == [coordinator address, process id, *args]`` (the project
    importable; ``env``: variables to add to theirs), and returns the JSON each printed last, in process
    order. Both are watched at once: when one fails, or ``timeout`` seconds pass, the others print their
    stacks and are stopped, and the test fails showing every process's stderr."""
    def run(worker: str, *args: str, timeout: float = 120, env: dict | None = None) -> list:
        with socket.socket() as s:
            s.bind(("localhost", 0))
            address = f"localhost:{s.getsockname()[1]}"
        env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4",
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
        logs = [(tmp_path / f"process-{i}.stdout", tmp_path / f"process-{i}.stderr") for i in range(2)]
        procs, unfinished = [], []
        try:
            for i, (out, err) in enumerate(logs):
                with open(out, "w") as out_file, open(err, "w") as err_file:
                    procs.append(subprocess.Popen([sys.executable, "-c", _WORKER_PREAMBLE + worker, address, str(i),
                                                   *args], env=env, stdout=out_file, stderr=err_file))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                statuses = [p.poll() for p in procs]
                if None not in statuses or any(statuses):      # all done, or one failed
                    break
                time.sleep(0.1)
            unfinished = [p for p in procs if p.poll() is None]
            for p in unfinished:
                p.send_signal(signal.SIGUSR1)
            if unfinished:
                time.sleep(1)
        finally:
            for p in procs:
                p.kill()
                p.wait()
        if unfinished or any(p.returncode for p in procs):
            why = "the other failed" if any(p.returncode for p in procs if p not in unfinished) else f"{timeout} s"
            told = [f"process {i}: " + (f"stopped unfinished after {why}" if p in unfinished else
                                        f"exit status {p.returncode}") + "; its stderr ends:\n" + err.read_text()[-4000:]
                    for i, (p, (_, err)) in enumerate(zip(procs, logs))]
            pytest.fail("\n\n".join(told), pytrace=False)
        return [json.loads(out.read_text().strip().splitlines()[-1]) for out, _ in logs]
    return run


# The atheris harness and the soak are programs, not test modules: keep --doctest-modules out of them.
collect_ignore = ["fuzz/fuzz_infeed.py", "soak/soak_daemon.py"]


@pytest.fixture
def jax_cache_settings():
    """Puts JAX's persistent-cache settings back after a test that sets them (and compiles nothing meanwhile:
    a program compiled then would go to the test's cache)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    names = ("jax_compilation_cache_dir", "jax_enable_compilation_cache", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    saved = {name: getattr(jax.config, name) for name in names}
    jax.config.update("jax_compilation_cache_dir", None)          # the suite's own (above): the test starts without
    compilation_cache.reset_cache()
    yield
    for name, value in saved.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()
