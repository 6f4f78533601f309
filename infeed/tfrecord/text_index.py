"""The text indexes of ``tfrecord2idx`` (NVIDIA DALI's tool, and the ``tfrecord`` package's
``tfrecord.tools.tfrecord2idx``): one line per record, ``OFFSET LENGTH`` in decimal, where each record
starts in the file and its whole length (its 16 bytes of framing included)::

    0 1043
    1043 988

Read wherever infeed reads an index (a sidecar, a file in an index directory, ``load_index(...,
index_file=)``), told apart from infeed's binary sidecars by their first bytes. They say neither the
data file's size nor its records' CRCs, so the lines must tile the file exactly (the first record at
byte 0, each next one where the one before ends, the last ending at the file's end: else the index is
stale or damaged, an :class:`~infeed.errors.IndexFileError` naming it), and reads through one pin the
file as version-1 sidecars do (its size and modification time, looked up again after each batch's
reads). Every record read through one is still checked alone (its header against the index, both CRCs).

Memory: the text is read whole, and refused unread past the longest text a file of that size can need
(one line per 16 bytes of data, 42 bytes a line); the index then costs 16 bytes a record, as a sidecar.
"""

from __future__ import annotations

import numpy as np

from infeed.errors import IndexFileError

__all__ = ["TEXT_INDEX_SUFFIXES", "looks_like_text_index", "parse_text_index", "text_index_limit"]

#: The names tfrecord2idx's users give its files beside ``FILE`` or in a folder of their own
#: (``FILE.idx`` in DALI's examples, ``FILE.tfindex`` in the tfrecord package's).
TEXT_INDEX_SUFFIXES = (".idx", ".tfindex")

_FRAMING = 16                            # a record's 12 header and 4 footer bytes
_TEXT_BYTES = frozenset(b"0123456789 \t\r\n")
_LINE_BYTES = 2 * 20 + 2                 # two uint64s in decimal, a space, a newline (\r\n: one more, allowed)


def looks_like_text_index(head: bytes) -> bool:
    """Whether an index file starting with ``head`` is meant as a tfrecord2idx text index: its first line is
    digits and blanks (infeed's sidecars start with their magic, ``INFEEDIX``)."""
    first = head.split(b"\n", 1)[0]
    return first[:1].isdigit() and _TEXT_BYTES.issuperset(first)


def text_index_limit(data_size: int) -> int:
    """The most bytes a text index of a data file of ``data_size`` bytes can take: one line per record, and
    each record at least its 16 bytes of framing."""
    return (data_size // _FRAMING + 1) * (_LINE_BYTES + 1)


def parse_text_index(text: bytes, data_size: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, lengths)`` (int64; lengths of each record's data, framing aside) from the text of a
    tfrecord2idx index of a data file of ``data_size`` bytes; :class:`~infeed.errors.IndexFileError`
    naming ``where`` and the first line that does not fit (a malformed line, a record that does not start
    where the one before ended, records that end before or past the file's end)."""
    if len(text) > text_index_limit(data_size):
        raise IndexFileError(where, f"{len(text)} bytes: more than a text index of the data file's {data_size} "
                                    f"bytes can take ({text_index_limit(data_size)}): not an index of this file")
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    body = b"\n".join(lines)
    tokens = body.split()                     # the lines' tokens: a line of other than two has the count off
    if len(tokens) != 2 * len(lines) or not _TEXT_BYTES.issuperset(body):      # which line, only then
        bad = next(i for i, line in enumerate(lines) if len(line.split()) != 2 or not _TEXT_BYTES.issuperset(line))
        raise IndexFileError(where, f"line {bad + 1} is {lines[bad][:60]!r}, not 'OFFSET LENGTH' "
                                    "(a tfrecord2idx text index)")
    try:
        pairs = np.array(tokens, dtype=np.uint64).astype(np.int64).reshape(-1, 2)
    except (ValueError, OverflowError):
        raise IndexFileError(where, "a number too large for a byte offset") from None
    offsets, whole = pairs[:, 0], pairs[:, 1]
    if len(offsets) == 0:
        if data_size:
            raise IndexFileError(where, f"no records, but the data file has {data_size} bytes")
        return offsets, whole
    if (offsets < 0).any() or (whole < 0).any():
        raise IndexFileError(where, "a number too large for a byte offset")
    short = np.flatnonzero(whole < _FRAMING)
    if short.size:
        i = int(short[0])
        raise IndexFileError(where, f"line {i + 1}: record {i} is {whole[i]} bytes long, less than the "
                                    f"{_FRAMING} bytes of a record's framing")
    starts = np.concatenate([np.zeros(1, np.int64), np.cumsum(whole[:-1], dtype=np.int64)])
    gap = np.flatnonzero(offsets != starts)
    if gap.size:
        i = int(gap[0])
        raise IndexFileError(where, f"line {i + 1}: record {i} starts at byte {offsets[i]}, where the records "
                                    f"before it end at byte {starts[i]}")
    end = int(offsets[-1] + whole[-1])
    if end != data_size:
        raise IndexFileError(where, f"stale: its records end at byte {end}, the data file has {data_size} bytes")
    return offsets, whole - _FRAMING
