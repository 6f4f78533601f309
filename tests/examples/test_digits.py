"""examples/digits.py (`make demo`'s main job), on fewer steps: scikit-learn's digits through TFRecords, the daemon
and the Estimator."""

import logging
import re


def test_demo_trains_evaluates_exactly_exports_and_prints_the_table(capsys, caplog, tmp_path, load_example):
    caplog.set_level(logging.WARNING, logger="estimator")
    argv = ["--dir", str(tmp_path), "--steps", "300", "--iterations-per-loop", "50", "--hidden", "64", "--quiet"]
    assert load_example("digits").main(argv) == 0
    # its loss masks the padding of the last evaluation batch: no warning that it includes it
    assert not [r.getMessage() for r in caplog.records if "padding rows" in r.getMessage()]
    captured = capsys.readouterr()
    assert "INFO:estimator:" not in captured.err          # --quiet: RunConfig(log_step_count_steps=None)
    out = captured.out
    rows = dict(re.findall(r"^(\S.*?)\s{2,}(.*)$", out, re.MULTILINE))
    assert rows["train steps"].startswith("300 (batch 64, 50 steps per compiled loop")
    assert rows["eval examples"].startswith("300 of 300 (3 batches of 128, the last padded and masked)")
    accuracy, right = re.fullmatch(r"(\d\.\d{4}) \((\d+)/300 from predict\(\)\)", rows["eval accuracy"]).groups()
    assert float(accuracy) >= 0.95 and int(right) == round(float(accuracy) * 300)
    loss, host_loss = re.fullmatch(r"(\S+) \((\S+) from predict\(\)'s logits\)", rows["eval loss"]).groups()
    assert loss == host_loss
    assert rows["export"] == str(tmp_path / "export" / "300")
    assert rows["served vs predict"].startswith("300/300 classes agree")
    assert "loss" in rows["train summaries"] and "accuracy" in rows["eval summaries"]
    assert rows["result"] == "PASS"


def test_demo_refuses_a_model_dir_that_holds_a_previous_run(capsys, tmp_path, load_example):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "checkpoint").write_text("")
    assert load_example("digits").main(["--dir", str(tmp_path), "--quiet"]) == 2
    assert "not empty" in capsys.readouterr().err
