"""Benchmarks: ``python -m bench <suite>`` prints a table of figures and saves them with a report.

:mod:`bench.suites` holds the suites; :mod:`bench.harness` times their cases and holds what they measured;
:mod:`bench.data` writes the data they read; :mod:`bench.report` draws a results file's report, plots and
comparison; :mod:`bench.peers` holds what infeed is measured against or through (servers, a proxy, other
decoders).
"""

from bench.harness import Case, Figure, Ratio, SuiteResult

__all__ = ["Case", "Figure", "Ratio", "SuiteResult"]
