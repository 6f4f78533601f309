"""The ``transfer`` suite: on an accelerator, host-to-device bandwidth from a pinned ring slot, and the compiled
loop on the device.

In one process on JAX's default device (``python -m bench.suites.transfer_suite
--child``; the parent never imports JAX), where that is not a CPU:

- ``host-to-device from a pinned ring slot``: ``jax.device_put`` of one
  ``--transfer-mb`` MB slot of an ``infeed.Ring`` (``lock_memory=True``) whose
  slots ``Ring.pin()`` registered with CUDA as page-locked host memory, so the
  copy is one DMA; then ``block_until_ready``. Whether ``pin()`` succeeded is
  in the notes (without it the row is an ordinary pageable copy).
- ``host-to-device from pageable numpy``: the same bytes from a plain numpy
  array (the driver stages them through its own pinned buffer).
- ``device-to-host into numpy``: ``np.asarray`` of a device array.
- ``device copy (read + write)``: a jitted ``x + 1`` over the device array,
  counted as twice its bytes: the device's own memory bandwidth, what no
  transfer can beat.

Each figure's MB/s is bytes / seconds (MB = 10**6 bytes), median of the runs
after a warm-up, interleaved. Then the loop suite's mlp and tiny models run on
the device (``compile_loop`` K=1, 10, 100 against a per-step loop and a
hand-written scan; see :mod:`bench.suites.loop_suite`), in the same process.

On a CPU-only machine the suite measures nothing and says so: CPU "devices"
share the host's memory (the ``loop`` and ``train`` suites measure them).
"""

from __future__ import annotations

import json
import sys
import time

from bench.harness import Case, Measurement, Ratio, SuiteResult, interleave, log
from bench.harness.children import child_main, run_child
from bench.suites.loop_suite import _add_group, _measure_model, default_steps

__all__ = ["run", "PINNED", "PAGEABLE", "TO_HOST", "DEVICE_COPY", "TRANSFER_MB", "MODELS"]

SUITE = "transfer"
PINNED = "host-to-device from a pinned ring slot"
PAGEABLE = "host-to-device from pageable numpy"
TO_HOST = "device-to-host into numpy"
DEVICE_COPY = "device copy (read + write)"
#: Bytes per transfer, in MB (10**6 bytes).
TRANSFER_MB = 256
#: The loop suite's models run on the device.
MODELS = ("mlp", "tiny")
CHILD_TIMEOUT = 1200
SKIPPED = ("transfer suite skipped: JAX's default backend here is the CPU (no GPU or TPU); on an accelerator it "
           "measures host-to-device bandwidth from a pinned ring slot against pageable memory and the device's own "
           "copy bandwidth, and the compiled loop on the device")


def _transfers(nbytes: int, repeats: int) -> dict:
    import jax
    import numpy as np

    import infeed

    device = jax.devices()[0]
    with infeed.Ring.create({"x": ((nbytes,), np.uint8)}, slots=1, lock_memory=True) as ring:
        pinned = ring.pin()
        slot = ring.slot_arrays(0)["x"]
        slot[:] = 1
        pageable = np.ones(nbytes, np.uint8)
        on_device = jax.device_put(pageable, device)
        plus_one = jax.jit(lambda x: x + 1)

        def put(host):
            def run() -> int:
                x = jax.device_put(host, device)
                x.block_until_ready()
                x.delete()
                return nbytes
            return run

        def to_host() -> int:
            return np.asarray(on_device).nbytes

        def device_copy() -> int:
            y = plus_one(on_device)
            y.block_until_ready()
            y.delete()
            return nbytes

        cases = [Case(PINNED, put(slot), nbytes, nbytes), Case(PAGEABLE, put(pageable), nbytes, nbytes),
                 Case(TO_HOST, to_host, nbytes, nbytes), Case(DEVICE_COPY, device_copy, nbytes, 2 * nbytes)]
        measured = interleave(cases, repeats)
        if not np.array_equal(np.asarray(jax.device_put(slot[:4096], device)), slot[:4096]):
            raise RuntimeError("the pinned slot's bytes arrived changed on the device")
    return {"pinned": pinned, "device": str(device), "device_kind": device.device_kind,
            "seconds": {m.case.name: m.seconds for m in measured},
            "nbytes": {c.name: c.nbytes for c in cases}}


