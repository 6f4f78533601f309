"""The machine a figure was measured on: its CPUs, memory, load, OS and library versions, and JAX's devices as a
fresh process sees them."""

from __future__ import annotations

import json
import os
import platform
import sys

__all__ = ["cpus_allowed", "machine_facts", "jax_devices"]


def cpus_allowed() -> int:
    """The CPUs this process may run on (its affinity; the CPU count where the OS has none)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _versions(*packages: str) -> dict:
    """Installed versions, read from the package metadata (nothing is imported: this process stays free of
    JAX, whose devices the suites' own processes choose)."""
    from importlib import metadata

    out = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


#: What a fresh process's JAX devices depend on: :func:`jax_devices` asks again only when one of them changed.
_DEVICE_ENVIRONMENT = ("JAX_PLATFORMS", "XLA_FLAGS", "CUDA_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS", "PATH",
                       "LD_LIBRARY_PATH")
_devices_seen: dict = {}


def jax_devices(timeout: float = 120.0) -> dict:
    """JAX's default backend and devices as a fresh process sees them (``{"backend": ..., "devices": [...]}``),
    or ``{"backend": None, "error": ...}``. A separate process: importing JAX here would fix its devices for
    the suites that set their own. Asked once per process and environment (a second bench run in the same
    process, as the tests make, takes the answer again: starting JAX costs a CPU-second or two)."""
    key = tuple(os.environ.get(name) for name in _DEVICE_ENVIRONMENT)
    if key not in _devices_seen:
        _devices_seen[key] = _ask_jax_devices(timeout)
    return json.loads(json.dumps(_devices_seen[key]))      # a copy the caller may change


def _ask_jax_devices(timeout: float) -> dict:
    import subprocess

    code = ("import json, jax; print(json.dumps({'backend': jax.default_backend(), "
            "'devices': sorted({f'{len(jax.devices())} x {d.device_kind}' for d in jax.devices()})}))")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
        if done.returncode == 0:
            return json.loads(done.stdout.strip().splitlines()[-1])
        err = (done.stderr.strip().splitlines() or ["exit status %d" % done.returncode])[-1]
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
        err = str(e)
    return {"backend": None, "error": err[:300]}


def machine_facts(extra: dict | None = None) -> dict:
    """CPU model, cores, memory, load, OS and library versions: what a figure depends on."""
    import numpy as np

    facts = {
        "host": platform.node(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_allowed": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": _memory_gib(),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        **_versions("jax", "jaxlib", "optax", "orbax-checkpoint", "pyarrow"),
    }
    try:
        from infeed.tfrecord import _tfrecord

        facts["crc32c"] = _tfrecord.crc32c_implementation()
    except ImportError:
        pass
    facts.update(extra or {})
    return facts
