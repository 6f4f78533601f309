"""The errors infeed raises: one type per failure a user can act on."""

from __future__ import annotations

import errno
import signal as _signal

__all__ = ["InfeedError", "CorruptRecordError", "CompressedStreamError", "DecodeError", "CORRUPTION_KINDS",
           "TransformError", "WorkerDied", "Timeout", "AttachError", "ShmSpaceError", "IndexFileError", "ColumnError",
           "ConvertError", "FileSystemConfigError", "SourceChangedError", "TfdsBuildError"]

#: What `CorruptRecordError.kind` can be, and what each means.
CORRUPTION_KINDS = {
    "length_crc": "the CRC of the record's length field does not match",
    "data_crc": "the CRC of the record's data does not match",
    "truncated_header": "the file ends inside a record header",
    "truncated_data": "the file ends inside the record's data",
    "length_exceeds_file": "the length field (with a valid CRC) is larger than the whole file",
    "compressed_stream": "the compressed stream is damaged or cut short",
    "record_too_large": "the length field (with a valid CRC) exceeds the reader's max_record_size",
}


def _short(text: str, limit: int = 200) -> str:
    """Keeps messages readable (and bounded) whatever the damaged input held."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def located_os_error(error: OSError, path: str, where: str) -> OSError:
    """``error`` (raised by a stream under a reader) as an OSError naming the file, with ``where``
    (what was being read) after its reason: the same errno, so the same subclass (e.g.
    ConnectionResetError; EIO where it has none), and ``filename`` set to ``path``."""
    if isinstance(error, InfeedError):
        return error                # one of ours names the file and the place already, and keeps its type
    reason = f"{error.strerror or str(error) or type(error).__name__} ({where})"
    # An error without an errno of its own (pyarrow's, for a remote file) gets EIO: an OSError with a filename but
    # no errno prints as "[Errno None] None: '<path>'", the reason lost.
    return OSError(error.errno or errno.EIO, reason, path)


class InfeedError(Exception):
    """Base class of every error infeed raises on purpose."""


class CorruptRecordError(InfeedError):
    """A TFRecord file is damaged.

    Attributes: ``path``, ``record_index`` (0-based index of the damaged record),
    ``offset`` (byte offset where that record starts in the uncompressed stream),
    ``kind`` (a key of :data:`CORRUPTION_KINDS`) and ``detail``.
    """

    def __init__(self, path: str, record_index: int, offset: int, kind: str, detail: str = ""):
        self.path = path
        self.record_index = record_index
        self.offset = offset
        self.kind = kind
        self.detail = detail
        what = CORRUPTION_KINDS.get(kind, kind)
        msg = f"{path}: corrupt record {record_index} at byte offset {offset}: {what}"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)

    def __reduce__(self):
        return (type(self), (self.path, self.record_index, self.offset, self.kind, self.detail))


class CompressedStreamError(InfeedError):
    """A GZIP/ZLIB stream under a reader is damaged: raised by the decompressing stream, and turned by
    the reader into a :class:`CorruptRecordError` of kind ``compressed_stream`` naming the file, the
    damaged compressed byte and the last good record."""


class DecodeError(InfeedError, ValueError):
    """A record is not a ``tf.train.Example`` that meets the feature spec.

    Attributes: ``feature`` (name, or None for damage outside any feature),
    ``record_index``, ``expected``, ``found``, and where known ``path`` and
    ``offset`` (the byte offset inside the record, or of the record in its file).
    """

    def __init__(self, feature, record_index, expected, found, path=None, offset=None):
        self.feature = feature
        self.record_index = record_index
        self.expected = expected
        self.found = found
        self.path = path
        self.offset = offset
        where = f"record {record_index}"
        if path is not None:
            where = f"{path}: {where}"
        if offset is not None:
            where += f" (byte {offset})"
        what = f"feature {_short(repr(feature))}" if feature is not None else "record"
        super().__init__(f"{where}: {what}: expected {_short(str(expected))}, found {_short(str(found))}")

    def __reduce__(self):
        return (type(self), (self.feature, self.record_index, self.expected, self.found,
                             self.path, self.offset))


class TransformError(InfeedError):
    """A dataset's ``transform`` or ``batch_transform`` raised, or returned what its ``outputs`` do not declare.

    Attributes: ``function`` (its qualified name, ``module:name``), ``problem`` (the exception's type and
    message, or the output that does not match), ``path`` and ``record_index`` (the record, for
    ``transform``; None for ``batch_transform``), ``epoch`` and ``batch`` (the batch's index in its epoch),
    ``error_type`` (the name of the exception's type; None for an output that does not match) and
    ``traceback`` (the exception's traceback, formatted where it was raised; also a note of this error).
    """

    #: How much of a traceback is kept: its end, where the user's code raised (the ring's error record is 4 KB).
    TRACEBACK_LIMIT = 1600

    def __init__(self, function, problem, path=None, record_index=None, epoch=None, batch=None, error_type=None,
                 traceback=""):
        self.function = function
        problem = str(problem)
        self.problem = problem if len(problem) <= 400 else problem[:400] + "..."
        self.path = path
        self.record_index = record_index
        self.epoch = epoch
        self.batch = batch
        self.error_type = error_type
        limit = self.TRACEBACK_LIMIT
        self.traceback = traceback if len(traceback) <= limit else "..." + traceback[-limit:]
        where = f"epoch {epoch}, batch {batch}"
        if record_index is not None:
            where = f"{path}: record {record_index} ({where})"
        stage = "batch_transform" if record_index is None else "transform"
        super().__init__(f"{where}: {stage} {function}: {self.problem}")
        if self.traceback:
            self.add_note(f"The {stage}'s traceback, in the worker:\n{self.traceback.rstrip()}")

    def __reduce__(self):
        return (type(self), (self.function, self.problem, self.path, self.record_index, self.epoch, self.batch,
                             self.error_type, self.traceback))


class WorkerDied(InfeedError):
    """A process on the other side of a ring died (killed, crashed, exited) while it was needed.

    Attributes: ``pid``, ``signal`` (the number of the signal that killed it, or
    None when it exited or the cause is unknown), ``exitcode`` (its exit status
    when it exited, else None), ``detail`` and ``output`` (the end of what a
    decoding worker wrote on its stderr, where known: the traceback of one that
    failed before it could say why through the ring; else "").
    """

    def __init__(self, pid, signal=None, exitcode=None, detail="", output=""):
        self.pid = pid
        self.signal = signal
        self.exitcode = exitcode
        self.detail = detail
        self.output = output
        if signal is not None:
            try:
                how = f"killed by {_signal.Signals(signal).name} ({signal})"
            except ValueError:
                how = f"killed by signal {signal}"
        elif exitcode is not None:
            how = f"exited with status {exitcode}"
        else:
            how = "is gone"
        msg = f"worker process {pid} {how}"
        if detail:
            msg += f" ({detail})"
        if output.strip():
            msg += "; the end of its stderr:\n" + output.rstrip()
        super().__init__(msg)

    def __reduce__(self):
        return (type(self), (self.pid, self.signal, self.exitcode, self.detail, self.output))


class Timeout(InfeedError, TimeoutError):
    """A wait on a ring did not finish in time.

    Attributes: ``what`` (the wait), ``seconds``, and where a worker is known to keep
    what was awaited, ``worker`` (its index) and ``pid`` (else None): the worker
    holding the awaited batch's slot out of turn (it took the slot for a later
    batch before that one was written, and has not handed it back) where there
    is one, else the worker that took the batch. ``what`` names both.
    """

    def __init__(self, what, seconds, worker=None, pid=None):
        self.what = what
        self.seconds = seconds
        self.worker = worker
        self.pid = pid
        super().__init__(f"timed out after {seconds:g} s waiting for {what}")

    def __reduce__(self):
        return (type(self), (self.what, self.seconds, self.worker, self.pid))


class AttachError(InfeedError):
    """A shared-memory ring could not be attached.

    Attributes: ``name`` (the segment), ``check`` (which check failed: ``"exists"``,
    ``"owner"``, ``"mode"``, ``"size"``, ``"magic"``, ``"version"``, ``"state"``
    or ``"layout"``), ``expected`` and ``found``.
    """

    def __init__(self, name, check, expected, found):
        self.name = name
        self.check = check
        self.expected = expected
        self.found = found
        super().__init__(f"cannot attach ring {name!r}: {check} check failed: "
                         f"expected {_short(str(expected))}, found {_short(str(found))}")

    def __reduce__(self):
        return (type(self), (self.name, self.check, self.expected, self.found))


class ShmSpaceError(InfeedError, OSError):
    """``/dev/shm`` has too little free space for a ring. Attributes: ``path``, ``needed``, ``free`` (bytes)."""

    def __init__(self, path, needed, free):
        self.path = path
        self.needed = needed
        self.free = free
        super().__init__(f"{path}: a ring needs {needed} bytes but only {free} are free "
                         f"(make the ring smaller or enlarge the tmpfs, e.g. docker --shm-size)")
        self.errno = errno.ENOSPC

    def __reduce__(self):
        return (type(self), (self.path, self.needed, self.free))


class IndexFileError(InfeedError):
    """A record-index sidecar cannot be used: damaged, inconsistent, or built for another size of
    its data file (stale). Attributes: ``path`` (the sidecar) and ``problem``."""

    def __init__(self, path, problem):
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: unusable record index: {problem}")

    def __reduce__(self):
        return (type(self), (self.path, self.problem))


class FileSystemConfigError(InfeedError, ValueError):
    """A URI, or a filesystem registered for it, that cannot be opened as given: an option its query cannot
    take, a registration that does not build. Attributes: ``uri`` (the URI or registered prefix) and
    ``problem``."""

    def __init__(self, uri, problem):
        self.uri = uri
        self.problem = problem
        super().__init__(f"{uri}: {problem}")

    def __reduce__(self):
        return (type(self), (self.uri, self.problem))


class TfdsBuildError(InfeedError, ValueError):
    """A tensorflow-datasets build that cannot be read as named: no build in the folder, several configs or
    versions, metadata that is not TFDS's, a feature no spec reads, a split it does not have. Attributes:
    ``folder`` and ``problem``."""

    def __init__(self, folder, problem):
        self.folder = folder
        self.problem = problem
        super().__init__(f"{folder}: {problem}")

    def __reduce__(self):
        return (type(self), (self.folder, self.problem))


class SourceChangedError(InfeedError, OSError):
    """A file changed after infeed pinned the version it reads: what was read of it no longer goes with what
    would be read next, and nothing of the new version is handed out beside the old.

    Attributes: ``path``; ``offset``, the byte offset of the read that found it; ``record_index``, None where
    the file as a whole was found changed, else the record read through an index that is not the record
    indexed; ``before`` and ``after``: the file's (size, modification time) when opened and when found
    changed, or, for a record (``record_index`` set), its data CRC as indexed and as read."""

    def __init__(self, path, before, after, offset, record_index=None):
        self.path, self.before, self.after, self.offset = path, before, after, offset
        self.record_index = record_index
        if record_index is None:
            message = (f"{path}: changed while it was read (size {before[0]}, modified {before[1]} when opened; "
                       f"size {after[0]}, modified {after[1]} at the read of byte {offset}): no record of the new "
                       "version is mixed with the old; read the file again from its start")
        else:
            message = (f"{path}: record {record_index} at byte offset {offset} is not the record indexed (data CRC "
                       f"{before:#010x} in the index, {after:#010x} in the file): the file was rewritten after it "
                       "was indexed; no record of the new version is mixed with the old: index it again "
                       "(infeed index) and read it from its start")
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (self.path, self.before, self.after, self.offset, self.record_index))


class ColumnError(InfeedError, ValueError):
    """A column that a tf.train.Example cannot hold: its type, or one of its values.

    Attributes: ``column`` (name), ``arrow_type`` (its Arrow type, as a string),
    ``problem`` (what is wrong and what to do), ``row`` (index of the
    offending row in its input, or None when the type itself is the problem)
    and ``path`` (the input, where known).
    """

    def __init__(self, column: str, arrow_type, problem: str, row: int | None = None, path: str | None = None):
        self.column = column
        self.arrow_type = str(arrow_type)
        self.problem = problem
        self.row = row
        self.path = path
        where = f"column {column!r} ({self.arrow_type})"
        if row is not None:
            where += f", row {row}"
        if path is not None:
            where = f"{path}: {where}"
        super().__init__(f"{where}: {problem}")

    def __reduce__(self):
        return (type(self), (self.column, self.arrow_type, self.problem, self.row, self.path))


class ConvertError(InfeedError, ValueError):
    """``infeed convert`` cannot run as asked: a missing or unreadable input, a bad argument or column."""
