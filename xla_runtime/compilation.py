"""What compiling costs, and keeping its results: JAX's persistent compilation cache, and JAX's compile events
counted.

>>> import jax, jax.numpy as jnp
>>> with CompileWatch() as watch:
...     _ = jax.jit(lambda x: x * 3 + 1)(jnp.arange(5.0))
>>> watch.programs >= 1 and watch.compile_seconds > 0
True

:func:`enable_compilation_cache` keeps every program XLA compiles in a directory
too, so that another process compiling the same program (a restarted or preempted
job) reads it from there instead. JAX has one such cache per process: once a
directory is set, asking for another is an error (``ValueError``) rather than a
switch that would move every other user's programs in this process with it.

One jaxlib release hangs with it: under jaxlib 0.12.1, a program of several
processes on the CPU whose loop holds a collective (any multi-process
:class:`~xla_runtime.CompiledLoop`: its gradients are summed over the hosts inside
the loop) never returns when process 0 reads it from the cache while the others
compile it, which is what happens the second time such a program is built, since
only process 0 writes the cache. :func:`keep_cache_off_where_it_hangs` turns the
cache off in such a process, with a warning; multi-process loops call it before
their first compilation, and :func:`enable_compilation_cache` too.

:class:`CompileWatch` adds up, from :mod:`jax.monitoring`'s events, what JAX
compiled while it was open (in any thread of the process): seconds tracing,
lowering to StableHLO and compiling with XLA (on a persistent-cache hit, the
last is the time to read the executable from the cache), programs compiled,
persistent-cache hits and programs written to the cache.
"""

from __future__ import annotations

import logging
import os
import threading

import jax
import jax.monitoring
import jaxlib
from jax.experimental.compilation_cache import compilation_cache

__all__ = ["CompileWatch", "compilation_cache_dir", "enable_compilation_cache", "keep_cache_off_where_it_hangs"]

_log = logging.getLogger(__name__)

#: jaxlib releases under which a multi-process CPU program with a collective inside a loop hangs when process 0
#: reads it from the persistent cache and the other processes compile it (0.12.1: tests/xla_runtime/
#: test_multihost.py's test of a loop compiled again; 0.12.0.1, 0.10.2 and 0.7.1 run it).
CACHE_HANGS_MULTIPROCESS_CPU_LOOPS = frozenset({"0.12.1"})

#: jax.monitoring's events (jax 0.10.2): durations in seconds, and counted events.
TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_WRITE_EVENT = "/jax/compilation_cache/cache_misses"       # recorded as a missed program is written


def _normalised(directory) -> str:
    directory = os.fspath(directory)
    return directory if "://" in directory else os.path.abspath(directory)


def compilation_cache_dir() -> str | None:
    """The directory of this process's persistent compilation cache (JAX's ``jax_compilation_cache_dir``,
    also set by ``JAX_COMPILATION_CACHE_DIR``), or None."""
    return jax.config.jax_compilation_cache_dir or None


def enable_compilation_cache(directory) -> None:
    """Keeps every compiled program in ``directory`` too (JAX's persistent compilation cache), so a restarted
    job skips compilation. Every program is kept, however quick to compile or small (JAX's thresholds of
    1 s and its size floor would leave out most CPU programs); a local directory is made if missing.

    The cache is the process's: the same directory again changes nothing, another one raises ``ValueError``
    (JAX reads its cache directory once, at the first compilation that uses it).
    """
    wanted = _normalised(directory)
    current = compilation_cache_dir()
    if current is not None and _normalised(current) != wanted:
        raise ValueError(f"this process already keeps its compiled programs in {current} (JAX has one persistent "
                         f"compilation cache per process): {wanted} cannot be used too; use the same directory, or "
                         f"none, or another process")
    if "://" not in wanted:
        os.makedirs(wanted, exist_ok=True)
    if current is None:
        jax.config.update("jax_enable_compilation_cache", True)
        jax.config.update("jax_compilation_cache_dir", wanted)
        # JAX decides at a process's first compilation whether the cache is used, and remembers: a process that
        # compiled with the cache disabled (JAX_ENABLE_COMPILATION_CACHE=false) would never use it. No cache was
        # set up (no directory), so this only makes JAX decide again.
        compilation_cache.reset_cache()
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if jax.distributed.is_initialized():        # else the process count is not known yet (and asking would start
        keep_cache_off_where_it_hangs()         # the backend before jax.distributed.initialize): the loops ask


