"""What a daemon reads: files, feature spec, batching, shuffling, epochs and host sharding.

A :class:`Dataset` is a plain description, checked when it is made and
serialisable to JSON (``infeed serve --config ds.json`` reads one; the worker
processes receive one). It fixes the sequence of batches completely: for the
same dataset and seed, every run, every number of workers and every resume
yields the same batches in the same order.

The order, per epoch ``e`` (0, 1, ...):

1. the files of this host's shard (every ``num_shards``-th file from
   ``shard_index`` when there are at least ``num_shards`` files; all of them
   otherwise), shuffled with ``(seed, e)`` when ``shuffle_files``;
2. their records, one file after another, or with ``interleave=(cycle, block)``
   interleaved as tf.data's and TFDS's ``interleave`` takes them: ``cycle`` files
   open at once, ``block`` records from each in turn, a file that ends replaced by
   the next (needs record indexes, built for it where missing: TFDS reads a split
   with ``(16, 16)``); with fewer files than shards, every ``num_shards``-th record
   of that stream from ``shard_index``;
3. with ``shuffle_buffer=N > 1``, passed through a buffer of N records drawn
   at random with ``(seed, e)``; with ``shuffle="global"`` (needs ``infeed
   index`` sidecars), a uniform permutation of the epoch's records instead
   (whether the records are read in order or through a sidecar's offsets,
   the sequence is the same);
4. cut into batches of ``batch_size``; the epoch's last, partial batch is
   dropped (``final_batch="drop"``) or filled with zero rows flagged in a bool
   ``is_padding`` array (``"pad"``; every batch then carries ``is_padding``).
   With ``skip_corrupt``, a record whose image does not decode is a zero row
   flagged in ``is_padding`` too (which every batch then carries), where it
   stands in its batch: the batches, their records and their rows are the same
   for any number of workers and after a resume.

Epochs follow each other (``num_epochs=None``: forever); with
``steps_per_slot=K`` every K consecutive batches share one ring slot as
``[K, B, ...]`` arrays, and only the very last slot may hold fewer.

``transform`` and ``batch_transform`` (see :mod:`infeed.daemon.transforms` and
docs/transforms.md) run the user's functions on the decoded records in the
workers; the slots then hold the arrays ``outputs`` declares.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from infeed.daemon.functions import load_function
from infeed.daemon.transforms import check_outputs, outputs_to_json
from infeed.example.codec import ExampleParser
from infeed.example.spec import Padded, spec_from_json, spec_to_json
from infeed.tfrecord.files import record_files
from infeed.tfrecord.index import load_index
from infeed.tfrecord.index_build import BUILD_THREADS, BuildResult, build_indexes, compressed_files
from infeed.tfrecord.index_cache import default_index_dir, find_index, locate_index
from infeed.tfrecord.reader import COMPRESSIONS, MAX_RECORD_SIZE, read_records, remote_file_info

__all__ = ["Dataset", "PADDING_KEY"]

_log = logging.getLogger("infeed")

#: With ``build_indexes="auto"``, the workers from which a Daemon over local files builds their missing indexes:
#: with two, each streaming worker still reads every record, and on 2 cores the indexed path (its batches decoded
#: where they lie in the reads) ran at 1.5-1.7x of the streamed one on mnist and 0.93-1.13x on criteo
#: (``python -m bench infeed --workers 1,2``, four runs); on the 16-CPU host (docs/bench/h100-host) streamed
#: reading peaked at W=4 on ImageNet-sized records (1.7x, 6.1x indexed at W=15). One worker reads every record
#: either way: it streams.
LOCAL_BUILD_WORKERS = 2
#: With ``build_indexes="auto"``, the mean size of ``gs://`` objects from which a Daemon of 2 workers or more builds
#: their indexes: pyarrow opens each object with a download of the whole of it, which its reads by offset then
#: leave, so every worker's open of an object brings what the socket buffers take (4 MB measured through a relay
#: counting bytes, on loopback); from 16 MiB objects on, W workers' opens and one read of each record cost less
#: than W streams. The mean of up to :data:`SIZE_SAMPLE` objects, looked up once.
GCS_BUILD_MIN_BYTES = 16 << 20
SIZE_SAMPLE = 8

#: The bool ``[B]`` array of a batch with ``final_batch="pad"`` or ``skip_corrupt``: True on padding rows.
PADDING_KEY = "is_padding"

_FINAL_BATCH = ("drop", "pad")
_SHUFFLE = ("buffer", "global")
#: The settings of the user's transforms: left out of the fingerprint when unset (older states still resume).
_TRANSFORM_SETTINGS = ("transform", "batch_transform", "outputs")


def _positive(name: str, value, *, zero: bool = False) -> int:
    low = 0 if zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def _digest(doc) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


class _Matched(tuple):
    """File names already matched (a dataset handed to a worker is not globbed again)."""


class Dataset:
    """A fully determined sequence of batches from TFRecord files (see the module's docstring).

    ``files``: a path, glob pattern or URI (``gs://``, ``s3://``, ``hdfs://``, any
    ``pyarrow.fs`` scheme), or a list of them; matched once, when the dataset is made.
    ``features``: ``{name: FixedLen | VarLen | Bytes | Image}``; an Image's random crop and flip draw
    from ``seed`` and the record's ``(epoch, file, record)`` (the same for any worker count, order or
    resume), and with ``skip_corrupt`` a record whose image does not decode is a zero row flagged in
    ``is_padding`` (logged, counted in ``stats()``) instead of failing. ``labels``: the names of
    the features that are labels (for the estimator, which hands them to
    ``model_fn`` apart); they are decoded like any feature. ``max_record_size``:
    the longest record read (default 256 MiB); a longer one is a
    ``CorruptRecordError`` of kind ``record_too_large`` naming file and offset.

    ``transform``: a function ``(example, rng) -> dict`` run in the workers on each decoded record
    (``example`` is ``{name: numpy view of its row}``; ``rng``, passed when the function takes a second
    parameter, is the record's ``numpy.random.Generator``). ``batch_transform``: ``(batch, rng) -> dict``
    on each batch's real rows, after ``transform``. Each is a module-level function or its
    ``"module:function"`` name: the workers import it by that name. ``outputs``: what they return, one
    example's ``{name: (shape, dtype)}``, which the batches then hold (see docs/transforms.md).

    ``index_dir``: where record indexes kept apart from the data are looked for when a file has no
    ``infeed index`` sidecar (``infeed index --output-dir``: for files in read-only places); None: the
    default (``$INFEED_INDEX_DIR``, else ``$XDG_CACHE_HOME/infeed/indexes``; :mod:`infeed.tfrecord.index_cache`),
    False: sidecars only. A sidecar comes first. It changes no batch, only how the records are reached.
    ``build_indexes``: whether a :class:`~infeed.Daemon` over uncompressed files without an index builds their
    indexes into :attr:`index_dir` before its first epoch (:meth:`build_missing_indexes`; each file read once),
    so its workers read only their own batches: ``"auto"`` (the default) where that saves reads (a global
    shuffle; ``s3://`` objects with 2 workers or more and no ``shuffle_buffer``, each worker of which would
    stream every object; local files from LOCAL_BUILD_WORKERS workers on), True always, False never: the
    workers stream (each reads every record), as with compressed files.

    ``interleave``: ``(cycle, block)``, the files' records interleaved as tf.data's ``interleave(cycle_length,
    block_length)`` (and TFDS's reads of a split: ``(16, 16)`` by default) takes them, the same for any
    worker count and after a resume; None: one file after another. It reads through record indexes (a global
    shuffle's), built for it where missing unless ``build_indexes=False``.
    """

    def __init__(self, files: str | os.PathLike | Sequence, features: Mapping, batch_size: int, *,
                 shuffle_files: bool = False, shuffle_buffer: int = 0, shuffle: str = "buffer",
                 seed: int = 0, num_epochs: int | None = 1, final_batch: str = "drop",
                 shard_index: int = 0, num_shards: int = 1, steps_per_slot: int = 1,
                 compression: str | None = "auto", skip_corrupt: bool = False,
                 labels: str | Sequence[str] | None = None, max_record_size: int = MAX_RECORD_SIZE,
                 transform=None, batch_transform=None, outputs: Mapping | None = None,
                 index_dir: str | os.PathLike | bool | None = None, build_indexes: bool | str = "auto",
                 interleave: Sequence[int] | None = None):
        self.paths = tuple(files) if isinstance(files, _Matched) else tuple(record_files(files))
        self._file_numbers = {path: i for i, path in enumerate(self.paths)}
        self.features = dict(features)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        self.parser = ExampleParser(self.features, seed=seed, skip_corrupt=skip_corrupt)    # checks the spec
        self.transform = None if transform is None else load_function(transform, "transform")
        self.batch_transform = None if batch_transform is None else load_function(batch_transform, "batch_transform")
        transformed = self.transform is not None or self.batch_transform is not None
        if transformed and outputs is None:
            raise ValueError("transform and batch_transform need outputs: one example's {name: (shape, dtype)} "
                             "as they return it")
        if outputs is not None and not transformed:
            raise ValueError("outputs declares what transform or batch_transform return, and neither is given")
        self.outputs = None if outputs is None else check_outputs(outputs)
        names = self.outputs if transformed else self.features
        what = "an output" if transformed else "a feature"
        if PADDING_KEY in names and (final_batch == "pad" or skip_corrupt):
            raise ValueError(f"{what} named {PADDING_KEY!r} clashes with the padding mask of "
                             f"{'final_batch=' + repr(final_batch) if final_batch == 'pad' else 'skip_corrupt'}")
        self.batch_size = _positive("batch_size", batch_size)
        self.shuffle_files = bool(shuffle_files)
        self.shuffle_buffer = _positive("shuffle_buffer", shuffle_buffer, zero=True)
        if shuffle not in _SHUFFLE:
            raise ValueError(f"shuffle must be one of {_SHUFFLE}, got {shuffle!r}")
        self.shuffle = shuffle
        self.seed = seed
        self.num_epochs = None if num_epochs is None else _positive("num_epochs", num_epochs)
        if final_batch not in _FINAL_BATCH:
            raise ValueError(f"final_batch must be one of {_FINAL_BATCH}, got {final_batch!r}")
        self.final_batch = final_batch
        self.num_shards = _positive("num_shards", num_shards)
        self.shard_index = _positive("shard_index", shard_index, zero=True)
        if self.shard_index >= self.num_shards:
            raise ValueError(f"shard_index must be below num_shards={num_shards}, got {shard_index}")
        self.steps_per_slot = _positive("steps_per_slot", steps_per_slot)
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
        self.compression = compression
        self.skip_corrupt = bool(skip_corrupt)
        self.max_record_size = _positive("max_record_size", max_record_size)
        labels = [labels] if isinstance(labels, str) else list(labels or ())
        missing = [n for n in labels if n not in names]
        if missing:
            raise ValueError(f"labels {missing} are not {'outputs' if transformed else 'features of the spec'} "
                             f"({sorted(names)})")
        self.labels = tuple(labels)
        if index_dir is True or (index_dir is not None and index_dir is not False
                                 and not isinstance(index_dir, (str, os.PathLike))):
            raise ValueError(f"index_dir must be a directory path, None (the default) or False (sidecars only), "
                             f"got {index_dir!r:.80}")
        #: Where indexes apart from the data are looked for: an absolute path, None (the default directory of
        #: the process that looks: a config read on another host looks in that host's), or False.
        self.index_dir = index_dir if index_dir is None or index_dir is False else os.path.abspath(os.fspath(index_dir))
        if not (build_indexes is True or build_indexes is False or build_indexes == "auto"):
            raise ValueError(f"build_indexes must be 'auto', True or False, got {build_indexes!r:.80}")
        self.build_indexes = build_indexes
        if interleave is not None:
            if isinstance(interleave, (str, bytes)) or not isinstance(interleave, Sequence) or len(interleave) != 2:
                raise ValueError(f"interleave must be a (cycle, block) pair of positive ints or None, got "
                                 f"{interleave!r:.80}")
            interleave = (_positive("interleave's cycle", interleave[0]),
                          _positive("interleave's block", interleave[1]))
        self.interleave = interleave

    @classmethod
    def from_tfds(cls, build, split: str, batch_size: int, *, features=None, images=None, max_lengths=None,
                  survey_records: int | None = None, **kwargs) -> "Dataset":
        """A Dataset over split ``split`` of a tensorflow-datasets build, by its own metadata (no TensorFlow or
        TFDS import): its shards in TFDS's order, the spec of its features (:func:`infeed.tfds.tfds_spec`:
        ``features`` to read a few, ``images`` for each image feature's size and crop, ``max_lengths`` for
        the variable-length ones, which are otherwise read from the split's records, all or
        ``survey_records`` of each shard). ``build``: the build's folder (a dataset, config or version folder
        with one build in it) or an :class:`infeed.tfds.TfdsBuild`. ``kwargs``: the Dataset's own."""
        from infeed.tfds import TfdsBuild, build_spec, open_build

        if not isinstance(build, TfdsBuild):
            build = open_build(build)
        spec = build_spec(build, split, features=features, images=images, max_lengths=max_lengths,
                          survey_records=survey_records)
        return cls(_Matched(build.split(split).files), spec, batch_size, **kwargs)

    # --- derived ------------------------------------------------------------------------------
    @property
    def shards_by_file(self) -> bool:
        """Whether hosts split the files (True) or the records of every file (False)."""
        return len(self.paths) >= self.num_shards

    def file_number(self, path: str) -> int:
        """``path``'s position in :attr:`paths` (all hosts' files, before any shuffle): a record's name
        ``(epoch, file, record)`` uses it."""
        return self._file_numbers[path]

    def shard_paths(self) -> tuple[str, ...]:
        """This host's files, before the per-epoch shuffle."""
        if self.shards_by_file:
            return self.paths[self.shard_index::self.num_shards]
        return self.paths

    def indexes(self, located: Mapping | None = None) -> dict | None:
        """``{path: RecordIndex}`` for this host's files when every one has an ``infeed index``
        sidecar or an index in :attr:`index_dir`, else None; ``shuffle="global"`` needs them (ValueError
        naming a file without one). ``located``: where another process found them (:meth:`index_files`), read
        from there alone, with no look-up of the files (each a round trip or two for a bucket's, per worker).

        With them, workers read only the records of their own batches, global
        shuffling is possible, and a resume jumps straight to its batch.
        """
        if located is not None:
            if not located:
                return None
            return {path: load_index(path, index_file=located[path][0], data_size=located[path][1])
                    for path in self.shard_paths()}
        found = {}
        for path in self.shard_paths():
            index = find_index(path, self.index_dir)
            if index is None:
                if self.needs_indexes:
                    kept = "" if self.index_dir is False else f" or in {self.index_dir or default_index_dir()}"
                    why = "shuffle='global'" if self.shuffle == "global" else "interleave"
                    raise ValueError(f"{why} needs a record index for every file and {path} has none "
                                     f"beside it{kept}: run `infeed index` on the files first (`--output-dir DIR` "
                                     f"where they cannot have one beside them)")
                return None
            found[path] = index
        return found

    def index_files(self) -> dict:
        """``{path: (index file, data size)}``: where the index of each of this host's files is and the size it
        was built for (:func:`~infeed.tfrecord.index_cache.locate_index`, up to ``BUILD_THREADS`` files at
        once, after the first), for :meth:`indexes` in the workers; empty where a file has none (they stream:
        where the first has none, the others are not looked up)."""
        paths = self.shard_paths()
        first = locate_index(paths[0], self.index_dir) if paths else None
        if first is None:                   # the files stream: the others are not looked up
            return {}
        with ThreadPoolExecutor(max(1, min(BUILD_THREADS, len(paths) - 1))) as pool:
            located = [first, *pool.map(lambda path: locate_index(path, self.index_dir), paths[1:])]
        if any(found is None for found in located):
            return {}
        return {path: (entry, index.file_size) for path, (index, entry) in zip(paths, located)}

    def build_missing_indexes(self, num_workers: int = 1) -> BuildResult | None:
        """Builds the index of each of this host's files that has none (:func:`infeed.tfrecord.index_build.build_indexes`,
        into :attr:`index_dir`), where every file is uncompressed and ``build_indexes`` asks for it for
        ``num_workers`` workers (and ``index_dir`` is not False); logs once that compressed files stream. Returns
        what was built, or None where nothing was."""
        if self.build_indexes is False or self.index_dir is False:
            return None
        if self.build_indexes == "auto" and not self._indexes_pay(num_workers):
            return None
        missing = [path for path in self.shard_paths() if find_index(path, self.index_dir) is None]
        if not missing:
            return None
        compressed = compressed_files(missing, self.compression)
        if compressed:
            _log.info("infeed: %d of the %d files are compressed (%s): no random access in them, so the workers "
                      "stream every file, each reading every record", len(compressed), len(self.shard_paths()),
                      compressed[0] if len(compressed) == 1 else f"{compressed[0]} ...")
            return None
        return build_indexes(missing, self.index_dir or default_index_dir())

    @property
    def needs_indexes(self) -> bool:
        """Whether the order needs every file's record index: a global shuffle, or an interleave."""
        return self.shuffle == "global" or self.interleave is not None

    def _indexes_pay(self, num_workers: int) -> bool:
        """Whether, with ``build_indexes="auto"``, building this host's missing indexes saves reads: a global
        shuffle needs them; without them each of several workers streams every object behind a URI (W times
        the egress); local files from LOCAL_BUILD_WORKERS on (one worker reads every record either way, and
        streams from the page cache)."""
        if self.needs_indexes:
            return True
        if num_workers < 2:
            return False
        paths = self.shard_paths()
        if not any("://" in path for path in paths):
            return num_workers >= LOCAL_BUILD_WORKERS
        # A bucket's objects, where reads by offset were measured to cost less than W streams (an S3 server
        # behind a relay counting bytes, tests/object_stores): S3, where runs of batches whose records follow
        # each other in the file are read with one request (infeed/daemon/read_ahead.py; no shuffle buffer:
        # with one, a request per record, 836 requests for 800 records of 58 bytes, 9x the data's bytes in
        # the response heads alone). gs:// only for objects of GCS_BUILD_MIN_BYTES or more: each worker's open of
        # an object costs its socket buffers' worth besides (400 KB objects: 2.3x and 3.3x the data an epoch at
        # W=2 and 3, more than streaming).
        if self.shuffle_buffer != 0:
            return False
        if all(path.startswith("s3://") for path in paths):
            return True
        if all(path.startswith("gs://") for path in paths):
            sizes = [remote_file_info(path)[2].size for path in paths[:SIZE_SAMPLE]]
            return sum(sizes) / len(sizes) >= GCS_BUILD_MIN_BYTES
        return False

    def count_records(self) -> int:
        """The records of one epoch of this host's shard, from ``infeed index`` sidecars where every
        file has one, else by reading the files' framing (header CRCs and lengths; nothing decoded)."""
        indexes = self.indexes()
        total = 0
        for path in self.shard_paths():
            if indexes is not None:
                total += indexes[path].count
                continue
            with contextlib.closing(self.open_records(path)) as reader:
                while n := reader.skip(1 << 20):
                    total += n
        return total if self.shards_by_file else len(range(self.shard_index, total, self.num_shards))

    def open_records(self, path: str):
        """A reader of ``path`` with this dataset's compression, ``skip_corrupt`` and ``max_record_size``."""
        return read_records(path, compression=self.compression, skip_corrupt=self.skip_corrupt,
                            max_record_size=self.max_record_size)

    def template(self) -> dict:
        """One batch's arrays (``{name: (shape, dtype)}``) as a ring slot holds them: the decoded features,
        or with transforms, their ``outputs``."""
        def batch_of(spec):
            shape, dtype = spec
            return (self.batch_size, *shape), dtype

        def example_of(arr):
            return arr.shape[1:], arr.dtype

        example = self.outputs
        if example is None:
            example = {name: Padded(example_of(a.values), example_of(a.lengths)) if isinstance(a, Padded)
                       else example_of(a) for name, a in self.parser.allocate(0).items()}
        layout = {name: Padded(batch_of(spec.values), batch_of(spec.lengths)) if isinstance(spec, Padded)
                  else batch_of(spec) for name, spec in example.items()}
        if self.padded:
            layout[PADDING_KEY] = ((self.batch_size,), "bool")
        return layout

    @property
    def padded(self) -> bool:
        """Whether every batch carries the ``is_padding`` mask: with ``final_batch="pad"`` or ``skip_corrupt``."""
        return self.final_batch == "pad" or self.skip_corrupt

    def fingerprint(self) -> str:
        """A digest of everything that fixes the batch sequence except the seed (checked on resume)."""
        return _digest(self._sequence_settings())

    def identity(self) -> dict:
        """What :meth:`fingerprint` digests, setting by setting: the files and the feature spec as
        digests (and the outputs of transforms), the others as they are. A feed's state carries it, so
        that a resume with another dataset names the settings that differ."""
        doc = self._sequence_settings()
        files, features = doc.pop("files"), doc.pop("features")
        if "outputs" in doc:
            doc["outputs"] = f"sha256 {_digest(doc['outputs'])}"
        return {"files": f"{len(files)} files, sha256 {_digest(files)}", "features": f"sha256 {_digest(features)}",
                **doc}

    def _sequence_settings(self) -> dict:
        """The settings that fix the batch sequence, but for the seed (checked apart): the transforms' by
        their names and outputs, when there are any."""
        doc = self.to_json()
        del doc["seed"], doc["num_epochs"], doc["steps_per_slot"], doc["labels"], doc["max_record_size"]
        del doc["index_dir"], doc["build_indexes"]
        for name in (*_TRANSFORM_SETTINGS, "interleave"):      # unset: as before they existed (older states)
            if doc[name] is None:
                del doc[name]
        return doc

    # --- JSON ---------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """Plain JSON data; :meth:`from_json` makes the same dataset again."""
        return {"files": list(self.paths), "features": spec_to_json(self.features),
                "batch_size": self.batch_size, "shuffle_files": self.shuffle_files,
                "shuffle_buffer": self.shuffle_buffer, "shuffle": self.shuffle, "seed": self.seed,
                "num_epochs": self.num_epochs, "final_batch": self.final_batch,
                "shard_index": self.shard_index, "num_shards": self.num_shards,
                "steps_per_slot": self.steps_per_slot, "compression": self.compression,
                "skip_corrupt": self.skip_corrupt, "labels": list(self.labels),
                "max_record_size": self.max_record_size,
                "transform": None if self.transform is None else self.transform.name,
                "batch_transform": None if self.batch_transform is None else self.batch_transform.name,
                "outputs": None if self.outputs is None else outputs_to_json(self.outputs),
                "index_dir": self.index_dir, "build_indexes": self.build_indexes,
                "interleave": None if self.interleave is None else list(self.interleave)}

    @classmethod
    def from_json(cls, doc: Mapping, *, matched: bool = False) -> "Dataset":
        """The dataset a JSON object describes; ``features`` as :func:`infeed.example.spec.spec_to_json` writes it.

        ``matched``: ``files`` lists file names already matched (from :meth:`to_json`), used as they are.
        """
        if not isinstance(doc, Mapping):
            raise ValueError(f"a dataset config is a JSON object, found {type(doc).__name__}")
        fields = dict(doc)
        try:
            files, features, batch_size = fields.pop("files"), fields.pop("features"), fields.pop("batch_size")
        except KeyError as e:
            raise ValueError(f"a dataset config needs {e.args[0]!r}") from None
        try:
            if matched:
                files = _Matched(files)
            return cls(files, spec_from_json(features), batch_size, **fields)
        except TypeError as e:
            raise ValueError(f"dataset config: {e}") from None

    def replace(self, **changes) -> "Dataset":
        """A copy with some settings changed (the files are not matched again)."""
        return Dataset.from_json({**self.to_json(), **changes}, matched=True)

    def __repr__(self) -> str:
        transforms = "".join(f", {name}={f.name}" for name, f in (("transform", self.transform),
                                                                  ("batch_transform", self.batch_transform)) if f)
        return (f"Dataset({len(self.paths)} files, batch_size={self.batch_size}, "
                f"features={list(self.features)}, seed={self.seed}{transforms})")
