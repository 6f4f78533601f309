"""The photos of ``bench images`` and ``bench cpus``: JPEG files of real photos at a source size, and the spec
that decodes them to 224x224 with a crop mode.

Crops of the two photos scikit-learn ships, mirrored and tinted per record (mosaics of four where the size asked is
larger), JPEG quality 90, 4:2:0, in the ImageNet layout (``image/encoded``, ``image/class/label``). Kept apart from
the suites so that their measuring processes (:mod:`bench.peers.parallel_parse`) import only this.
"""

from __future__ import annotations

import os
import time

import numpy as np

import infeed

__all__ = ["SIZE", "SOURCES", "MODES", "FORMAT_VERSION", "photo", "write_photos", "ensure_photos", "spec",
           "images_of"]

SIZE = 224
#: Source name -> (height, width, records, quick records); at least daemon_batches(the largest W) batches are
#: written, for the daemons' steady state, then --scale applies.
SOURCES = {"500x375": (375, 500, 512, 128), "1024x768": (768, 1024, 256, 128)}
#: Row name of a crop mode -> infeed.Image's resize.
MODES = {"centre crop": "center_crop", "random resized crop": "random_resized_crop"}
#: The data files' layout version: bump it when the photos change, so that a --data-dir is not reused.
FORMAT_VERSION = 1


def _tile(photos: list, height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """A crop of a random photo, mirrored at random and tinted, at its native resolution."""
    photo = photos[int(rng.integers(len(photos)))]
    y = int(rng.integers(0, photo.shape[0] - height + 1))
    x = int(rng.integers(0, photo.shape[1] - width + 1))
    tile = photo[y:y + height, x:x + width].astype(np.float32)
    if rng.random() < 0.5:
        tile = tile[:, ::-1]
    return np.clip(tile * rng.uniform(0.8, 1.2, 3) + rng.uniform(-20, 20, 3), 0, 255).astype(np.uint8)


def photo(photos: list, height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """A ``height x width`` photo: one crop when the photos are large enough, else a mosaic of four."""
    if all(p.shape[0] >= height and p.shape[1] >= width for p in photos):
        return _tile(photos, height, width, rng)
    top, left = height // 2, width // 2
    rows = [np.concatenate([_tile(photos, h, w, rng) for w in (left, width - left)], axis=1)
            for h in (top, height - top)]
    return np.ascontiguousarray(np.concatenate(rows, axis=0))


def write_photos(path: str, height: int, width: int, records: int, seed: int = 0) -> None:
    """``records`` ImageNet-layout Examples (``image/encoded`` JPEG, ``image/class/label``) to ``path``."""
    import simplejpeg
    from sklearn.datasets import load_sample_images

    photos = [np.asarray(p) for p in load_sample_images().images]
    rng = np.random.default_rng([seed, height, width])
    with infeed.TFRecordWriter(path) as w:
        for i in range(records):
            data = simplejpeg.encode_jpeg(photo(photos, height, width, rng), quality=90, colorsubsampling="420")
            w.write(infeed.encode_example({"image/encoded": data, "image/class/label": i % 1000,
                                           "image/height": height, "image/width": width}))


def ensure_photos(data_dir: str, source: str, records: int, seed: int) -> tuple[str, float | None]:
    """The file of ``records`` photos of ``source`` in ``data_dir``, written unless it is there: its path, and the
    seconds writing it took (None where it was reused)."""
    height, width = SOURCES[source][:2]
    path = os.path.join(data_dir, f"photos-{source}-{records}-seed{seed}-v{FORMAT_VERSION}.tfrecord")
    if os.path.exists(path):
        return path, None
    began, tmp = time.perf_counter(), f"{path}.partial{os.getpid()}"
    try:
        write_photos(tmp, height, width, records, seed)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path, time.perf_counter() - began


def spec(mode: str) -> dict:
    """The spec that decodes a photo to 224x224 with crop ``mode`` (a key of :data:`MODES`), and its label."""
    return {"image": infeed.Image(size=(SIZE, SIZE), resize=MODES[mode]),
            "image/class/label": infeed.FixedLen((), "int64")}


def images_of(records: list) -> list[bytes]:
    """The ``image/encoded`` bytes of each record."""
    out = infeed.ExampleParser({"image/encoded": infeed.Bytes(max_bytes=16 << 20)}).parse(records)["image/encoded"]
    return [bytes(v[:n]) for v, n in zip(out.values, out.lengths)]
