"""`python -m bench images` on a few photos of one size, without TensorFlow: every figure, ratio and note."""

import infeed
from bench import __main__ as bench_main
from bench import harness
from bench import images_suite as suite


def test_images_suite_gives_every_figure_ratio_and_note(tmp_path):
    result = suite.run(sources=("500x375",), quick=True, repeats=1, scale=0.25, tensorflow=False,
                       data_dir=str(tmp_path))
    text = harness.format_result(result)
    assert "tf.data comparison not run (--no-tf)" in text
    names = [suite.BARE, suite.DECODE_PART, suite.RESIZE_PART,
             *[suite.parse_name(m) for m in suite.MODES],
             *[suite.daemon_name(w, m) for m in suite.MODES for w in (1, 2)]]
    assert {(f.group, f.name) for f in result.figures} == {("500x375", n) for n in names}
    assert all(f.records_per_s > 0 for f in result.figures)
    ratios = {r.name: r.target for r in result.ratios}
    assert ratios[f"{suite.daemon_name(1, 'centre crop')} / {suite.BARE}"] == 0.85
    assert ratios[f"{suite.daemon_name(2, 'centre crop')} / {suite.daemon_name(1, 'centre crop')}"] == 1.7
    # with TensorFlow: the targets, centre crops against decode + crop + resize
    assert suite.TARGETS[(suite.daemon_name(1, "centre crop"), suite.TF_FULL)] == {"500x375": 1.0, "1024x768": 1.3}
    assert suite.TARGETS[(suite.daemon_name(1, "random resized crop"), suite.tf_name("random resized crop", 1))] \
        == {"500x375": 1.0, "1024x768": 1.0}
    assert any("where a centre crop's time goes" in note for note in result.notes)
    assert {s["name"] for s in result.stages} == {suite.daemon_name(w, m) for m in suite.MODES for w in (1, 2)}
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