def _child(config: dict) -> None:
    import jax

    out = {"jax": jax.__version__, "backend": jax.default_backend(), "devices": len(jax.devices())}
    if out["backend"] != "cpu" or config.get("allow_cpu"):
        out["transfers"] = _transfers(config["nbytes"], config["repeats"])
        out["models"] = {}
        for model in config["models"]:
            got = _measure_model(model, config["steps"][model], config["repeats"], config["ttfs_samples"], False)
            out["models"][model] = got
    with open(config["out"], "w") as f:
        json.dump(out, f)


def run(*, quick: bool = False, repeats: int | None = None, transfer_mb: float = TRANSFER_MB,
        models=MODELS, allow_cpu: bool = False, timeout: float = CHILD_TIMEOUT) -> SuiteResult:
    """Measures on JAX's default device in a new process; figures only where that is an accelerator.

    allow_cpu: measure on a CPU backend too (the tests' check of this code; no figure to quote).
    """
    repeats = repeats if repeats is not None else (3 if quick else 7)
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if not transfer_mb > 0:
        raise ValueError(f"transfer_mb must be positive, got {transfer_mb}")
    nbytes = int(transfer_mb * 1e6)
    result = SuiteResult(SUITE, group_label="device", name_label="transfer",
                         params={"repeats": repeats, "warmup": 1, "nbytes": nbytes, "models": list(models)})
    started = time.perf_counter()
    log("transfer: measuring on JAX's default device in a new process ...")
    child = run_child({"devices": None, "nbytes": nbytes, "repeats": repeats, "models": list(models),
                       "steps": {m: default_steps(m, 1, quick) for m in models}, "ttfs_samples": 1 if quick else 3,
                       "allow_cpu": allow_cpu}, timeout, module="bench.suites.transfer_suite", suite=SUITE)
    result.params.update(jax=child["jax"], backend=child["backend"], devices=child["devices"])
    if "transfers" not in child:
        result.notes.append(SKIPPED)
        return result
    t = child["transfers"]
    group = f"{t['device_kind']} ({child['backend']})"
    for name, seconds in t["seconds"].items():
        result.figures.append(Measurement(Case(name, lambda: 0, 1, t["nbytes"][name]), seconds).figure(SUITE, group))
    mb = {f.name: f.mb_per_s for f in result.figures}
    for num, den in ((PINNED, PAGEABLE), (PINNED, DEVICE_COPY)):
        result.ratios.append(Ratio(SUITE, group, f"{num} / {den}", mb[num] / mb[den]))
    for model, got in child["models"].items():
        got["group"] = f"{model}, {child['devices']} {child['backend']} device{'s' if child['devices'] > 1 else ''}"
        _add_group(result, model, got, False, suite=SUITE)
    result.params["seconds"] = round(time.perf_counter() - started, 1)
    result.notes += [
        f"{group}: {nbytes / 1e6:,.0f} MB per transfer; records/s = transfers/s; MB/s = bytes moved / s (the device "
        f"copy counts its read and its write). The ring slot was {'pinned' if t['pinned'] else 'NOT pinned'} "
        "(Ring.pin(): CUDA host registration); each figure the median of the stated runs after one warm-up, "
        "interleaved.",
        "the loop rows: the loop suite's models on the device (see python -m bench loop), figures in steps/s "
        "(batches/s), first losses checked against the per-step loop's."]
    return result


def main(argv=None) -> int:
    return child_main("bench.suites.transfer_suite", SUITE, _child, argv)


if __name__ == "__main__":
    sys.exit(main())
