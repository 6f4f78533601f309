"""Choosing the JPEG decoder for the image stage (issue 16): libraries timed side by side on one core.

For each installed library among simplejpeg, PyTurboJPEG, Pillow, OpenCV
(opencv-python-headless), imagecodecs and TensorFlow (the reference), it times,
single-threaded, on one pinned CPU and interleaved across libraries (every case
once per round, A B C A B C ..., so a noisy neighbour slows all alike).  The
figure is images per CPU-second of the process (the median of the rounds): on a
CPU shared with other work, wall-clock time also counts the other processes'
time slices; the wall-clock rate and the CPU share are printed beside it.

- ``decode``: JPEG bytes to an RGB uint8 array at full size, with the library's
  default (accurate) DCT, plus its fast-DCT / decode-into-a-buffer variants;
- ``crop224``: the ResNet evaluation crop: the central 87.5% square of the
  shorter side, resized to 224x224, by each library's fastest reasonable path
  (DCT scaling in M/8 or 1/2**k steps so that the scaled crop stays >= 224,
  a lossless crop, a partial decode, then a bilinear/area resize);
- ``resize``: the resize alone (Pillow bilinear with antialias, cv2 INTER_AREA),
  from the full-size crop and from the 1/8-step DCT-scaled crop, to split the
  crop224 figures.

Test images are made from the two photos scikit-learn ships
(``sklearn.datasets.load_sample_images()``: china.jpg and flower.jpg, 427x640):
random crops of the target aspect, resized (Pillow bicubic), flipped, colour
jittered, with mild grain (``--noise``), encoded by Pillow at quality 90, 4:2:0,
baseline.  Sizes: 500x375 and 640x480 (ImageNet-like) and 1024x768.

It also checks what each library decodes to RGB (progressive, CMYK, grayscale
JPEGs; PNG where it has a PNG decoder), whether its decode call releases the GIL
(two threads on two CPUs against one), and prints a Markdown summary with
versions, wheel and installed sizes, last release month and the libjpeg-turbo
each one bundles.  Libraries that are not importable are skipped with a note.
Nothing from ``infeed`` is imported; ``bench.harness`` (standard library only)
does the interleaving.

examples (from the repository root, with an interpreter that has the libraries):
  python -m bench.image_decoders
  python -m bench.image_decoders --quick                     # ~2 minutes (the full run: ~8 on 2 busy cores)
  python -m bench.image_decoders --wheels /tmp/wheels        # wheel sizes: files 'pip download --no-deps' left
  python -m bench.image_decoders --turbojpeg-lib /path/libturbojpeg.so.0 --json out.json
"""

from __future__ import annotations

import argparse
import ctypes.util
import glob
import io
import json
import math
import os
import platform
import re
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from bench.harness import Case, log, pinned_to_one_cpu, relative_spread, settle_allocator

SIZES = ((500, 375), (640, 480), (1024, 768))      # (width, height)
OUT = 224
#: The ResNet evaluation crop (TF models' ``decode_and_center_crop``): 224 / (224 + 32) of the shorter side.
CROP_FRACTION = OUT / (OUT + 32)
#: The shortest decoded side whose central crop is still >= OUT pixels.
MIN_SIDE = math.ceil(OUT / CROP_FRACTION)            # 256
QUALITY = 90
DEFAULT_PYPI_LIST = "/work/.library/env/packages/pypi.tsv"


# --------------------------------------------------------------------------- geometry

def centre_crop(h: int, w: int) -> tuple[int, int, int]:
    """(y0, x0, side) of the central CROP_FRACTION square of the shorter side (TF models' formula)."""
    side = int(CROP_FRACTION * min(h, w))
    return (h - side + 1) // 2, (w - side + 1) // 2, side


def scale_eighths(h: int, w: int, pow2: bool) -> int:
    """The smallest M (of M/8; 1, 2, 4, 8 only with pow2) whose scaled shorter side is still >= MIN_SIDE."""
    for m in ((1, 2, 4, 8) if pow2 else range(1, 9)):
        if math.ceil(min(h, w) * m / 8) >= MIN_SIDE:
            return m
    return 8


def jpeg_size(data: bytes) -> tuple[int, int]:
    """(height, width) from a JPEG's first SOF marker, in Python (for libraries with no header-only call)."""
    i = 2
    while i < len(data):
        if data[i] != 0xFF:
            i += 1
            continue
        marker = data[i + 1]
        if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
            return int.from_bytes(data[i + 5:i + 7], "big"), int.from_bytes(data[i + 7:i + 9], "big")
        if marker == 0xFF:
            i += 1
            continue
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    raise ValueError("no SOF marker")


# --------------------------------------------------------------------------- test images

def sample_photos() -> list[np.ndarray]:
    from sklearn.datasets import load_sample_images

    return list(load_sample_images().images)


