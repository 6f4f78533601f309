"""`python -m bench images` on a few photos of one size, without TensorFlow: every figure, ratio and note, each
daemon figure from at least STEADY_BATCHES_PER_WORKER batches per worker or refused with the reason."""

import json
import os
import re
import time

import pytest

import infeed
from bench import __main__ as bench_main
from bench import harness
from bench.harness import STEADY_BATCHES_PER_WORKER
from bench.suites import images_suite as suite
from infeed.example import image as image_module
from tests.bench.test_infeed_suite import check_scaling


def test_images_suite_gives_every_figure_ratio_and_note_and_refuses_a_w_its_photos_are_too_few_for(tmp_path):
    # W=4 on a 2-CPU machine: the quick photos are sized for it (36 batches of 16), a quarter of them written (a
    # small --scale): 9 batches, W=1's 1 + 8; W=4's figures (36) are refused, and every ratio of them. A ring of
    # 16 slots beside the default 8 gives its own rows and scaling tables.
    result = suite.run(sources=("500x375",), workers=(1, 4), slots=(16,), quick=True, repeats=1, scale=0.25,
                       tensorflow=False, data_dir=str(tmp_path))
    text = harness.format_result(result)
    assert "tf.data comparison not run (--no-tf)" in text
    names = [suite.BARE, suite.DECODE_PART, suite.RESIZE_PART,
             *[suite.parse_name(m) for m in suite.MODES],
             *[suite.whole_name(m) for m in suite.MODES if image_module.JPEG_DECODER != "simplejpeg"],
             *[suite.parallel_name(4, m) for m in suite.MODES],
             *[suite.daemon_name(1, m, n) for m in suite.MODES for n in (8, 16)]]
    assert {(f.group, f.name) for f in result.figures} == {("500x375", n) for n in names}
    assert all(f.records_per_s > 0 for f in result.figures)
    for m in suite.MODES:
        for n in (8, 16):
            daemon = result.figure("500x375", suite.daemon_name(1, m, n))
            assert daemon.batches == STEADY_BATCHES_PER_WORKER and daemon.records == daemon.batches * suite.BATCH_SIZE
        assert result.figure("500x375", suite.parallel_name(4, m)).records == 9 * suite.BATCH_SIZE  # shares: the file
    reason = "W=4 needs 36 batches (4 to start, then 8 per worker), the file has 9"
    assert {(r.name, r.kind, r.reason) for r in result.refused} == {
        *((suite.daemon_name(4, m, n), "figure", reason) for m in suite.MODES for n in (8, 16)),
        *((f"{suite.daemon_name(4, m)} / {suite.daemon_name(1, m)}", "ratio", f"{suite.daemon_name(4, m)} is refused")
          for m in suite.MODES)}
    for r in result.refused:          # in the table in place of the numbers; never a ratio
        [line] = [x for x in text.splitlines() if re.split(r"\s{2,}", x)[:2] == ["500x375", r.name]]
        assert line.endswith(f"refused: {r.reason}") and not re.search(r"\d\.\d\dx", line), line
    ratios = {r.name: r.target for r in result.ratios}
    assert ratios[f"{suite.daemon_name(1, 'centre crop')} / {suite.BARE}"] == 1.0
    assert ratios[f"{suite.daemon_name(1, 'random resized crop')} / {suite.BARE}"] == 1.0
    if image_module.JPEG_DECODER != "simplejpeg":      # the crop window against the whole photo, in the same run
        assert all(f"{suite.parse_name(m)} / {suite.whole_name(m)}" in ratios for m in suite.MODES)
    assert f"JPEG decoder of this build: {image_module.JPEG_DECODER}" in result.notes
    assert not any("W=4" in name for name in ratios)
    assert suite.TARGETS[(suite.daemon_name(2, "centre crop"), suite.daemon_name(1, "centre crop"))] == {
        "500x375": 1.7, "1024x768": 1.7}
    # with TensorFlow: the issues' targets, against decode + crop + resize and against decode_and_crop_jpeg
    assert suite.TARGETS[(suite.daemon_name(1, "centre crop"), suite.TF_FULL)] == {"500x375": 1.7, "1024x768": 1.7}
    assert suite.TARGETS[(suite.daemon_name(1, "random resized crop"), suite.tf_name("random resized crop", 1))] \
        == {"500x375": 1.6, "1024x768": 1.3}
    assert suite.TARGETS[(suite.daemon_name(1, "centre crop"), suite.tf_name("centre crop", 1))] \
        == {"500x375": 1.0, "1024x768": 1.0}
    assert any("where a centre crop's time goes" in note for note in result.notes)
    assert {s["name"] for s in result.stages} == {suite.daemon_name(1, m, n) for m in suite.MODES for n in (8, 16)}
    rates = {f.name: f.records_per_s for f in result.figures}
    assert [(t["group"], t["name"]) for t in result.scaling] == [
        ("500x375", m) if n == 8 else ("500x375", f"{m}, 16 slots") for m in suite.MODES for n in (8, 16)]
    for table, (m, n) in zip(result.scaling, [(m, n) for m in suite.MODES for n in (8, 16)]):
        check_scaling(table, "500x375", suite.scaling_label(m, n), {w: suite.daemon_name(w, m, n) for w in (1, 4)},
                      rates, refused=(4,))
        assert table["rows"][0]["bound_speedup"] == 1.0 and table["rows"][0]["of_bound"] == 1.0
    assert text.index("scaling with the workers") > text.index(suite.BARE)
    assert json.loads(json.dumps(result.to_json()))["scaling"] == result.scaling
    assert "images" in bench_main.SUITES


