"""TensorBoard event files without TensorFlow: what we write, TensorBoard reads, and we read back."""

import math
import os
import re
import socket
import struct
import threading
import time

import numpy as np
import pytest

import infeed
from estimator.summaries import SummaryWriter, read_scalars


def only_file(logdir):
    (name,) = os.listdir(logdir)
    return os.path.join(logdir, name)


def test_scalars_at_several_steps_read_back(tmp_path):
    with SummaryWriter(tmp_path) as w:
        for step in range(0, 500, 100):
            w.scalar("loss", 1.0 / (step + 1), step)
        w.scalars({"loss": 0.5, "global_step/sec": 85.25, "examples/sec": 10912.0}, step=500)
    got = read_scalars(tmp_path)
    assert got["loss"] == [(s, float(np.float32(1.0 / (s + 1)))) for s in range(0, 500, 100)] + [(500, 0.5)]
    assert got["global_step/sec"] == [(500, 85.25)]
    assert got["examples/sec"] == [(500, 10912.0)]
    assert read_scalars(w.path) == got                    # a file or its directory


def test_values_are_float32_and_steps_int64(tmp_path):
    jnp = pytest.importorskip("jax.numpy")
    with SummaryWriter(tmp_path) as w:
        w.scalar("a", 0.1, 1)
        w.scalar("a", 1e39, 2)                          # beyond float32: inf, as a C cast
        w.scalar("a", -1e39, 3)
        w.scalar("a", np.float64(2.5), np.int64(-7))    # numpy and JAX scalars, negative steps
        w.scalar("a", jnp.float32(0.75), jnp.int32(2**31 - 1))
        w.scalar("a", jnp.array(3.0), 2**63 - 1)
        w.scalar("b", float("nan"), 0)
    got = read_scalars(tmp_path)
    assert got["a"] == [(1, 0.10000000149011612), (2, math.inf), (3, -math.inf), (-7, 2.5), (2**31 - 1, 0.75),
                        (2**63 - 1, 3.0)]
    assert got["a"][0][1] == float(np.float32(0.1))
    ((step, nan),) = got["b"]
    assert step == 0 and math.isnan(nan)


def test_bad_arguments_are_refused(tmp_path):
    with SummaryWriter(tmp_path) as w:
        with pytest.raises(ValueError, match="tag"):
            w.scalar("", 1.0, 0)
        with pytest.raises(TypeError):
            w.scalar("x", 1.0, 1.5)
        with pytest.raises(ValueError, match="int64"):
            w.scalar("x", 1.0, 2**63)
    with pytest.raises(ValueError, match="flush_secs"):
        SummaryWriter(tmp_path, flush_secs=0)
    with pytest.raises(ValueError, match="max_queue"):
        SummaryWriter(tmp_path, max_queue=0)


def test_file_name_is_tensorboards_and_unique_per_writer(tmp_path):
    before = int(time.time())
    with SummaryWriter(tmp_path / "a" / "b") as w1, SummaryWriter(tmp_path / "a" / "b") as w2:
        pass
    after = int(time.time())
    assert w1.path != w2.path and os.path.dirname(w1.path) == str(tmp_path / "a" / "b")
    for w in (w1, w2):
        m = re.fullmatch(r"events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+)", os.path.basename(w.path))
        assert m and before <= int(m[1]) <= after
        assert (m[2], int(m[3])) == (socket.gethostname(), os.getpid())


def test_the_first_record_is_the_file_version_and_every_record_parses_as_an_event(tmp_path):
    event_pb2 = pytest.importorskip("tensorboard.compat.proto.event_pb2")
    before = time.time()
    with SummaryWriter(tmp_path) as w:
        w.scalars({"x": 1.0, "y": 2.0}, step=3, wall_time=1234.5)
        w.text("note", "**hello** ünïcode", step=4)
    with infeed.read_records(w.path) as records:
        events = [event_pb2.Event.FromString(r) for r in records]
    assert events[0].file_version == "brain.Event:2" and before <= events[0].wall_time <= time.time()
    assert not events[0].HasField("summary")
    assert (events[1].wall_time, events[1].step) == (1234.5, 3)
    assert [(v.tag, v.simple_value) for v in events[1].summary.value] == [("x", 1.0), ("y", 2.0)]
    (text,) = events[2].summary.value
    assert text.metadata.plugin_data.plugin_name == "text"
    assert list(text.tensor.string_val) == ["**hello** ünïcode".encode()]


