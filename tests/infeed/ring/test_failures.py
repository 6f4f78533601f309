"""A worker's error through the ring's error record: every type a worker can raise comes back as itself, with its
attributes, whatever they hold (tuples, datetimes, bytes), and never through a pickle."""

import datetime
import errno
import inspect

import pytest

from infeed import errors
from infeed.ring.failures import decode_failure, encode_failure
from infeed.ring.layout import ERROR_PAYLOAD

WHEN = datetime.datetime(2026, 11, 28, 12, 0, 1, tzinfo=datetime.timezone.utc)

#: One of each error type of infeed's, built as a worker builds it (every constructor argument given).
SAMPLES = {
    errors.InfeedError: errors.InfeedError("something failed"),
    errors.CorruptRecordError: errors.CorruptRecordError("s3://b/d.tfrecord", 7, 1234, "data_crc", "stored 0x1"),
    errors.CompressedStreamError: errors.CompressedStreamError("damaged GZIP stream at compressed byte 9"),
    errors.DecodeError: errors.DecodeError("image", 3, "a JPEG", b"\x89PNG", "/d/x.tfrecord", 40),
    errors.TransformError: errors.TransformError("m:crop", "ValueError: bad", "/d/x.tfrecord", 5, 1, 2, "ValueError",
                                                 "Traceback (most recent call last):\n  ...\nValueError: bad\n"),
    errors.WorkerDied: errors.WorkerDied(1234, 9, None, "worker 1, which owed batch 4"),
    errors.Timeout: errors.Timeout("batch 3", 2.5, 1, 4321),
    errors.AttachError: errors.AttachError("infeed-x", "size", 4096, 1024),
    errors.ShmSpaceError: errors.ShmSpaceError("/dev/shm", 1 << 30, 1 << 20),
    errors.IndexFileError: errors.IndexFileError("gs://b/d.tfrecord.index", "stale: built for 10 bytes"),
    errors.FileSystemConfigError: errors.FileSystemConfigError("s3://b?bad=1", "no option 'bad'"),
    errors.SourceChangedError: errors.SourceChangedError("s3://b/d.tfrecord", (4096, WHEN),
                                                         (4096, WHEN + datetime.timedelta(seconds=2)), 1 << 20),
    errors.ColumnError: errors.ColumnError("x", "list<string>", "not a number", 3, "t.parquet"),
    errors.ConvertError: errors.ConvertError("no input matches 'x/*.parquet'"),
    errors.TfdsBuildError: errors.TfdsBuildError("/data/mnist", "holds several TFDS configs: a, b; name one"),
}


def _attributes(error: BaseException) -> dict:
    out = {k: v for k, v in vars(error).items() if k != "__notes__"}
    if isinstance(error, OSError):
        out.update(errno=error.errno, strerror=error.strerror, filename=error.filename)
    return out


def round_trip(error: BaseException) -> BaseException:
    message, rebuilt, _ = decode_failure(encode_failure(error, ERROR_PAYLOAD))
    assert message == f"{type(error).__name__}: {error}"
    assert rebuilt is not None, f"{type(error).__name__} was not rebuilt"
    return rebuilt


def test_every_error_type_of_infeed_has_a_sample():
    types = {c for c in vars(errors).values() if inspect.isclass(c) and issubclass(c, BaseException)}
    assert types == set(SAMPLES)


@pytest.mark.parametrize("error", list(SAMPLES.values()), ids=[c.__name__ for c in SAMPLES])
def test_each_error_type_comes_back_as_itself_with_its_attributes(error):
    rebuilt = round_trip(error)
    assert type(rebuilt) is type(error) and str(rebuilt) == str(error)
    assert _attributes(rebuilt) == _attributes(error)


def test_a_source_change_keeps_its_sizes_and_datetimes_and_a_record_change_its_crcs():
    rebuilt = round_trip(SAMPLES[errors.SourceChangedError])
    assert rebuilt.before == (4096, WHEN) and isinstance(rebuilt.before, tuple)
    assert rebuilt.after[1].tzinfo is not None and rebuilt.offset == 1 << 20
    record = round_trip(errors.SourceChangedError("/d/x.tfrecord", 0x1234, 0xABCD, 96, 3))
    assert (record.before, record.after, record.offset, record.record_index) == (0x1234, 0xABCD, 96, 3)


@pytest.mark.parametrize("error", [
    FileNotFoundError(errno.ENOENT, "no such file", "/d/x.tfrecord"),
    errors.located_os_error(ConnectionResetError(errno.ECONNRESET, "reset"), "s3://b/k", "reading 8 bytes at 0"),
    PermissionError(errno.EACCES, "refused"),
    OSError("curlCode: 28, Timeout was reached"),
    ValueError("bad value"),
    MemoryError(),
    KeyError("label"),
], ids=lambda e: type(e).__name__)
def test_built_in_errors_come_back_as_themselves(error):
    rebuilt = round_trip(error)
    assert type(rebuilt) is type(error) and str(rebuilt) == str(error)
    assert rebuilt.args == error.args


class _Unknown(Exception):
    pass


def test_an_error_of_another_module_or_an_odd_argument_keeps_its_message():
    message, rebuilt, tb = decode_failure(encode_failure(_Unknown("mine"), ERROR_PAYLOAD))
    assert (message, rebuilt) == ("_Unknown: mine", None)
    odd = errors.DecodeError("f", 0, object, {1, 2})              # arguments JSON has no type for: their repr
    rebuilt = round_trip(odd)
    assert type(rebuilt) is errors.DecodeError and str(rebuilt) == str(odd)
    assert (rebuilt.expected, rebuilt.found) == (repr(object), repr({1, 2}))


@pytest.mark.parametrize("payload", [b'{"type": "IndexFileError", "module": "infeed.errors", "message": "m", '
                                     b'"args": [{"$": "pickle", "v": "x"}, "p"]}',
                                     b'{"type": "IndexFileError", "module": "infeed.errors", "message": "m", '
                                     b'"args": [{"$": "tuple", "v": [1], "extra": 2}, "p"]}'])
def test_a_record_with_an_unknown_tag_is_its_message_alone(payload):
    message, rebuilt, _ = decode_failure(payload)
    assert (message, rebuilt) == ("m", None)
