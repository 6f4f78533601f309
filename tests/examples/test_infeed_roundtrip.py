"""examples/infeed_roundtrip.py (`make demo`'s first job), on a few records: both read paths check every value."""

def test_demo_checks_every_value_through_the_decoder_and_the_daemon(capsys, tmp_path, load_example):
    argv = ["--records", "1000", "--shards", "3", "--batch-size", "64", "--dir", str(tmp_path)]
    assert load_example("infeed_roundtrip").main(argv) == 0
    out = capsys.readouterr().out
    assert "every value matches the source" in out and "through infeed.Daemon" in out
    assert "padding rows are zeros" in out
