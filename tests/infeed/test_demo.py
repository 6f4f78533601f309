"""`make demo`'s job, on a few records: both read paths check every value."""

from infeed import demo


def test_demo_checks_every_value_through_the_decoder_and_the_daemon(capsys, tmp_path):
    assert demo.main(["--records", "1000", "--shards", "3", "--batch-size", "64", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "every value matches the source" in out and "through infeed.Daemon" in out
    assert "padding rows are zeros" in out