def make_images(sizes, per_size: int, seed: int, noise: float) -> dict[tuple[int, int], list[bytes]]:
    """``per_size`` JPEGs per (width, height): crops of the two sample photos, jittered, quality 90, 4:2:0."""
    from PIL import Image

    photos = [Image.fromarray(p) for p in sample_photos()]
    rng = np.random.default_rng(seed)
    out = {}
    for (w, h) in sizes:
        images = []
        for i in range(per_size):
            photo = photos[i % len(photos)]
            pw, ph = photo.size
            cw = min(pw, ph * w / h) * rng.uniform(0.6, 1.0)
            ch = cw * h / w
            x0, y0 = rng.uniform(0, pw - cw), rng.uniform(0, ph - ch)
            im = photo.resize((w, h), Image.BICUBIC, box=(x0, y0, x0 + cw, y0 + ch))
            a = np.asarray(im, np.float32)
            if rng.random() < 0.5:
                a = a[:, ::-1]
            a = a * rng.uniform(0.9, 1.1, 3) + rng.normal(0.0, noise, a.shape)
            buf = io.BytesIO()
            Image.fromarray(np.clip(a + 0.5, 0, 255).astype(np.uint8)).save(
                buf, "JPEG", quality=QUALITY, subsampling=2)
            images.append(buf.getvalue())
        out[(w, h)] = images
    return out


def feature_images() -> dict[str, tuple[bytes, np.ndarray, str]]:
    """Small test files for the capability checks: name -> (file bytes, the RGB it should decode to, kind)."""
    from PIL import Image

    photo = sample_photos()[1][:240, :320]
    im = Image.fromarray(np.ascontiguousarray(photo))
    out = {}

    def enc(img, fmt="JPEG", **kw):
        b = io.BytesIO()
        img.save(b, fmt, **kw)
        return b.getvalue()

    out["progressive"] = (enc(im, quality=QUALITY, progressive=True), photo, "jpeg")
    cmyk = im.convert("CMYK")
    out["CMYK"] = (enc(cmyk, quality=QUALITY), np.asarray(cmyk.convert("RGB")), "jpeg")
    gray = im.convert("L")
    out["gray"] = (enc(gray, quality=QUALITY), np.repeat(np.asarray(gray)[..., None], 3, axis=2), "jpeg")
    out["PNG"] = (enc(im, "PNG"), photo, "png")
    return out


# --------------------------------------------------------------------------- libraries

@dataclass
class Variant:
    group: str                  # decode | crop224 | resize
    name: str
    fn: Callable | None = None  # per image: bytes -> array
    batch: Callable | None = None   # whole list: list[bytes] -> count (tf.data)
    summary: bool = False       # the decode-alone figure of the summary (default, accurate DCT)


@dataclass
class Library:
    key: str
    dist: str                   # PyPI name
    version: str
    bundles: str
    rgb: Callable               # bytes -> RGB array, default settings (capability checks, GIL check)
    png: Callable | None
    crop_decode: str
    into_buffer: str
    variants: Callable          # (w, h) -> list[Variant]
    extra_files: list[str] = field(default_factory=list)    # outside the dist (a system library)
    notes: list[str] = field(default_factory=list)
    gil: Callable | None = None     # bytes -> array for the GIL check (None: skip)


def dist_version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def scan_version(paths, pattern=rb"libjpeg-turbo version ([0-9][0-9.]*)") -> str | None:
    """The first ``pattern`` match in the given binaries (libjpeg-turbo embeds its version string)."""
    rx = re.compile(pattern)
    for p in paths:
        try:
            with open(p, "rb") as f:
                m = rx.search(f.read())
        except OSError:
            continue
        if m:
            return m.group(1).decode()
    return None


def pil_resize(arr: np.ndarray, y0: int, x0: int, side: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(arr[y0:y0 + side, x0:x0 + side]).resize((OUT, OUT), Image.BILINEAR))


def cv2_resize(arr: np.ndarray, y0: int, x0: int, side: int) -> np.ndarray:
    import cv2

    return cv2.resize(arr[y0:y0 + side, x0:x0 + side], (OUT, OUT), interpolation=cv2.INTER_AREA)


def have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


RESIZERS = {"PIL bilinear": (pil_resize, "PIL"), "cv2 area": (cv2_resize, "cv2")}


def resizers() -> dict[str, Callable]:
    return {name: fn for name, (fn, mod) in RESIZERS.items() if have(mod)}


