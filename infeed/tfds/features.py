"""A TFDS build's ``features.json`` as the records store it, and the infeed spec that reads them.

TFDS writes each leaf of its ``FeaturesDict`` as one Example feature: a nested dict's as ``outer/inner``; a
tensor's values flattened (``float64`` as ``float_list``, so float32's precision; ``bool``, ``uint8`` and the
other integers as ``int64_list``); a ``ClassLabel`` as an int64; a ``Text`` as bytes; an ``Image`` as its PNG
or JPEG bytes; a ``Sequence`` as the flat values of all its elements, and one with two unknown dimensions or
more (a sequence of sequences) as ``name/ragged_flat_values`` and ``name/ragged_row_lengths_0`` (and ``_1``...
one per nested sequence past the first). :func:`stored_features` lists them; :func:`tfds_spec` makes the spec:

- every dimension known: ``FixedLen`` of the tensor's shape (a ``ClassLabel``: ``()``, int64);
- one unknown (a sequence's length): ``VarLen``, flattened, its ``max_len`` from the data;
- ragged: a ``VarLen`` of the flat values and one of each level's row lengths, their limits from the data;
- ``Text`` and string scalars: ``Bytes``, ``max_bytes`` from the data;
- ``Image``: ``infeed.Image(key=name, channels=...)`` of the build's channels; its size and crop are the
  user's (``images={name: infeed.Image(size=..., ...)}``), or, where every image has the same size in the
  metadata, that size uncropped.

Limits "from the data" come from reading the split's records for those features alone (all of them, or the
first ``survey_records`` of each shard), unless ``max_lengths`` gives them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from infeed.errors import TfdsBuildError
from infeed.example.spec import Bytes, FixedLen, Image, VarLen
from infeed.example.survey import summarize_files
from infeed.tfds.build import FEATURES_FILE

__all__ = ["StoredFeature", "stored_features", "tfds_spec", "OUTPUT_DTYPES"]

_log = logging.getLogger("infeed")

#: A TFDS tensor dtype -> what infeed decodes it to (float64 is stored as float_list: float32's precision).
OUTPUT_DTYPES = {"float64": "float32", "float32": "float32", "float16": "float16", "bfloat16": "bfloat16",
                 "int64": "int64", "int32": "int32", "int16": "int16", "int8": "int8", "uint8": "uint8",
                 "uint16": "uint16", "uint32": "int64", "bool": "bool"}
_STRINGS = ("string", "str", "object", "bytes")


@dataclass(frozen=True)
class StoredFeature:
    """One Example feature of a TFDS build.

    name: the Example's feature (``meta/id``, ``tokens/ragged_flat_values``); feature: the TFDS feature it
    belongs to (``meta/id``, ``tokens``); kind: ``"tensor"``, ``"text"``, ``"image"``, ``"row_lengths"`` (a
    ragged feature's); dtype: TFDS's; shape: per example, -1 where unknown (a sequence's length), of the
    values as stored (a ragged feature's flat values: ``(-1,)``); encoding: an image's ``"png"`` or
    ``"jpeg"``, a serialized tensor's ``"bytes"`` or ``"zlib"`` (read as bytes), else None; channels: an
    image's, None where unknown.
    """

    name: str
    feature: str
    kind: str
    dtype: str | None
    shape: tuple
    encoding: str | None = None
    channels: int | None = None


def stored_features(doc: Mapping) -> list[StoredFeature]:
    """The Example features of ``features.json``'s document ``doc``, in its order. Raises
    :class:`~infeed.errors.TfdsBuildError` naming a feature whose storage infeed cannot read (a sequence of
    images or texts: lists of bytes)."""
    return list(_walk(doc, "", ()))


def _walk(node: Mapping, name: str, outer: tuple) -> Iterable[StoredFeature]:
    kind = node.get("pythonClassName", "?").rsplit(".", 1)[-1]
    if "featuresDict" in node:
        for key, child in node["featuresDict"].get("features", {}).items():
            yield from _walk(child, f"{name}/{key}" if name else key, outer)
    elif "sequence" in node:
        sequence = node["sequence"]
        yield from _walk(sequence["feature"], name, outer + (int(sequence.get("length", -1)),))
    elif "image" in node:
        image = node["image"]
        dims = _dims(image.get("shape", {}))
        if outer:
            raise TfdsBuildError(FEATURES_FILE, f"feature {name!r}: a sequence of images ({kind}) is a list of "
                                 "encoded images in each record, which no infeed spec reads yet")
        channels = dims[-1] if dims and dims[-1] > 0 else None
        yield StoredFeature(name, name, "image", image.get("dtype", "uint8"), dims,
                            image.get("encodingFormat", "png"), channels)
    elif "classLabel" in node:
        yield from _tensor(name, kind, "int64", outer, "none")
    elif "text" in node:
        if outer:
            raise TfdsBuildError(FEATURES_FILE, f"feature {name!r}: a sequence of texts is a list of bytes in "
                                 "each record, which no infeed spec reads yet")
        yield StoredFeature(name, name, "text", "string", ())
    elif "tensor" in node:
        tensor = node["tensor"]
        yield from _tensor(name, kind, tensor.get("dtype", "float32"), outer + _dims(tensor.get("shape", {})),
                           tensor.get("encoding", "none"))
    else:
        raise TfdsBuildError(FEATURES_FILE, f"feature {name!r}: {node.get('pythonClassName', 'an unknown kind')} "
                                 "stores nothing infeed knows how to read (neither a tensor, an image, a text nor a "
                                 "class label)")


def _tensor(name: str, kind: str, dtype: str, dims: tuple, encoding: str) -> Iterable[StoredFeature]:
    if encoding not in ("none", None):          # serialized (bytes, zlib): one bytes value a record
        yield StoredFeature(name, name, "text", "string", (), encoding)
        return
    if dtype in _STRINGS:
        if dims:
            raise TfdsBuildError(FEATURES_FILE, f"feature {name!r}: a {kind} of strings of shape {dims} is a list "
                                 "of bytes in each record, which no infeed spec reads yet")
        yield StoredFeature(name, name, "text", "string", ())
        return
    if dtype not in OUTPUT_DTYPES:
        raise TfdsBuildError(FEATURES_FILE, f"feature {name!r}: dtype {dtype}, which infeed does not decode "
                                 f"(it decodes {', '.join(OUTPUT_DTYPES)})")
    unknown = sum(d < 0 for d in dims)
    if unknown <= 1:
        yield StoredFeature(name, name, "tensor", dtype, dims)
        return
    # Two unknown dimensions or more: TFDS stores a RaggedTensor's flat values and its row lengths.
    yield StoredFeature(f"{name}/ragged_flat_values", name, "tensor", dtype, (-1,))
    for level in range(unknown - 1):
        yield StoredFeature(f"{name}/ragged_row_lengths_{level}", name, "row_lengths", "int64", (-1,))


def _dims(shape: Mapping) -> tuple:
    return tuple(int(d) for d in shape.get("dimensions", []))


def tfds_spec(stored: Iterable[StoredFeature], files: Iterable[str] = (), *, features: Iterable[str] | None = None,
              images: Mapping | None = None, max_lengths: Mapping[str, int] | None = None,
              survey_records: int | None = None) -> dict:
    """The spec that reads the records of ``stored`` (:func:`stored_features`), keyed by their Example names.

    ``features``: the TFDS features to read (a nested one by its path, ``meta/id``, or its parent's, ``meta``);
    None: all. ``images``: per image feature, an :class:`~infeed.Image` (or a dict of its arguments) giving what
    TFDS cannot know, its size and crop; its ``key`` and, where the build has them, its channels come from the
    build. ``max_lengths``: the limit of a variable-length feature (by Example name or TFDS feature), where
    given, instead of one read from ``files`` (all their records, or the first ``survey_records`` of each).
    """
    everything = list(stored)
    if features is not None:
        features = [features] if isinstance(features, str) else list(features)
        unknown = sorted(set(features) - {part for s in everything for part in _parents(s.feature)})
        if unknown:
            raise ValueError(f"features {unknown} are not features of the build "
                             f"({', '.join(dict.fromkeys(s.feature for s in everything))})")
    stored = [s for s in everything if _chosen(s, features)]
    images = dict(images or {})
    odd = sorted(set(images) - {s.name for s in everything if s.kind == "image"})
    if odd:
        raise ValueError(f"images names {odd}, which are not image features of the build "
                         f"({', '.join(s.name for s in everything if s.kind == 'image') or 'it has none'})")
    max_lengths = dict(max_lengths or {})
    limits = _limits([s for s in stored if _needs_limit(s) and _given(s, max_lengths) is None], files,
                     survey_records)
    spec = {}
    for s in stored:
        if s.kind == "image":
            spec[s.name] = _image(s, images.get(s.name))
            continue
        limit = _given(s, max_lengths)
        limit = limits.get(s.name, 0) if limit is None else limit
        if s.kind == "text":
            spec[s.name] = Bytes(max_bytes=limit)
        elif _needs_limit(s):
            spec[s.name] = VarLen(OUTPUT_DTYPES[s.dtype], max_len=limit)
        else:
            spec[s.name] = FixedLen(s.shape, OUTPUT_DTYPES[s.dtype])
    return spec


def _chosen(s: StoredFeature, features) -> bool:
    return features is None or any(part in set(features) for part in _parents(s.feature))


def _parents(feature: str) -> list[str]:
    """``a/b/c``, ``a/b`` and ``a``: a feature and the dicts it is nested in."""
    parts = feature.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _needs_limit(s: StoredFeature) -> bool:
    return s.kind == "text" or (s.kind != "image" and any(d < 0 for d in s.shape))


def _given(s: StoredFeature, max_lengths: Mapping) -> int | None:
    for key in (s.name, s.feature):
        if key in max_lengths:
            return max_lengths[key]
    return None


def _limits(wanted: list[StoredFeature], files: Iterable[str], survey_records: int | None) -> dict:
    """The most values (bytes, for texts) any record of ``files`` holds, per feature of ``wanted``."""
    if not wanted:
        return {}
    files = list(files)
    if not files:
        raise ValueError(f"features {[s.name for s in wanted]} have no fixed length in the build's metadata: give "
                         "the files to read their lengths from, or max_lengths")
    began = time.monotonic()
    summary = summarize_files(files, survey_records, only={s.name for s in wanted})
    _log.info("infeed: read %d records of %d files (%s) for the longest %s: %.2f s", summary.records,
              summary.files, "all of them" if summary.complete else f"the first {survey_records} of each",
              ", ".join(s.name for s in wanted), time.monotonic() - began)
    out = {}
    for s in wanted:
        stats = summary.features.get(s.name)
        if stats is None:
            out[s.name] = 0
        elif s.kind == "text":
            out[s.name] = stats.max_bytes or 0
        else:
            out[s.name] = stats.max_values
    return out


def _image(s: StoredFeature, given) -> Image:
    extra = {"key": s.name, **({"channels": s.channels} if s.channels in (1, 3, 4) else {})}
    if isinstance(given, Image):
        return replace(given, **extra)
    if isinstance(given, Mapping):
        return Image(**{**dict(given), **extra})
    if given is not None:
        raise ValueError(f"images[{s.name!r}] must be an infeed.Image or a dict of its arguments, got {given!r:.80}")
    height, width = (s.shape[:2] + (-1, -1))[:2]
    if height > 0 and width > 0:
        return Image(size=(height, width), resize=None, **extra)
    raise ValueError(f"feature {s.name!r}: its {s.encoding.upper()} images have any size in the build's metadata "
                     f"(shape {tuple(d if d > 0 else None for d in s.shape)}): give their size and crop, e.g. "
                     f"images={{{s.name!r}: infeed.Image(size=(224, 224), resize='random_resized_crop')}}")
