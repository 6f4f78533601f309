"""What every suite stands on: its cases timed (:mod:`~bench.harness.timing`), what it measured and the results
file (:mod:`~bench.harness.results`), the tables printed (:mod:`~bench.harness.tables`), the machine's facts
(:mod:`~bench.harness.machine`); :mod:`~bench.harness.children` runs a suite's measuring process."""

from bench.harness.machine import cpus_allowed, jax_devices, machine_facts
from bench.harness.results import (NOISE_BOUND, OVER_W, OVER_W_NOTE, QUARTILE_RUNS, SHORT_SECONDS,
                                   STEADY_BATCHES_PER_WORKER, Figure, Ratio, Refusal, Refused, SuiteResult, Timing,
                                   daemon_batches, noise_flag, read_json, relative_spread, stage_breakdown,
                                   steady_refusal, write_json)
from bench.harness.tables import (format_ratios, format_result, format_scaling, format_table, format_timings,
                                  scaling_rows, target_text)
from bench.harness.timing import (Case, Measurement, heap_frozen, interleave, log, pinned_to_one_cpu,
                                  settle_allocator)

__all__ = ["Case", "Figure", "Measurement", "NOISE_BOUND", "OVER_W", "OVER_W_NOTE", "QUARTILE_RUNS", "Ratio",
           "Refusal", "Refused", "SHORT_SECONDS", "STEADY_BATCHES_PER_WORKER", "SuiteResult", "Timing",
           "cpus_allowed", "daemon_batches", "format_ratios", "format_result", "format_scaling", "format_table",
           "format_timings", "heap_frozen", "interleave", "jax_devices", "log", "machine_facts", "noise_flag",
           "pinned_to_one_cpu", "read_json", "relative_spread", "scaling_rows", "settle_allocator", "stage_breakdown",
           "steady_refusal", "target_text", "write_json"]
