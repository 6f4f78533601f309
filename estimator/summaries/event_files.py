"""TensorBoard event files, written and read without TensorFlow or protobuf.

An event file is a TFRecord file (infeed's framing, CRC32C-checked) of
serialized ``Event`` protos. The few fields used here are encoded by hand::

    Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
    Summary { repeated Value value = 1; }
    Value   { string tag = 1; float simple_value = 2; Image image = 4; HistogramProto histo = 5;
              TensorProto tensor = 8; SummaryMetadata metadata = 9; }
    Image   { int32 height = 1; int32 width = 2; int32 colorspace = 3; bytes encoded_image_string = 4; }
    HistogramProto { double min = 1; double max = 2; double num = 3; double sum = 4; double sum_squares = 5;
                     repeated double bucket_limit = 6 [packed]; repeated double bucket = 7 [packed]; }

:class:`SummaryWriter` writes scalars (``simple_value``, which TensorBoard
shows in its Scalars tab), text (a string tensor for the text plugin),
histograms (``histo``: equal-width buckets, see :mod:`estimator.summaries.data`),
images (``image``: PNG) and hyperparameters (the hparams plugin's
``SessionStartInfo``) into ``events.out.tfevents.<time>.<host>.<pid>.<n>``
under its log directory: what TensorBoard's Scalars, Text, Histograms,
Distributions, Images and HParams tabs read.
:func:`read_scalars` reads scalars back from our files or TensorFlow's (TF1's
``simple_value`` and TF2's scalar tensors).

``simple_value`` is a float32: a value reads back as ``float(np.float32(value))``
(0.1 reads back as 0.10000000149011612; beyond float32's range, as ``inf``).

>>> import tempfile
>>> logdir = tempfile.mkdtemp()
>>> with SummaryWriter(logdir) as w:
...     w.scalar("loss", 0.5, step=100)
...     w.scalars({"loss": 0.25, "global_step/sec": 80.0}, step=200)
>>> read_scalars(logdir)
{'loss': [(100, 0.5), (200, 0.25)], 'global_step/sec': [(200, 80.0)]}
"""

from __future__ import annotations

import itertools
import math
import operator
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Self

import numpy as np

from estimator.errors import CorruptSummaryError, InvalidArgumentError
from estimator.summaries.data import as_image_batch, encode_png, histogram
from infeed.example.codec import varint
from infeed.tfrecord import TFRecordWriter, expand_files, read_records

__all__ = ["SummaryWriter", "read_scalars"]

FILE_VERSION = "brain.Event:2"
HPARAMS_TAG = "_hparams_/session_start_info"      # the tag TensorBoard's hparams plugin reads a run's values from

_DOUBLE = struct.Struct("<d")
_FLOAT = struct.Struct("<f")
_U64 = (1 << 64) - 1
_WRITER_IDS = itertools.count(1)          # distinguishes writers created by one process in one second

_DT_FLOAT, _DT_DOUBLE, _DT_STRING = 1, 2, 7                       # TensorProto.dtype values
_TENSOR_FORMATS = {_DT_FLOAT: _FLOAT, _DT_DOUBLE: _DOUBLE}


# ---------------------------------------------------------------- encoding

def _bytes_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _float32(value) -> bytes:
    """``value`` as a little-endian float32, rounded as a C cast would (overflow gives ``±inf``)."""
    value = float(value)
    try:
        return _FLOAT.pack(value)
    except OverflowError:
        return _FLOAT.pack(math.copysign(math.inf, value))


def _tag(tag) -> bytes:
    if not isinstance(tag, str) or not tag:
        raise InvalidArgumentError(f"a summary tag must be a non-empty str, got {tag!r}")
    return _bytes_field(1, tag.encode("utf-8"))


def _scalar_value(tag, value) -> bytes:
    return _tag(tag) + b"\x15" + _float32(value)                    # simple_value: field 2, fixed32


def _text_value(tag, text: str) -> bytes:
    plugin_data = _bytes_field(1, b"text")                           # PluginData.plugin_name
    metadata = _bytes_field(1, plugin_data)                          # SummaryMetadata.plugin_data
    tensor = (b"\x08" + varint(_DT_STRING)                           # dtype
              + _bytes_field(2, b"")                                 # tensor_shape: a scalar
              + _bytes_field(8, text.encode("utf-8")))               # string_val
    return _tag(tag) + _bytes_field(8, tensor) + _bytes_field(9, metadata)


