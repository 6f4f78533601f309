"""TFRecord files for tests (``tests/`` is on ``sys.path`` through its conftest.py)."""

import os

import infeed

#: Records of several sizes: empty, one byte, text, random bytes past a buffer's first read, every byte value.
SAMPLE_RECORDS = [b"", b"a", b"hello world" * 10, os.urandom(5000), bytes(range(256)) * 3]


def write_records(path, records=SAMPLE_RECORDS, compression=None):
    """Writes ``records`` to ``path`` with infeed's writer; returns ``path``."""
    with infeed.TFRecordWriter(path, compression=compression) as w:
        for r in records:
            w.write(r)
    return path


def tfrecord2idx(data_path, index_path):
    """Writes the text index of ``data_path`` to ``index_path`` as DALI's tools/tfrecord2idx and ``python -m
    tfrecord.tools.tfrecord2idx`` do (their loop, as they have it): for each record, its offset and its whole
    length, framing included, one record a line. Returns ``index_path`` as a str."""
    import struct

    with open(data_path, "rb") as f, open(index_path, "w") as idx:
        while True:
            current = f.tell()
            byte_len = f.read(8)
            if len(byte_len) == 0:
                break
            f.read(4)
            proto_len = struct.unpack("q", byte_len)[0]
            f.read(proto_len)
            f.read(4)
            idx.write(str(current) + " " + str(f.tell() - current) + "\n")
    return str(index_path)


def write_example_shards(folder, names, examples_of):
    """Writes ``folder/NAME`` for each of ``names`` (the folder made), holding the examples ``examples_of(k)``
    gives for the k-th ({feature: values}, encoded by infeed); returns the paths as strs."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for k, name in enumerate(names):
        path = os.path.join(os.fspath(folder), name)
        with infeed.TFRecordWriter(path) as w:
            for example in examples_of(k):
                w.write(infeed.encode_example(example))
        paths.append(path)
    return paths
