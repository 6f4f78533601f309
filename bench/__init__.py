"""Benchmarks: ``python -m bench <suite>`` prints a table of figures and, with --json, saves them.

Suites: ``decode`` (TFRecord reading and Example decoding against tf.data, see
:mod:`bench.decode`).  Timing and reporting live in :mod:`bench.harness`, the
datasets in :mod:`bench.datasets`.
"""

from bench.harness import Case, Figure, Ratio, SuiteResult

__all__ = ["Case", "Figure", "Ratio", "SuiteResult"]