def _histogram_value(tag, values, num_buckets) -> bytes:
    h = histogram(values, num_buckets, tag=tag)
    doubles = lambda xs: np.asarray(xs, "<f8").tobytes()
    histo = (b"\x09" + _DOUBLE.pack(h.min) + b"\x11" + _DOUBLE.pack(h.max)          # min, max: fixed64
             + b"\x19" + _DOUBLE.pack(h.count) + b"\x21" + _DOUBLE.pack(h.sum)     # num, sum
             + b"\x29" + _DOUBLE.pack(h.sum_squares)                               # sum_squares
             + _bytes_field(6, doubles(h.edges[1:])) + _bytes_field(7, doubles(h.counts)))   # packed
    return _tag(tag) + _bytes_field(5, histo)


def _image_value(tag, image: np.ndarray) -> bytes:
    """One uint8 [H, W, C] image; ``colorspace`` is its channel count (1 grey, 2 grey + alpha, 3 RGB, 4 RGBA)."""
    height, width, channels = image.shape
    message = (b"\x08" + varint(height) + b"\x10" + varint(width) + b"\x18" + varint(channels)
               + _bytes_field(4, encode_png(image)))
    return _tag(tag) + _bytes_field(4, message)


def _hparam(value) -> bytes:
    """A ``google.protobuf.Value``: bool, number (ints and floats) or string (anything else, as ``str``)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return b"\x20" + varint(int(value))                                  # bool_value = 4
    if isinstance(value, (int, float)):
        return b"\x11" + _DOUBLE.pack(float(value))                           # number_value = 2
    return _bytes_field(3, str(value).encode("utf-8"))                        # string_value = 3


def _hparams_value(hparams: Mapping[str, object], start_time: float) -> bytes:
    """The hparams plugin's ``SessionStartInfo`` (as ``tensorboard.plugins.hparams.summary.session_start_pb``)."""
    entries = b"".join(_bytes_field(1, _bytes_field(1, _hparam_name(name).encode("utf-8"))
                                    + _bytes_field(2, _hparam(value)))
                       for name, value in hparams.items())
    start_info = entries + b"\x29" + _DOUBLE.pack(start_time)                 # start_time_secs = 5
    content = _bytes_field(3, start_info)                                     # HParamsPluginData.session_start_info
    metadata = _bytes_field(1, _bytes_field(1, b"hparams") + _bytes_field(2, content))
    null_tensor = b"\x08" + varint(_DT_FLOAT) + _bytes_field(2, _bytes_field(2, b""))   # float32 [0]
    return _tag(HPARAMS_TAG) + _bytes_field(8, null_tensor) + _bytes_field(9, metadata)


def _hparam_name(name) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"a hyperparameter's name must be a non-empty str, got {name!r}")
    return name


def _event(wall_time: float, step: int | None = None, *, file_version: str | None = None,
           values: Sequence[bytes] = ()) -> bytes:
    out = b"\x09" + _DOUBLE.pack(wall_time)                          # wall_time: field 1, fixed64
    if step is not None:
        out += b"\x10" + varint(step & _U64)                         # step: field 2, int64 varint
    if file_version is not None:
        out += _bytes_field(3, file_version.encode())
    if values:
        out += _bytes_field(5, b"".join(_bytes_field(1, v) for v in values))
    return out


def _step(step) -> int:
    step = operator.index(step)
    if not -(1 << 63) <= step < 1 << 63:
        raise InvalidArgumentError(f"step {step} is outside int64")
    return step


# ---------------------------------------------------------------- writing