def test_tensorboard_reads_the_same_steps_values_and_wall_times(tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    tensor_util = pytest.importorskip("tensorboard.util.tensor_util")
    written = [(step, 1000.0 + step / 7, 2.0 / (step + 1)) for step in range(0, 1000, 50)]
    with SummaryWriter(tmp_path) as w:
        for step, wall_time, loss in written:
            w.scalars({"loss": loss, "lr": 1e-3}, step, wall_time=wall_time)
        w.text("notes", "trained", step=1000, wall_time=2000.0)
    acc = event_accumulator.EventAccumulator(str(tmp_path)).Reload()
    assert sorted(acc.Tags()["scalars"]) == ["loss", "lr"] and acc.Tags()["tensors"] == ["notes"]
    loss = acc.Scalars("loss")
    assert [(e.step, e.wall_time, e.value) for e in loss] == [(s, t, float(np.float32(v))) for s, t, v in written]
    assert [(e.step, e.value) for e in loss] == read_scalars(tmp_path)["loss"]
    assert [(e.step, e.value) for e in acc.Scalars("lr")] == read_scalars(tmp_path)["lr"]
    (note,) = acc.Tensors("notes")
    assert (note.step, note.wall_time) == (1000, 2000.0)
    assert tensor_util.make_ndarray(note.tensor_proto).item() == b"trained"


def test_tensorboards_server_side_reader_files_them_under_the_scalars_and_text_plugins(tmp_path):
    """The accumulator TensorBoard's server uses turns simple_value into a tensor of the scalars plugin."""
    plugin_event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.plugin_event_accumulator")
    tensor_util = pytest.importorskip("tensorboard.util.tensor_util")
    with SummaryWriter(tmp_path) as w:
        for step in (100, 200):
            w.scalars({"loss": 1 / step, "global_step/sec": 85.3}, step)
        w.text("notes", "hello *world*", 200)
    acc = plugin_event_accumulator.EventAccumulator(str(tmp_path)).Reload()
    assert sorted(acc.PluginTagToContent("scalars")) == ["global_step/sec", "loss"]
    assert list(acc.PluginTagToContent("text")) == ["notes"]
    loss = [(e.step, tensor_util.make_ndarray(e.tensor_proto).item()) for e in acc.Tensors("loss")]
    assert loss == read_scalars(tmp_path)["loss"] == [(100, float(np.float32(0.01))), (200, float(np.float32(0.005)))]
    assert [tensor_util.make_ndarray(e.tensor_proto).item() for e in acc.Tensors("notes")] == [b"hello *world*"]


def test_default_wall_time_is_the_time_of_the_call(tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    before = time.time()
    with SummaryWriter(tmp_path) as w:
        w.scalar("x", 1.0, 1)
    (event,) = event_accumulator.EventAccumulator(str(tmp_path)).Reload().Scalars("x")
    assert before <= event.wall_time <= time.time()


def test_flushes_when_max_queue_events_are_pending(tmp_path):
    with SummaryWriter(tmp_path, max_queue=3, flush_secs=3600) as w:
        assert read_scalars(w.path) == {}                # the file version is on disk at once
        w.scalar("x", 1.0, 1)
        w.scalar("x", 2.0, 2)
        assert read_scalars(w.path) == {}
        w.scalar("x", 3.0, 3)
        assert read_scalars(w.path) == {"x": [(1, 1.0), (2, 2.0), (3, 3.0)]}
        w.scalar("x", 4.0, 4)
        assert len(read_scalars(w.path)["x"]) == 3
        w.flush()
        assert len(read_scalars(w.path)["x"]) == 4


def test_flushes_every_flush_secs_without_further_writes(tmp_path):
    with SummaryWriter(tmp_path, flush_secs=0.05) as w:
        w.scalar("x", 1.0, 1)
        deadline = time.monotonic() + 10
        while not read_scalars(w.path) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert read_scalars(w.path) == {"x": [(1, 1.0)]}


def test_threads_writing_at_once_leave_every_record_whole(tmp_path):
    threads, per_thread = 8, 500

    def write(w, t):
        for i in range(per_thread):
            if i % 2:
                w.scalar(f"t{t}", i, i)
            else:
                w.scalars({f"t{t}": i, f"u{t}": -i}, i)

    with SummaryWriter(tmp_path, max_queue=7, flush_secs=0.001) as w:
        workers = [threading.Thread(target=write, args=(w, t)) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    with infeed.read_records(w.path) as records:           # raises on any CRC or framing error
        assert sum(1 for _ in records) == 1 + threads * per_thread
    got = read_scalars(w.path)
    for t in range(threads):
        assert got[f"t{t}"] == [(i, float(i)) for i in range(per_thread)]
        assert got[f"u{t}"] == [(i, float(-i)) for i in range(0, per_thread, 2)]


def test_close_flushes_and_later_writes_raise(tmp_path):
    w = SummaryWriter(tmp_path, flush_secs=3600)
    w.scalar("x", 1.0, 1)
    assert read_scalars(w.path) == {}
    w.close()
    assert read_scalars(w.path) == {"x": [(1, 1.0)]}
    assert not w._flusher.is_alive()
    w.close()                                              # idempotent
    w.flush()                                              # nothing pending: nothing to do
    for write in (lambda: w.scalar("x", 2.0, 2), lambda: w.scalars({"x": 2.0}, 2), lambda: w.text("t", "s", 2)):
        with pytest.raises(ValueError, match="closed SummaryWriter"):
            write()
    assert "closed" in repr(w)


def test_reads_tensorflow_style_events_and_skips_what_is_not_a_scalar(tmp_path):
    """TF1 writes simple_value; TF2 a float tensor of the "scalars" plugin, its metadata maybe only once."""
    event_pb2 = pytest.importorskip("tensorboard.compat.proto.event_pb2")
    summary_pb2 = pytest.importorskip("tensorboard.compat.proto.summary_pb2")
    tensor_pb2 = pytest.importorskip("tensorboard.compat.proto.tensor_pb2")
    Value = summary_pb2.Summary.Value
    plugin_data = summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
    scalars_plugin = summary_pb2.SummaryMetadata(plugin_data=plugin_data)
    f32 = tensor_pb2.TensorProto(dtype=1, tensor_content=struct.pack("<f", 0.5))
    f64 = tensor_pb2.TensorProto(dtype=2, double_val=[0.125])
    events = [
        event_pb2.Event(wall_time=1.0, file_version="brain.Event:2"),
        event_pb2.Event(wall_time=2.0, step=1, summary=summary_pb2.Summary(value=[Value(tag="v1", simple_value=1.5)])),
        event_pb2.Event(wall_time=3.0, step=2, summary=summary_pb2.Summary(value=[
            Value(tag="v2", tensor=f32, metadata=scalars_plugin),
            Value(tag="v2d", tensor=f64, metadata=scalars_plugin),
            Value(tag="img", image=summary_pb2.Summary.Image(height=1, width=1, encoded_image_string=b"png")),
            Value(tag="hist", histo=summary_pb2.HistogramProto(min=0, max=1))])),
        event_pb2.Event(wall_time=4.0, step=3, summary=summary_pb2.Summary(value=[Value(tag="v2", tensor=f32)])),
        event_pb2.Event(wall_time=5.0, step=4, summary=summary_pb2.Summary(value=[Value(tag="other", tensor=f32)])),
        event_pb2.Event(wall_time=6.0, step=5, log_message=event_pb2.LogMessage(level=20, message="hi")),
    ]
    path = tmp_path / "events.out.tfevents.1.tf"
    with infeed.TFRecordWriter(path) as out:
        for event in events:
            out.write(event.SerializeToString())
        unknown = b"\xf8\x06\x2a"                          # field 111, varint 42: unknown to Event
        out.write(events[1].SerializeToString() + unknown)
    assert read_scalars(tmp_path) == {"v1": [(1, 1.5), (1, 1.5)], "v2": [(2, 0.5), (3, 0.5)], "v2d": [(2, 0.125)]}


def test_a_directory_reads_its_event_files_in_name_order_and_damage_raises(tmp_path):
    with SummaryWriter(tmp_path) as w:
        w.scalar("x", 1.0, 1)
    later = tmp_path / "events.out.tfevents.9999999999.host.1.1"
    os.rename(w.path, tmp_path / "events.out.tfevents.0000000001.host.1.1")
    with SummaryWriter(tmp_path) as w2:
        w2.scalar("x", 2.0, 2)
    os.rename(w2.path, later)
    (tmp_path / "notes.txt").write_text("not an event file")
    assert read_scalars(tmp_path) == {"x": [(1, 1.0), (2, 2.0)]}
    data = bytearray(later.read_bytes())
    data[-6] ^= 0xFF
    later.write_bytes(bytes(data))
    with pytest.raises(infeed.CorruptRecordError):
        read_scalars(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError):
        read_scalars(empty)