def cache_hangs_here(jaxlib_version: str, process_count: int, platform: str) -> bool:
    """Whether the persistent cache would hang a multi-process loop of this jaxlib, process count and platform."""
    return jaxlib_version in CACHE_HANGS_MULTIPROCESS_CPU_LOOPS and process_count > 1 and platform == "cpu"


def keep_cache_off_where_it_hangs() -> bool:
    """Turns JAX's persistent compilation cache off in this process when it is one of several on the CPU under a
    jaxlib of :data:`CACHE_HANGS_MULTIPROCESS_CPU_LOOPS` and the cache is on, with a warning (once: off, it stays
    off); True when the cache is off for that reason. Every process decides alike, so none reads a program the others compile.
    Call it after ``jax.distributed.initialize``."""
    if not cache_hangs_here(jaxlib.__version__, jax.process_count(), jax.default_backend()):
        return False
    if compilation_cache_dir() is not None and jax.config.jax_enable_compilation_cache:
        jax.config.update("jax_enable_compilation_cache", False)
        compilation_cache.reset_cache()         # JAX decided at the first compilation: it decides again
        _log.warning("the persistent compilation cache (%s) is off in this process: under jaxlib %s, a loop of "
                     "several processes on the CPU hangs when process 0 reads it from the cache while the others "
                     "compile it; jaxlib 0.12.0.1 keeps it", compilation_cache_dir(), jaxlib.__version__)
    return True


class CompileWatch:
    """What JAX compiled while this was open (``with CompileWatch() as watch:``), from jax.monitoring's events.

    ``trace_seconds``: tracing Python to jaxprs; ``lower_seconds``: jaxprs to StableHLO;
    ``compilations``: the seconds of each of XLA's compilations (or of reading its executable from the
    persistent cache), in order; ``compile_seconds``: their sum; ``programs``: their number;
    ``cache_hits``: programs read from the persistent cache; ``cache_writes``: programs compiled and written
    to it.
    """

    def __init__(self):
        self.trace_seconds = self.lower_seconds = 0.0
        self.compilations: list[float] = []
        self.cache_hits = self.cache_writes = 0

    @property
    def compile_seconds(self) -> float:
        return sum(self.compilations)

    @property
    def programs(self) -> int:
        return len(self.compilations)

    @property
    def seconds(self) -> float:
        """Tracing, lowering and compiling together: what a jitted function's first call adds to its run."""
        return self.trace_seconds + self.lower_seconds + self.compile_seconds

    def _duration(self, event: str, duration: float, **kwargs) -> None:
        if event == COMPILE_EVENT:
            self.compilations.append(duration)
        elif event == TRACE_EVENT:
            self.trace_seconds += duration
        elif event == LOWER_EVENT:
            self.lower_seconds += duration

    def _event(self, event: str, **kwargs) -> None:
        if event == CACHE_HIT_EVENT:
            self.cache_hits += 1
        elif event == CACHE_WRITE_EVENT:
            self.cache_writes += 1

    def __enter__(self) -> "CompileWatch":
        global _listening
        with _watches_lock:
            if not _listening:
                # Registered once per process and never unregistered: jax.monitoring has no public
                # unregister_* before jax 0.8.1, and clear_event_listeners would drop every other user's too.
                jax.monitoring.register_event_duration_secs_listener(_forward_duration)
                jax.monitoring.register_event_listener(_forward_event)
                _listening = True
            _watches.append(self)
        return self

    def __exit__(self, *exc) -> None:
        with _watches_lock:
            _watches.remove(self)

    def as_dict(self) -> dict:
        """The counts and seconds, as a dict (for JSON)."""
        return {"trace_seconds": self.trace_seconds, "lower_seconds": self.lower_seconds,
                "compile_seconds": self.compile_seconds, "programs": self.programs, "cache_hits": self.cache_hits,
                "cache_writes": self.cache_writes}


#: The open watches, which the process's one pair of listeners forwards jax.monitoring's events to.
_watches: list[CompileWatch] = []
_watches_lock = threading.Lock()
_listening = False


def _forward_duration(event: str, duration: float, **kwargs) -> None:
    with _watches_lock:
        watches = tuple(_watches)
    for watch in watches:
        watch._duration(event, duration, **kwargs)


def _forward_event(event: str, **kwargs) -> None:
    with _watches_lock:
        watches = tuple(_watches)
    for watch in watches:
        watch._event(event, **kwargs)