def test_the_photos_are_jpegs_of_the_size_asked_in_the_imagenet_layout(tmp_path):
    path = str(tmp_path / "photos.tfrecord")
    suite.write_photos(path, 96, 128, 3)
    with infeed.read_records(path) as reader:
        records = list(reader)
    batch = infeed.parse_examples(records, {"image": infeed.Image(size=(96, 128), resize=None),
                                            "image/class/label": infeed.FixedLen((), "int64")})
    assert batch["image"].shape == (3, 96, 128, 3) and batch["image/class/label"].tolist() == [0, 1, 2]
    assert len({batch["image"][i].tobytes() for i in range(3)}) == 3


def test_the_textured_set_is_the_same_crops_with_more_bits_per_pixel(tmp_path):
    from bench.data import photos

    sizes = {}
    for photo_set in photos.PHOTO_SETS:
        path, _ = photos.ensure_photos(str(tmp_path), "500x375", 4, 0, photo_set)
        assert path.endswith("-textured-4-seed0-v1.tfrecord") == (photo_set == "textured")
        sizes[photo_set] = os.path.getsize(path)
    assert sizes["textured"] > 1.5 * sizes["sample"]
    with pytest.raises(ValueError, match="unknown photo set 'noisy'; known: sample, textured"):
        photos.write_photos(str(tmp_path / "x"), 8, 8, 1, photo_set="noisy")


def test_the_command_line_names_the_photo_sizes_and_ring_sizes_and_refuses_an_unknown_size(monkeypatch, capsys):
    asked = {}
    monkeypatch.setattr(suite, "run", lambda sources, **kw: asked.update(sources=sources, **kw))
    bench_main.SUITES["images"](bench_main.parse_args(["images", "--sources", "1024x768", "--slots", "32",
                                                       "--workers", "1,8"]))
    assert (asked["sources"], asked["slots"], asked["workers"]) == (["1024x768"], [32], [1, 8])
    assert asked["photo_set"] == "sample"
    bench_main.SUITES["images"](bench_main.parse_args(["images", "--photos", "textured"]))
    assert (asked["sources"], asked["slots"], asked["photo_set"]) == (tuple(suite.SOURCES), (suite.SLOTS,), "textured")
    with pytest.raises(SystemExit):
        bench_main.parse_args(["images", "--sources", "640x480"])
    assert "unknown sources ['640x480']; known: 500x375, 1024x768" in capsys.readouterr().err


def test_the_shared_cpu_row_pins_worker_0_beside_a_busy_process_and_worker_1_alone(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    path = str(tmp_path / "photos.tfrecord")
    suite.write_photos(path, 64, 96, 64)
    case = suite._shared_cpu_case(infeed.Dataset(path, suite.spec(suite.SHARED_MODE), batch_size=16, num_epochs=1),
                                  cpus[:2])
    seen, pin = {}, case.started

    def pinned(daemon):
        pin(daemon)
        seen["workers"] = [os.sched_getaffinity(pid) for pid in daemon.worker_pids]
    case.started = pinned
    assert case.run() == 64 and len(case.steady) == 1
    assert seen["workers"] == [{cpus[0]}, {cpus[1]}]
    assert case.name == suite.shared_cpu_name("random resized crop") == \
        "daemon W=2, worker 0 sharing its CPU, random resized crop"


def test_a_busy_cpu_spins_pinned_while_the_block_runs_and_is_gone_after():
    cpu = sorted(os.sched_getaffinity(0))[-1]
    with suite.busy_cpu(cpu) as proc:
        time.sleep(0.5)
        assert proc.poll() is None and os.sched_getaffinity(proc.pid) == {cpu}
    assert proc.poll() is not None
