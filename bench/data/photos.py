"""The photos of ``bench images`` and ``bench cpus``: JPEG files of real photos at a source size, and the spec
that decodes them to 224x224 with a crop mode.

Crops of the two photos scikit-learn ships, mirrored and tinted per record (mosaics of four where the size asked is
larger), JPEG quality 90, 4:2:0, in the ImageNet layout (``image/encoded``, ``image/class/label``). A second set,
``textured`` (:data:`PHOTO_SETS`), adds film grain and a fine weave to the same crops: more bits per pixel, so
entropy decoding weighs more, a set to check a gain on that the decoders were not tuned on. Kept apart from the
suites so that their measuring processes (:mod:`bench.peers.parallel_parse`) import only this.
"""

from __future__ import annotations

import os
import time

import numpy as np

import infeed

__all__ = ["SIZE", "SOURCES", "MODES", "PHOTO_SETS", "FORMAT_VERSION", "photo", "write_photos", "ensure_photos",
           "spec", "images_of"]

SIZE = 224
#: Source name -> (height, width, records, quick records); at least daemon_batches(the largest W) batches are
#: written, for the daemons' steady state, then --scale applies.
SOURCES = {"500x375": (375, 500, 512, 128), "1024x768": (768, 1024, 256, 128)}
#: Row name of a crop mode -> infeed.Image's resize.
MODES = {"centre crop": "center_crop", "random resized crop": "random_resized_crop"}
#: Photo sets: name -> what it is (the first is the default).
PHOTO_SETS = {"sample": "crops of scikit-learn's two sample photos, tinted",
              "textured": "the same crops with film grain (sigma 9) and a fine weave (+-12 levels, 3-4 pixels)"}
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


def _textured(pixels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Film grain and a fine diagonal weave over ``pixels``."""
    y, x = np.mgrid[0:pixels.shape[0], 0:pixels.shape[1]].astype(np.float32)
    weave = 12 * np.sin(x * rng.uniform(1.6, 2.1) + y * rng.uniform(1.4, 1.9))[..., None]
    grain = rng.normal(0, 9, pixels.shape)
    return np.clip(pixels + weave + grain, 0, 255).astype(np.uint8)


def photo(photos: list, height: int, width: int, rng: np.random.Generator, photo_set: str = "sample") -> np.ndarray:
    """A ``height x width`` photo of ``photo_set``: one crop when the photos are large enough, else a mosaic of
    four."""
    if all(p.shape[0] >= height and p.shape[1] >= width for p in photos):
        pixels = _tile(photos, height, width, rng)
    else:
        top, left = height // 2, width // 2
        rows = [np.concatenate([_tile(photos, h, w, rng) for w in (left, width - left)], axis=1)
                for h in (top, height - top)]
        pixels = np.ascontiguousarray(np.concatenate(rows, axis=0))
    return _textured(pixels, rng) if photo_set == "textured" else pixels


def write_photos(path: str, height: int, width: int, records: int, seed: int = 0, photo_set: str = "sample") -> None:
    """``records`` ImageNet-layout Examples (``image/encoded`` JPEG of ``photo_set``, ``image/class/label``) to
    ``path``."""
    if photo_set not in PHOTO_SETS:
        raise ValueError(f"unknown photo set {photo_set!r}; known: {', '.join(PHOTO_SETS)}")
    import simplejpeg
    from sklearn.datasets import load_sample_images

    photos = [np.asarray(p) for p in load_sample_images().images]
    rng = np.random.default_rng([seed, height, width])
    with infeed.TFRecordWriter(path) as w:
        for i in range(records):
            data = simplejpeg.encode_jpeg(photo(photos, height, width, rng, photo_set), quality=90,
                                          colorsubsampling="420")
            w.write(infeed.encode_example({"image/encoded": data, "image/class/label": i % 1000,
                                           "image/height": height, "image/width": width}))


def ensure_photos(data_dir: str, source: str, records: int, seed: int,
                  photo_set: str = "sample") -> tuple[str, float | None]:
    """The file of ``records`` photos of ``source`` from ``photo_set`` in ``data_dir``, written unless it is there:
    its path, and the seconds writing it took (None where it was reused)."""
    height, width = SOURCES[source][:2]
    named = "" if photo_set == "sample" else f"-{photo_set}"
    path = os.path.join(data_dir, f"photos-{source}{named}-{records}-seed{seed}-v{FORMAT_VERSION}.tfrecord")
    if os.path.exists(path):
        return path, None
    began, tmp = time.perf_counter(), f"{path}.partial{os.getpid()}"
    try:
        write_photos(tmp, height, width, records, seed, photo_set)
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
