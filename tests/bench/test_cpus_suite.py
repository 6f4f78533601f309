"""`python -m bench cpus`: one decoder pinned to each CPU, timed alone and with the others busy."""

import os

import pytest

from bench import __main__ as bench_main
from bench import harness
from bench.suites import cpus_suite as suite


def test_every_cpu_is_timed_alone_and_at_once_with_the_ratios_of_the_machine(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    result = suite.run(quick=True, repeats=1, data_dir=str(tmp_path))
    groups = sorted({n for n in (len(cpus) // 2, len(cpus)) if n >= 2})
    expected = {("alone", suite.alone_name(c)) for c in cpus}
    expected |= {(suite.at_once_group(n), suite.alone_name(c)) for n in groups for c in cpus[:n]}
    assert {(f.group, f.name) for f in result.figures} == expected
    assert all(f.records == suite.PHOTOS * 2 and f.records_per_s > 0 and f.repeats == 1 for f in result.figures)
    ratios = {(r.group, r.name): r.value for r in result.ratios}
    rate = {(f.group, f.name): f.records_per_s for f in result.figures}
    alone = [rate["alone", suite.alone_name(c)] for c in cpus]
    assert ratios["alone", "slowest CPU / fastest CPU"] == pytest.approx(min(alone) / max(alone))
    for n in groups:
        group = suite.at_once_group(n)
        busy = [rate[group, suite.alone_name(c)] for c in cpus[:n]]
        assert ratios[group, f"{group} / alone, in all"] == pytest.approx(sum(busy) / sum(alone[:n]))
        assert 0 < ratios[group, "slowest CPU / fastest CPU"] <= 1
    assert "each process pinned to its CPU" in harness.format_result(result)
    assert "cpus" in bench_main.SUITES


def test_a_decoder_that_cannot_start_is_an_error_not_a_hang(tmp_path):
    with pytest.raises(RuntimeError, match="the decoder on CPU 0 failed to start"):
        suite._Decoder(0, str(tmp_path / "missing.tfrecord"), 1)