class SummaryWriter:
    """Appends summaries to a new TensorBoard event file in ``logdir``.

    Events are queued in memory and written to the file (and flushed to the
    operating system) once ``max_queue`` are pending, every ``flush_secs`` by a
    background thread, on :meth:`flush` and on :meth:`close`. All methods are
    thread-safe. Close the writer (or use it in a ``with`` block): that writes
    what is pending and stops the thread. After :meth:`close`, writing raises
    ``InvalidArgumentError`` (a ``ValueError``, as for Python's files).

    Values may be Python, numpy or JAX scalars (converted with ``float``);
    steps any integer (``operator.index``). ``wall_time`` defaults to now.
    """

    def __init__(self, logdir, *, flush_secs: float = 10, max_queue: int = 100):
        if not flush_secs > 0:
            raise InvalidArgumentError(f"flush_secs must be positive, got {flush_secs!r}")
        if not (isinstance(max_queue, int) and max_queue >= 1):
            raise InvalidArgumentError(f"max_queue must be a positive int, got {max_queue!r}")
        self.logdir = os.fspath(logdir)
        self.flush_secs = flush_secs
        self.max_queue = max_queue
        if "://" not in self.logdir:                                 # object stores have no folders to make
            os.makedirs(self.logdir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_WRITER_IDS)}"
        self.path = self.logdir.rstrip("/") + "/" + name
        self._records = TFRecordWriter(self.path)
        self._queue: list[bytes] = [_event(time.time(), file_version=FILE_VERSION)]
        self._lock = threading.Lock()
        self._closed = False
        self._flush_locked()
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_every_flush_secs, daemon=True,
                                         name=f"SummaryWriter flusher ({name})")
        self._flusher.start()

    def scalar(self, tag: str, value, step: int, *, wall_time: float | None = None) -> None:
        """Writes one scalar (as a float32: see the module's note on rounding)."""
        self._append(_event(time.time() if wall_time is None else wall_time, _step(step),
                            values=[_scalar_value(tag, value)]))

    def scalars(self, values: Mapping[str, object], step: int, *, wall_time: float | None = None) -> None:
        """Writes several scalars at one step, as one event."""
        self._append(_event(time.time() if wall_time is None else wall_time, _step(step),
                            values=[_scalar_value(tag, value) for tag, value in values.items()]))

    def text(self, tag: str, text: str, step: int, *, wall_time: float | None = None) -> None:
        """Writes a string for TensorBoard's Text tab (rendered as Markdown)."""
        self._append(_event(time.time() if wall_time is None else wall_time, _step(step),
                            values=[_text_value(tag, str(text))]))

    def histogram(self, tag: str, values, step: int, *, num_buckets: int | None = None,
                  wall_time: float | None = None) -> None:
        """Writes a histogram of ``values`` (any shape, real numbers; NaN and Inf left out) in ``num_buckets``
        equal-width buckets (default 30), for TensorBoard's Histograms and Distributions tabs."""
        self._append(_event(time.time() if wall_time is None else wall_time, _step(step),
                            values=[_histogram_value(tag, values, num_buckets)]))

    def image(self, tag: str, image, step: int, *, wall_time: float | None = None) -> None:
        """Writes an image ([H, W, C]) under ``tag``, or a batch ([N, H, W, C]) under ``tag/0`` ... ``tag/N-1``,
        as PNG, for TensorBoard's Images tab. C is 1 (grey), 2 (grey and alpha), 3 (RGB) or 4 (RGBA); pixels
        uint8, or floats in [0, 1] (see :func:`estimator.summaries.data.as_image_batch`)."""
        images, batch = as_image_batch(image, tag=tag)
        tags = [f"{tag}/{i}" for i in range(len(images))] if batch else [tag]
        self._append(_event(time.time() if wall_time is None else wall_time, _step(step),
                            values=[_image_value(t, x) for t, x in zip(tags, images)]))

    def hparams(self, hparams: Mapping[str, object], *, wall_time: float | None = None) -> None:
        """Writes the run's hyperparameters for TensorBoard's HParams tab (as the hparams plugin's
        ``session_start_pb``): bools, numbers and strings as they are, anything else as its ``str``."""
        wall_time = time.time() if wall_time is None else wall_time
        self._append(_event(wall_time, 0, values=[_hparams_value(hparams, wall_time)]))

    def flush(self) -> None:
        """Writes the pending events to the file and flushes it (nothing to do once closed)."""
        with self._lock:
            if not self._closed:
                self._flush_locked()

    def close(self) -> None:
        """Flushes, closes the file and stops the flushing thread; closing again does nothing."""
        self._stop.set()
        self._flusher.join()
        with self._lock:
            if self._closed:
                return
            try:
                self._flush_locked()
            finally:
                self._closed = True
                self._records.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SummaryWriter({self.path!r}{', closed' if self._closed else ''})"

    def _append(self, event: bytes) -> None:
        with self._lock:
            if self._closed:
                raise InvalidArgumentError(f"{self.path}: write to a closed SummaryWriter")
            self._queue.append(event)
            if len(self._queue) >= self.max_queue:
                self._flush_locked()

    def _flush_locked(self) -> None:
        for event in self._queue:
            self._records.write(event)
        self._queue.clear()
        self._records.flush()

    def _flush_every_flush_secs(self) -> None:
        while not self._stop.wait(self.flush_secs):
            self.flush()