def make_simplejpeg(args) -> Library:
    import simplejpeg

    def rgb(d):
        return simplejpeg.decode_jpeg(d, "RGB")

    def variants(w, h):
        buf = np.empty((h, w, 3), np.uint8)
        out = [Variant("decode", "simplejpeg", rgb, summary=True),
               Variant("decode", "simplejpeg fastdct", lambda d: simplejpeg.decode_jpeg(d, "RGB", fastdct=True)),
               Variant("decode", "simplejpeg fastdct into buffer",
                       lambda d: simplejpeg.decode_jpeg(d, "RGB", fastdct=True, buffer=buf))]
        for rname, resize in resizers().items():
            def m8(d, resize=resize):
                a = simplejpeg.decode_jpeg(d, "RGB", fastdct=True, min_height=MIN_SIDE, min_width=MIN_SIDE)
                return resize(a, *centre_crop(*a.shape[:2]))

            def p2(d, resize=resize):
                hh, ww, _, _ = simplejpeg.decode_jpeg_header(d)
                m = scale_eighths(hh, ww, pow2=True)
                a = simplejpeg.decode_jpeg(d, "RGB", fastdct=True, min_height=math.ceil(hh * m / 8),
                                           min_width=math.ceil(ww * m / 8))
                return resize(a, *centre_crop(*a.shape[:2]))

            def fu(d, resize=resize):
                a = simplejpeg.decode_jpeg(d, "RGB", fastdct=True, fastupsample=True, min_height=MIN_SIDE,
                                           min_width=MIN_SIDE)
                return resize(a, *centre_crop(*a.shape[:2]))

            out.append(Variant("crop224", f"simplejpeg fastdct M/8 + {rname}", m8))
            out.append(Variant("crop224", f"simplejpeg fastdct 1/2^k + {rname}", p2))
            if rname == "PIL bilinear":
                out.append(Variant("crop224", f"simplejpeg fastdct fastupsample M/8 + {rname}", fu))
        return out

    so = glob.glob(os.path.join(os.path.dirname(simplejpeg.__file__), "_jpeg*"))
    return Library("simplejpeg", "simplejpeg", simplejpeg.__version__,
                   f"libjpeg-turbo {scan_version(so) or '?'} (static)", rgb, None,
                   "no (DCT scaling via min_height/min_width only)", "yes (buffer=)", variants, gil=rgb)


def find_turbojpeg_lib(explicit: str | None) -> str | None:
    if explicit:
        return explicit
    if os.environ.get("TURBOJPEG_LIB"):
        return os.environ["TURBOJPEG_LIB"]
    return None


