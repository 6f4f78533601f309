"""The suites' measuring processes: JAX starts in a child process per device count (``python -m
bench.suites.<suite> --child JSON``), so each measurement gets the devices it asks for and a clean XLA."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness.timing import log

__all__ = ["child_env", "run_child", "child_main"]


def child_env(devices: int | None) -> dict:
    """The measuring process's environment: ``devices`` CPU devices, or (None) JAX's default devices."""
    env = dict(os.environ)
    if devices is not None:
        flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", env.get("XLA_FLAGS", ""))
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
        env["JAX_PLATFORMS"] = "cpu"
    for name in ("JAX_NUM_CPU_DEVICES", "JAX_COMPILATION_CACHE_DIR", "JAX_ENABLE_COMPILATION_CACHE"):
        env.pop(name, None)
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_child(config: dict, timeout: float, module: str, suite: str) -> dict:
    """Runs ``python -m <module> --child <config as JSON>`` on ``config["devices"]`` CPU devices (None: JAX's
    default devices, an accelerator's where there is one); returns the JSON it wrote to ``config["out"]`` (a
    temporary file). The ``train`` and ``transfer`` suites' processes run here too."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{suite}-") as tmp:
        config = {**config, "out": os.path.join(tmp, "out.json")}
        cmd = [sys.executable, "-m", module, "--child", json.dumps(config)]
        try:
            done = subprocess.run(cmd, env=child_env(config["devices"]), cwd=str(Path(__file__).resolve().parents[2]),
                                  stdout=subprocess.PIPE, stderr=None, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{suite}: the {config['devices'] or 'default'}-device measurements took over "
                               f"{timeout:.0f} s (killed)") from None
        if done.stdout.strip():
            log(done.stdout.rstrip())
        if done.returncode != 0:
            raise RuntimeError(f"{suite}: the {config['devices'] or 'default'}-device measurements failed (exit status "
                               f"{done.returncode}; see the messages above)")
        with open(config["out"]) as f:
            return json.load(f)


def child_main(module: str, suite: str, child, argv=None) -> int:
    """The ``main`` of a suite's measuring process (``python -m <module> --child JSON``, see :func:`run_child`):
    ``child(config)`` with everything it prints sent to stderr."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=f"the {suite} suite's measuring process "
                                f"(run `python -m bench {suite}` instead)")
    p.add_argument("--child", required=True, metavar="JSON", help="what to measure (JSON)")
    args = p.parse_args(argv)
    sys.stdout = sys.stderr          # JAX's warnings and our progress: never mixed into the parent's report
    child(json.loads(args.child))
    return 0
