"""Instructions per image of infeed's JPEG path, counted by callgrind (where ``perf stat`` has no hardware
counters, as in a VM): for each photo size and mode, the instructions of a run that decodes N photos minus those
of one that decodes none, over N.

    python tools/jpeg_instructions.py [--photos 32] [--sizes 500x375,1024x768]

Modes: ``bare`` (simplejpeg's decode of the whole photo, nothing else), ``center_crop`` and
``random_resized_crop`` (``infeed.Image(size=(224, 224))`` through ``ExampleParser``, uint8), each through the
crop-window decoder (``_jpeg``, where the build has it) and through simplejpeg's whole-image path (``:whole``,
the build without libjpeg-turbo's headers, and every build before the window decoder). The photos are
``bench/data/photos.py``'s (seed 3). For the window modes it also prints where the instructions go: the
inclusive cost of libjpeg's calls (the header, the start, the rows skipped, the window's rows) and of the resize
kernel. Needs valgrind; each size takes about four minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

MODES = ("bare", "center_crop:whole", "center_crop", "random_resized_crop:whole", "random_resized_crop")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)                       # bench/ is used from the checkout


def run_one(path: str, mode: str, count: int) -> None:
    """Decodes ``count`` of the photos in ``path`` as ``mode`` says (``none``: builds the records only)."""
    import simplejpeg

    import infeed
    from bench.data import photos

    images = photos.images_of(list(infeed.read_records(path)))
    images = (images * (count // len(images) + 1))[:count]
    if mode == "bare":
        for data in images:
            simplejpeg.decode_jpeg(data, fastdct=True)
        return
    records = [infeed.encode_example({"image/encoded": [data]}) for data in images]
    if mode != "none":
        from infeed.example import image

        resize, _, path = mode.partition(":")
        if path == "whole":
            image._jpeg = None
        parser = infeed.ExampleParser({"image": infeed.Image(size=(224, 224), resize=resize)}, seed=0)
        parser.parse(records, parser.allocate(len(records)), ids=[(0, 0, i) for i in range(len(records))])


def _instructions(path: str, mode: str, count: int, folder: str) -> int:
    out = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={folder}/cg.{mode}",
                          sys.executable, __file__, "--one", path, mode, str(count)],
                         capture_output=True, text=True, check=True,
                         # the same start-up each run, and no BLAS threads spinning beside it (callgrind counts them)
                         env={**os.environ, "PYTHONPATH": ROOT, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1",
                              "OMP_NUM_THREADS": "1"})
    return int(re.search(r"Collected : (\d+)", out.stderr)[1])


#: Where a window decode's instructions go: (label, the function whose inclusive cost it is).
PARTS = (("header", "infeed_jpeg_read_header"), ("start (tables, buffers)", "jpeg_start_decompress"),
         ("rows above skipped (entropy only)", "jpeg_skip_scanlines"),
         ("window rows (entropy of whole rows, IDCT, colour of the window)", "jpeg_read_scanlines"),
         ("resize kernel", "resize_pixels"))


def _parts(folder: str, mode: str, count: int) -> dict:
    """Per image, the inclusive instructions of each of :data:`PARTS` in the run of ``mode``."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", f"{folder}/cg.{mode}"],
                         capture_output=True, text=True, check=True).stdout
    parts = {}
    for label, function in PARTS:
        found = re.search(rf"^\s*([\d,]+) \([^)]*\)\s+\S*:(?:\w*_)?{function}\b", out, re.M)
        parts[label] = int(found[1].replace(",", "")) / count if found else 0
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=32)
    parser.add_argument("--sizes", default="500x375,1024x768")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        path, mode, count = args.one
        run_one(path, mode, int(count))
        return
    from bench.data import photos

    with tempfile.TemporaryDirectory() as folder:
        print(f"instructions per image (callgrind), {args.photos} photos, 224x224 uint8:")
        for size in args.sizes.split(","):
            width, height = (int(v) for v in size.split("x"))
            path = os.path.join(folder, f"photos-{width}.tfrecord")
            photos.write_photos(path, height, width, 8, seed=3)
            base = _instructions(path, "none", args.photos, folder)
            figures = {mode: (_instructions(path, mode, args.photos, folder) - base) / args.photos for mode in MODES}
            print(f"  {size}: " + ", ".join(f"{mode} {n / 1e6:.2f} M" for mode, n in figures.items()))
            for mode in (m for m in MODES if m != "bare" and ":" not in m):
                parts = _parts(folder, mode, args.photos)
                rest = figures[mode] - sum(parts.values())
                print(f"    {mode}, where they go: " + ", ".join(f"{label} {n / 1e6:.2f} M"
                                                              for label, n in parts.items())
                      + f", the rest (Python, the Example, the decode's own header read) {rest / 1e6:.2f} M")


if __name__ == "__main__":
    main()