def make_turbojpeg(args) -> Library:
    import turbojpeg

    lib = find_turbojpeg_lib(args.turbojpeg_lib)
    try:
        tj = turbojpeg.TurboJPEG(lib) if lib else turbojpeg.TurboJPEG()
    except Exception as e:       # no libturbojpeg, or one too old for this PyTurboJPEG
        first = str(e).strip().splitlines()[0]
        raise ImportError(f"PyTurboJPEG {turbojpeg.__version__} cannot load libturbojpeg: {first} "
                          "(give one with --turbojpeg-lib PATH or TURBOJPEG_LIB; PyTurboJPEG 2.x needs "
                          "libjpeg-turbo >= 3.0, 1.x takes 2.x)") from None
    path = lib or ctypes.util.find_library("turbojpeg") or "libturbojpeg"
    real = os.path.realpath(path) if os.path.exists(path) else path
    fast = turbojpeg.TJFLAG_FASTDCT
    RGB = turbojpeg.TJPF_RGB

    def rgb(d):
        return tj.decode(d, pixel_format=RGB)

    def scaled(d, pow2, flags=fast):
        w, h, _, _ = tj.decode_header(d)
        m = scale_eighths(h, w, pow2)
        sf = (m // math.gcd(m, 8), 8 // math.gcd(m, 8))
        return tj.decode(d, pixel_format=RGB, scaling_factor=sf, flags=flags)

    def variants(w, h):
        buf = np.empty((h, w, 3), np.uint8)
        out = [Variant("decode", "PyTurboJPEG", rgb, summary=True),
               Variant("decode", "PyTurboJPEG fastdct", lambda d: tj.decode(d, pixel_format=RGB, flags=fast)),
               Variant("decode", "PyTurboJPEG fastdct into buffer",
                       lambda d: tj.decode(d, pixel_format=RGB, flags=fast, dst=buf))]
        for rname, resize in resizers().items():
            def m8(d, resize=resize, pow2=False):
                a = scaled(d, pow2=pow2)
                return resize(a, *centre_crop(*a.shape[:2]))

            def cropped(d, resize=resize):
                # Lossless crop (a new JPEG of the iMCU-aligned window around the centre crop), then decode it.
                ww, hh, sub, _ = tj.decode_header(d)
                y0, x0, side = centre_crop(hh, ww)
                mw, mh = turbojpeg.tjMCUWidth[sub], turbojpeg.tjMCUHeight[sub]
                ax, ay = x0 - x0 % mw, y0 - y0 % mh
                c = tj.crop(d, ax, ay, side + x0 - ax, side + y0 - ay)
                m = scale_eighths(side, side, pow2=False)
                sf = (m // math.gcd(m, 8), 8 // math.gcd(m, 8))
                a = tj.decode(c, pixel_format=RGB, scaling_factor=sf, flags=fast)
                # the crop in the scaled window
                s = m / 8
                ys, xs = round((y0 - ay) * s), round((x0 - ax) * s)
                sside = min(int(side * s), a.shape[0] - ys, a.shape[1] - xs)
                return resize(a, ys, xs, sside)

            out.append(Variant("crop224", f"PyTurboJPEG fastdct M/8 + {rname}", m8))
            out.append(Variant("crop224", f"PyTurboJPEG fastdct 1/2^k + {rname}",
                               lambda d, m8=m8: m8(d, pow2=True)))
            out.append(Variant("crop224", f"PyTurboJPEG lossless crop + fastdct M/8 + {rname}", cropped))
        return out

    version = scan_version([real]) if os.path.exists(real) else None
    notes = []
    if turbojpeg.__version__.startswith("1."):
        notes.append("PyTurboJPEG 2.x needs libjpeg-turbo >= 3.0 (the TurboJPEG 3 API); 1.x takes 2.x")
    return Library("PyTurboJPEG", "PyTurboJPEG", turbojpeg.__version__,
                   f"nothing: loads libturbojpeg {version or '?'} ({os.path.basename(real)})", rgb, None,
                   "lossless crop to a new JPEG (iMCU-aligned), then decode; no partial decode",
                   "yes (dst=)", variants, extra_files=[real] if os.path.exists(real) else [], gil=rgb,
                   notes=notes)


def make_pillow(args) -> Library:
    import PIL
    from PIL import Image, features

    def rgb(d):
        im = Image.open(io.BytesIO(d))
        if im.mode != "RGB":
            im = im.convert("RGB")
        return np.asarray(im)

    def crop(d, draft=True):
        im = Image.open(io.BytesIO(d))
        if draft:
            w, h = im.size
            short = min(w, h)
            im.draft("RGB", (math.ceil(w * MIN_SIDE / short), math.ceil(h * MIN_SIDE / short)))
        if im.mode != "RGB":
            im = im.convert("RGB")
        w, h = im.size
        y0, x0, side = centre_crop(h, w)
        return np.asarray(im.resize((OUT, OUT), Image.BILINEAR, box=(x0, y0, x0 + side, y0 + side)))

    def variants(w, h):
        return [Variant("decode", "Pillow", rgb, summary=True),
                Variant("crop224", "Pillow draft 1/2^k + PIL bilinear", crop),
                Variant("crop224", "Pillow (no draft) + PIL bilinear", lambda d: crop(d, draft=False))]

    turbo = features.check_feature("libjpeg_turbo")
    jv = features.version("libjpeg_turbo") if turbo else features.version("jpg")
    return Library("Pillow", "pillow", PIL.__version__,
                   f"{'libjpeg-turbo' if turbo else 'libjpeg'} {jv}, zlib, libpng, webp, tiff, ... "
                   "(shared, in pillow.libs)",
                   rgb, rgb, "no (draft(): 1/2, 1/4, 1/8 scaling only)", "no", variants, gil=rgb)


def make_opencv(args) -> Library:
    import cv2

    RGB = cv2.IMREAD_COLOR_RGB if hasattr(cv2, "IMREAD_COLOR_RGB") else None
    bgr2rgb = RGB is None

    def flags(reduce: int) -> int:
        base = {1: 0, 2: 16, 4: 32, 8: 64}[reduce]
        return base | (RGB if RGB is not None else cv2.IMREAD_COLOR)

    def dec(d, reduce=1):
        a = cv2.imdecode(np.frombuffer(d, np.uint8), flags(reduce))
        return cv2.cvtColor(a, cv2.COLOR_BGR2RGB) if bgr2rgb else a

    def variants(w, h):
        def crop(d):
            hh, ww = jpeg_size(d)   # OpenCV has no header-only call
            m = scale_eighths(hh, ww, pow2=True)
            a = dec(d, 8 // m)
            return cv2_resize(a, *centre_crop(*a.shape[:2]))

        return [Variant("decode", "OpenCV", dec, summary=True),
                Variant("crop224", "OpenCV IMREAD_REDUCED 1/2^k + cv2 area", crop)]

    m = re.search(r"JPEG:\s*(.*)", cv2.getBuildInformation())
    return Library("OpenCV", "opencv-python-headless", cv2.__version__,
                   f"{m.group(1).strip() if m else '?'}, libpng, libwebp, ... (static)", dec, dec,
                   "no (IMREAD_REDUCED_*: 1/2, 1/4, 1/8 only)", "no (imdecode takes no dst)", variants, gil=dec,
                   notes=[] if RGB is not None else ["BGR out; cvtColor to RGB timed"])


def make_imagecodecs(args) -> Library:
    import imagecodecs

    def rgb(d):
        return imagecodecs.jpeg8_decode(d, outcolorspace="RGB")

    def variants(w, h):
        buf = np.empty((h, w, 3), np.uint8)
        out = [Variant("decode", "imagecodecs jpeg8", rgb, summary=True),
               Variant("decode", "imagecodecs jpeg8 into buffer",
                       lambda d: imagecodecs.jpeg8_decode(d, outcolorspace="RGB", out=buf))]
        for rname, resize in resizers().items():
            out.append(Variant("crop224", f"imagecodecs jpeg8 + {rname}",
                               lambda d, resize=resize: resize(a := rgb(d), *centre_crop(*a.shape[:2]))))
        return out

    def png(d):
        return imagecodecs.png_decode(d)

    ver = imagecodecs.jpeg8_version()
    return Library("imagecodecs", "imagecodecs", imagecodecs.__version__,
                   f"{ver.replace('libjpeg_turbo ', 'libjpeg-turbo ')} and ~70 other codecs "
                   "(static + imagecodecs.libs)",
                   rgb, png, "no (no DCT scaling either)", "yes (out=)", variants, gil=rgb)


def make_tensorflow(args) -> Library:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)

    def rgb(d):
        return tf.io.decode_jpeg(d, channels=3).numpy()

    def png(d):
        return tf.io.decode_png(d, channels=3).numpy()

    def crop_graph(d):
        shape = tf.io.extract_jpeg_shape(d)
        h, w = shape[0], shape[1]
        side = tf.cast(CROP_FRACTION * tf.cast(tf.minimum(h, w), tf.float32), tf.int32)
        y0, x0 = (h - side + 1) // 2, (w - side + 1) // 2
        img = tf.io.decode_and_crop_jpeg(d, tf.stack([y0, x0, side, side]), channels=3)
        return tf.image.resize(img, [OUT, OUT], method="bilinear")

    def decode_then_crop(d):
        img = tf.io.decode_jpeg(d, channels=3)
        h, w = img.shape[0], img.shape[1]
        y0, x0, side = centre_crop(h, w)
        return tf.image.resize(img[y0:y0 + side, x0:x0 + side], [OUT, OUT], method="bilinear").numpy()

    def dataset(fn):
        opts = tf.data.Options()
        opts.threading.private_threadpool_size = 1
        opts.threading.max_intra_op_parallelism = 1
        opts.autotune.enabled = False

        def make(images):
            ds = tf.data.Dataset.from_tensor_slices(tf.constant(images)).map(fn, num_parallel_calls=1)
            ds = ds.with_options(opts)

            def run():
                n = 0
                for _ in ds:
                    n += 1
                return n
            return run
        return make

    def variants(w, h):
        return [Variant("decode", "TF eager decode_jpeg", rgb, summary=True),
                Variant("decode", "TF tf.data decode_jpeg",
                        batch=dataset(lambda d: tf.io.decode_jpeg(d, channels=3))),
                Variant("crop224", "TF eager decode_jpeg + slice + resize", decode_then_crop),
                Variant("crop224", "TF eager decode_and_crop_jpeg + resize", lambda d: crop_graph(d).numpy()),
                Variant("crop224", "TF tf.data decode_and_crop_jpeg + resize", batch=dataset(crop_graph))]

    tfdir = os.path.dirname(tf.__file__)
    ver = scan_version(sorted(glob.glob(os.path.join(tfdir, "libtensorflow_cc.so*")))
                       + sorted(glob.glob(os.path.join(tfdir, "libtensorflow_framework.so*"))))
    dist = next((d for d in ("tensorflow", "tensorflow-cpu", "tensorflow-intel") if dist_version(d) != "?"),
                "tensorflow")
    return Library("TensorFlow", dist, tf.__version__,
                   f"libjpeg-turbo {ver or '?'}, libpng, giflib (static)", rgb, png,
                   "yes: decode_and_crop_jpeg (partial decode of the window)", "no", variants, gil=rgb,
                   notes=["its default DCT is the fast integer one (MAE 1 like fastdct)",
                          "crop224 output float32 (tf.image.resize)"])


MAKERS = {"simplejpeg": make_simplejpeg, "PyTurboJPEG": make_turbojpeg, "Pillow": make_pillow,
          "OpenCV": make_opencv, "imagecodecs": make_imagecodecs, "TensorFlow": make_tensorflow}


# --------------------------------------------------------------------------- package facts

def installed_bytes(dist: str, extra_files=()) -> int | None:
    from importlib import metadata

    try:
        d = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return None
    total = 0
    for f in d.files or ():
        p = d.locate_file(f)
        try:
            total += os.path.getsize(p)
        except OSError:
            pass
    for p in extra_files:
        try:
            total += os.path.getsize(p)
        except OSError:
            pass
    return total


def wheel_file(wheels: str | None, dist: str, version: str) -> str | None:
    if not wheels:
        return None
    norm = re.sub(r"[-_.]+", "_", dist).lower()
    for p in sorted(glob.glob(os.path.join(wheels, "*"))):
        base = os.path.basename(p)
        name = re.sub(r"[-_.]+", "_", base).lower()
        if name.startswith(f"{norm}_{re.sub(r'[-_.]+', '_', version).lower()}_") or \
                name.startswith(f"{norm}_{re.sub(r'[-_.]+', '_', version).lower()}.") or \
                base.lower().startswith(f"{norm}-{version}".lower()):
            return p
    return None


def pypi_facts(path: str | None) -> dict[str, tuple[str, str, str]]:
    """name -> (latest version, month of that release, download rank) from a registry list, when there is one."""
    out = {}
    if not path or not os.path.exists(path):
        return out
    wanted = {re.sub(r"[-_.]+", "-", k.lower()) for k in ("simplejpeg", "pyturbojpeg", "pillow",
                                                          "opencv-python-headless", "imagecodecs", "tensorflow")}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 3 and parts[0].lower() in wanted:
                out[parts[0].lower()] = (parts[1], parts[2], parts[3] if len(parts) > 3 else "")
    return out


def mb(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"


# --------------------------------------------------------------------------- checks

def mae(a, b) -> float:
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    if a.shape != b.shape:
        return float("nan")
    return float(np.abs(np.round(a) - b).mean())


def capabilities(lib: Library, files) -> dict[str, str]:
    """progressive / CMYK / gray -> RGB and PNG: 'ok', 'ok (MAE x)', 'wrong colours (MAE x)', 'error', 'n/a'."""
    out = {}
    for name, (data, want, kind) in files.items():
        fn = lib.png if kind == "png" else lib.rgb
        if fn is None:
            out[name] = "n/a"
            continue
        try:
            got = np.asarray(fn(data))
        except Exception as e:
            out[name] = f"error ({type(e).__name__})"
            continue
        if got.shape != want.shape:
            out[name] = f"shape {got.shape}"
            continue
        err = mae(got, want)
        out[name] = "ok" if err < 3 else f"ok (MAE {err:.1f})" if err < 12 else f"wrong colours (MAE {err:.0f})"
    return out


def gil_probe_image() -> bytes:
    """A 3000x2000 JPEG: one decode call long enough (tens of ms) to see whether other threads run during it."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(sample_photos()[0]).resize((3000, 2000), Image.BICUBIC).save(buf, "JPEG", quality=QUALITY)
    return buf.getvalue()


def gil_check(fn, data: bytes, trials: int = 3) -> str:
    """Whether ``fn(data)`` lets another Python thread run while it decodes.

    A second thread makes one call; this thread meanwhile stamps the time in a loop.  A call that holds the GIL
    leaves no stamps inside it; one that releases it leaves them all through it.  The figure is the share of the
    call's middle 80% that this thread covered (gaps under 1 ms), the best of ``trials``: it needs no second
    free CPU, so a busy machine does not fake a 'no'.
    """
    fn(data)
    best = 0.0
    for _ in range(trials):
        span = {}

        def work():
            span["t0"] = time.perf_counter()
            fn(data)
            span["t1"] = time.perf_counter()
        stamps = []
        t = threading.Thread(target=work)
        t.start()
        while t.is_alive():
            stamps.append(time.perf_counter())
        t.join()
        t0, t1 = span["t0"], span["t1"]
        lo, hi = t0 + 0.1 * (t1 - t0), t1 - 0.1 * (t1 - t0)
        inside = [x for x in stamps if lo <= x <= hi]
        covered = sum(b - a for a, b in zip(inside, inside[1:]) if b - a < 1e-3)
        best = max(best, covered / (hi - lo))
    # A call that holds the GIL leaves 0%; one that releases it leaves as much as the OS gives this thread
    # (on a busy machine well under 100%).
    return f"{'yes' if best > 0.05 else 'no'} (other thread ran {100 * best:.0f}% of a call)"


# --------------------------------------------------------------------------- timing

def build_cases(libs, images, target_s: float, reference):
    """Case per (size, variant), passes calibrated so one run takes about target_s; quality per variant."""
    cases, meta = [], []
    for (w, h), imgs in images.items():
        for lib in libs:
            for v in lib.variants(w, h):
                run_once = v.batch(imgs) if v.batch else None
                if v.fn is not None:
                    want = (OUT, OUT, 3) if v.group == "crop224" else (h, w, 3)
                    errs = []
                    for d, ref in zip(imgs, reference[(w, h)][v.group]):   # warm, and checked
                        o = v.fn(d)
                        if np.shape(o) != want:
                            raise RuntimeError(f"{v.name} at {w}x{h} gave {np.shape(o)}, expected {want}")
                        errs.append(mae(o, ref))
                    q = statistics.mean(errs)
                else:
                    run_once()
                    q = None
                t0 = time.perf_counter()
                if v.fn is not None:
                    for d in imgs:
                        v.fn(d)
                else:
                    run_once()
                one = time.perf_counter() - t0
                passes = max(1, round(target_s / max(one, 1e-6)))

                if v.fn is not None:
                    def run(fn=v.fn, imgs=imgs, passes=passes):
                        for _ in range(passes):
                            for d in imgs:
                                fn(d)
                        return passes * len(imgs)
                else:
                    def run(run_once=run_once, passes=passes):
                        return sum(run_once() for _ in range(passes))
                cases.append(Case(f"{w}x{h} {v.group} {v.name}", run, passes * len(imgs),
                                  passes * sum(map(len, imgs))))
                meta.append(dict(size=f"{w}x{h}", group=v.group, name=v.name, library=lib.key, mae=q,
                                 summary=v.summary, headline=v.group == "crop224" and (
                                     "cv2 area" not in v.name or lib.key == "OpenCV")))
    return cases, meta


def resize_cases(images, target_s: float, ref_decode):
    """The resize alone, from the full-size and the M/8-scaled centre crop (decoded by Pillow beforehand)."""
    from PIL import Image

    cases, meta = [], []
    for (w, h), imgs in images.items():
        full = [ref_decode(d) for d in imgs]
        m = scale_eighths(h, w, pow2=False)
        scaled = [np.asarray(Image.fromarray(a).resize((math.ceil(w * m / 8), math.ceil(h * m / 8)),
                                                        Image.BILINEAR)) for a in full]
        for src_name, arrs in ((f"from {w}x{h}", full), (f"from {m}/8 scale", scaled)):
            for rname, resize in resizers().items():
                geo = [centre_crop(*a.shape[:2]) for a in arrs]
                t0 = time.perf_counter()
                for a, g in zip(arrs, geo):
                    resize(a, *g)
                passes = max(1, round(target_s / max(time.perf_counter() - t0, 1e-6)))

                def run(resize=resize, arrs=arrs, geo=geo, passes=passes):
                    for _ in range(passes):
                        for a, g in zip(arrs, geo):
                            resize(a, *g)
                    return passes * len(arrs)
                name = f"{rname} {src_name}"
                cases.append(Case(f"{w}x{h} resize {name}", run, passes * len(arrs), 0))
                meta.append(dict(size=f"{w}x{h}", group="resize", name=name, library=rname.split()[0], mae=None,
                                 summary=False, headline=False))
    return cases, meta


def interleave_cpu(cases, repeats: int, warmup: int = 1):
    """Like bench.harness.interleave (warm-up pass, then A B C A B C ...), timing each run twice: wall clock and
    this process's CPU time (all its threads).  On one pinned CPU shared with other work, the CPU time is
    the work itself, whatever share of the CPU the scheduler gave this process meanwhile."""
    import gc

    out = [([], []) for _ in cases]
    for rep in range(warmup + repeats):
        for case, (wall, cpu) in zip(cases, out):
            gc.collect()
            gc.disable()
            try:
                w0, c0 = time.perf_counter(), time.process_time()
                done = case.run()
                c1, w1 = time.process_time(), time.perf_counter()
            finally:
                gc.enable()
            if done != case.records:
                raise RuntimeError(f"case {case.name!r} handled {done} images, expected {case.records}")
            if rep >= warmup:
                wall.append(w1 - w0)
                cpu.append(c1 - c0)
    return out


# --------------------------------------------------------------------------- report

def rate_text(x: float) -> str:
    return f"{x:,.0f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.image_decoders", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n\n")[-1:]))
    p.add_argument("--rounds", type=int, default=9, help="timed rounds over all cases (default 9)")
    p.add_argument("--target-s", type=float, default=0.2, help="seconds one case's run aims at (default 0.2)")
    p.add_argument("--per-size", type=int, default=16, help="test images per size (default 16)")
    p.add_argument("--noise", type=float, default=3.0, help="grain (Gaussian sigma, levels) added before encoding")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu", type=int, default=None, help="CPU to pin to (default: the last one allowed)")
    p.add_argument("--only", default=None, help="comma-separated libraries: " + ",".join(MAKERS))
    p.add_argument("--quick", action="store_true", help="3 rounds, 0.1 s runs, 8 images per size")
    p.add_argument("--wheels", default=None, help="folder with the wheels 'pip download --no-deps' fetched")
    p.add_argument("--pypi-list", default=DEFAULT_PYPI_LIST,
                   help="registry list (name, version, month, rank) for the release month")
    p.add_argument("--turbojpeg-lib", default=None, help="libturbojpeg shared library for PyTurboJPEG")
    p.add_argument("--no-gil-check", action="store_true")
    p.add_argument("--json", default=None, help="save the figures there")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.target_s, args.per_size = 3, 0.1, 8

    notes = []
    libs: list[Library] = []
    wanted = args.only.split(",") if args.only else list(MAKERS)
    for key in wanted:
        try:
            libs.append(MAKERS[key](args))
        except ImportError as e:
            notes.append(f"{key}: skipped ({e})")
    for n in notes:
        log(n)
    if not have("PIL") or not have("sklearn"):
        log("Pillow and scikit-learn are needed to make the test images (pip install pillow scikit-learn)")
        return 2

    log("making test images ...")
    images = make_images(SIZES, args.per_size, args.seed, args.noise)
    from PIL import Image

    def ref_decode(d):
        return np.asarray(Image.open(io.BytesIO(d)).convert("RGB"))

    reference = {}
    for (w, h), imgs in images.items():
        full = [ref_decode(d) for d in imgs]
        crops = []
        for a in full:
            y0, x0, side = centre_crop(h, w)
            crops.append(np.asarray(Image.fromarray(a).resize((OUT, OUT), Image.BILINEAR,
                                                              box=(x0, y0, x0 + side, y0 + side))))
        reference[(w, h)] = {"decode": full, "crop224": crops}

    files = feature_images()
    caps = {lib.key: capabilities(lib, files) for lib in libs}
    gil = {}
    if not args.no_gil_check:
        probe = gil_probe_image()
        for lib in libs:
            gil[lib.key] = gil_check(lib.gil, probe) if lib.gil else "n/a"

    load0 = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    settle_allocator()
    with pinned_to_one_cpu(args.cpu) as cpu:
        log(f"pinned to CPU {cpu}; calibrating ...")
        cases, meta = build_cases(libs, images, args.target_s, reference)
        if have("PIL"):
            rc, rm = resize_cases(images, args.target_s, ref_decode)
            cases, meta = cases + rc, meta + rm
        log(f"{len(cases)} cases x {args.rounds} rounds (+1 warm-up), "
            f"~{len(cases) * (args.rounds + 1) * args.target_s:.0f} s")
        measured = interleave_cpu(cases, repeats=args.rounds, warmup=1)

    rows = []
    for case, (wall, cpu_s), info in zip(cases, measured, meta):
        rates = [case.records / s for s in cpu_s]
        rows.append(dict(info, rate=statistics.median(rates), rate_min=min(rates), rate_max=max(rates),
                         spread=relative_spread(cpu_s), wall_rate=case.records / statistics.median(wall),
                         cpu_share=sum(cpu_s) / sum(wall), cpu_s=cpu_s, wall_s=wall, records=case.records))

    # --- machine and images
    cpu_model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu_model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    except OSError:
        pass
    print("# JPEG decoders, single-threaded (python -m bench.image_decoders)\n")
    print(f"machine: {cpu_model}, {os.cpu_count()} CPUs, pinned to CPU {cpu}; Python {platform.python_version()}, "
          f"numpy {np.__version__}; load average before {load0}; {args.rounds} rounds.\n\n"
          "img/s: images per CPU-second of this process (median of the rounds); spread: interquartile range "
          "of the rounds over their median; wall img/s: by the clock, which counts the time other processes "
          "had this CPU; CPU share: CPU time over wall time.\n")
    print("| size | images | mean KB | bits/pixel |\n|---|---|---|---|")
    for (w, h), imgs in images.items():
        kb = statistics.mean(map(len, imgs)) / 1e3
        print(f"| {w}x{h} | {len(imgs)} | {kb:.1f} | {kb * 8e3 / (w * h):.2f} |")
    print()
    for n in notes:
        print(f"- {n}")
    if notes:
        print()

    # --- detail
    print("| size | group | case | img/s | min-max | spread | wall img/s | CPU share | MAE |\n"
          "|---|---|---|---:|---:|---:|---:|---:|---:|")
    best = {}
    for r in rows:
        if r["group"] == "crop224" and r["headline"]:
            k = (r["library"], r["size"])
            if k not in best or r["rate"] > best[k]["rate"]:
                best[k] = r
    for r in rows:
        star = " *" if best.get((r["library"], r["size"])) is r else ""
        q = "" if r["mae"] is None else f"{r['mae']:.2f}"
        sp = "" if r["spread"] is None else f"{100 * r['spread']:.0f}%"
        print(f"| {r['size']} | {r['group']} | {r['name']}{star} | {rate_text(r['rate'])} | "
              f"{rate_text(r['rate_min'])}-{rate_text(r['rate_max'])} | {sp} | {rate_text(r['wall_rate'])} | "
              f"{100 * r['cpu_share']:.0f}% | {q} |")
    print("\n`*`: the library's fastest crop224 path at that size with its own resize, or Pillow's bilinear "
          "for a library that has none (the summary's figure). MAE: mean absolute "
          "difference, in levels of 255, from Pillow's accurate full decode (decode) or from that decode cropped "
          "and resized by Pillow's bilinear (crop224).\n")

    # --- summary
    facts = pypi_facts(args.pypi_list)
    sizes = [f"{w}x{h}" for (w, h) in images]
    head = (["library", "version", "wheel", "installed", "last release", "bundles"]
            + [f"decode {s}" for s in sizes] + [f"crop224 {s}" for s in sizes] + ["notes"])
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * 6 + "---:|" * (2 * len(sizes)) + "---|")
    summary = []
    for lib in libs:
        wf = wheel_file(args.wheels, lib.dist, lib.version)
        wsize = mb(os.path.getsize(wf)) + (" (sdist)" if wf and not wf.endswith(".whl") else "") if wf else "?"
        inst = mb(installed_bytes(lib.dist, lib.extra_files)) + (" with the system library" if lib.extra_files else "")
        latest, month, rank = facts.get(lib.dist.lower(), ("", "?", ""))
        rel = month + (f" ({latest})" if latest and latest != lib.version else "")
        dec = []
        for s in sizes:
            r = next((r for r in rows if r["library"] == lib.key and r["size"] == s and r["summary"]), None)
            dec.append(rate_text(r["rate"]) if r else "-")
        crop = [rate_text(best[(lib.key, s)]["rate"]) if (lib.key, s) in best else "-" for s in sizes]
        c = caps[lib.key]
        note = [f"crop decode: {lib.crop_decode}", f"into buffer: {lib.into_buffer}",
                f"progressive: {c['progressive']}", f"CMYK: {c['CMYK']}", f"gray: {c['gray']}",
                f"PNG: {c['PNG']}"]
        if lib.key in gil:
            note.append(f"GIL released: {gil[lib.key]}")
        if rank:
            note.append(f"PyPI download rank {rank} of 15000")
        note += lib.notes
        print("| " + " | ".join([lib.key, lib.version, wsize, inst, rel, lib.bundles] + dec + crop
                                + ["; ".join(note)]) + " |")
        summary.append(dict(library=lib.key, dist=lib.dist, version=lib.version, wheel=wsize, installed=inst,
                            release=rel, bundles=lib.bundles, decode=dict(zip(sizes, dec)),
                            crop224=dict(zip(sizes, crop)), notes=note))
    print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(argv=sys.argv, python=platform.python_version(), cpu=cpu_model, rows=rows,
                           summary=summary, notes=notes), f, indent=1, default=str)
        log(f"saved {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