# ---------------------------------------------------------------- reading

def _read_varint(buf: memoryview, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise CorruptSummaryError("malformed varint in an event")
        byte = buf[i]
        result |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if byte < 0x80:
            return result, i


def _fields(message) -> Iterator[tuple[int, int, object]]:
    """``(field number, wire type, value)`` for each field of a serialized message.

    The value is an int (varint), bytes (fixed64 / fixed32) or a memoryview
    (length-delimited); nothing is interpreted beyond the wire format.
    """
    buf = memoryview(message)
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        wire = key & 7
        if wire == 0:
            value, i = _read_varint(buf, i)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = bytes(buf[i:i + size]), i + size
        elif wire == 2:
            size, i = _read_varint(buf, i)
            value, i = buf[i:i + size], i + size
        else:
            raise CorruptSummaryError(f"unsupported protobuf wire type {wire} in an event")
        if i > len(buf):
            raise CorruptSummaryError("truncated field in an event")
        yield key >> 3, wire, value


def _plugin_name(metadata) -> str | None:
    for number, wire, plugin_data in _fields(metadata):
        if (number, wire) == (1, 2):
            for n, w, name in _fields(plugin_data):
                if (n, w) == (1, 2):
                    return bytes(name).decode("utf-8")
    return None


def _tensor_scalar(tensor) -> float | None:
    """The value of a float or double scalar tensor (tensor_content or float_val/double_val), else None."""
    dtype, raw = None, b""
    for number, wire, value in _fields(tensor):
        if (number, wire) == (1, 0):
            dtype = value
        elif number in (4, 5, 6) and wire != 0:                      # tensor_content, float_val, double_val
            raw += bytes(value)
    fmt = _TENSOR_FORMATS.get(dtype)
    return fmt.unpack(raw)[0] if fmt is not None and len(raw) == fmt.size else None


def _scalars_in(record, plugins: dict[str, str | None]) -> Iterator[tuple[str, int, float]]:
    """``(tag, step, value)`` for each scalar in one serialized Event; ``plugins`` remembers each
    tag's plugin, which TensorFlow may write only with a tag's first value."""
    step, summaries = 0, []
    for number, wire, value in _fields(record):
        if (number, wire) == (2, 0):
            step = value - (1 << 64) if value >= 1 << 63 else value
        elif (number, wire) == (5, 2):
            summaries.append(value)
    for summary in summaries:
        for number, wire, item in _fields(summary):
            if (number, wire) != (1, 2):
                continue
            tag, simple, tensor, metadata = None, None, None, None
            for n, w, value in _fields(item):
                if (n, w) == (1, 2):
                    tag = bytes(value).decode("utf-8")
                elif (n, w) == (2, 5):
                    simple = _FLOAT.unpack(value)[0]
                elif (n, w) == (8, 2):
                    tensor = value
                elif (n, w) == (9, 2):
                    metadata = value
            if tag is None:
                continue
            if metadata is not None:
                plugins[tag] = _plugin_name(metadata)
            if simple is None and tensor is not None and plugins.get(tag) == "scalars":
                simple = _tensor_scalar(tensor)
            if simple is not None:
                yield tag, step, simple


def read_scalars(path_or_dir) -> dict[str, list[tuple[int, float]]]:
    """The scalars in an event file, or in every ``*tfevents*`` file of a directory (in name order).

    Returns ``{tag: [(step, value), ...]}`` in the order written. Records are
    CRC-checked (damage raises :class:`infeed.CorruptRecordError`, a record that
    is not an Event :class:`~estimator.errors.CorruptSummaryError`); fields
    other than the scalars' are skipped.
    """
    path = os.fspath(path_or_dir)
    files = expand_files(os.path.join(path, "*tfevents*")) if os.path.isdir(path) else [path]
    out: dict[str, list[tuple[int, float]]] = {}
    for file in files:
        plugins: dict[str, str | None] = {}
        with read_records(file, compression=None) as records:
            for record in records:
                for tag, step, value in _scalars_in(record, plugins):
                    out.setdefault(tag, []).append((step, value))
    return out
