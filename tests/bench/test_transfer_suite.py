"""``python -m bench transfer``: skipped with a note on a CPU backend; its measuring code checked on the CPU."""

from bench import __main__ as bench_main
from bench.suites import transfer_suite


def test_skipped_with_a_note_on_a_cpu_backend(capsys, monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert bench_main.main(["transfer", "--no-save"]) == 0
    out = capsys.readouterr().out
    assert "== transfer ==" in out and transfer_suite.SKIPPED in out


def test_measures_every_transfer_and_checks_the_bytes_when_allowed_on_cpu(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    r = transfer_suite.run(repeats=1, transfer_mb=2, models=(), allow_cpu=True)
    assert [f.name for f in r.figures] == [transfer_suite.PINNED, transfer_suite.PAGEABLE, transfer_suite.TO_HOST,
                                           transfer_suite.DEVICE_COPY]
    assert all(f.nbytes == 2_000_000 for f in r.figures[:3]) and r.figures[3].nbytes == 4_000_000
    assert [x.name for x in r.ratios] == [f"{transfer_suite.PINNED} / {transfer_suite.PAGEABLE}",
                                          f"{transfer_suite.PINNED} / {transfer_suite.DEVICE_COPY}"]
    assert "NOT pinned" in r.notes[0]          # no CUDA here: Ring.pin() says so, the row is a plain copy
