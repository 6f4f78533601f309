"""The JPEG libraries timed: how each decodes a JPEG to RGB, and its fastest paths to the ResNet evaluation crop
(:func:`centre_crop` of the shorter side, resized to :data:`OUT` x :data:`OUT`); one ``make_*`` per library, in
:data:`MAKERS`."""

from __future__ import annotations

import ctypes.util
import glob
import io
import math
import os
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

OUT = 224
#: The ResNet evaluation crop (TF models' ``decode_and_center_crop``): 224 / (224 + 32) of the shorter side.
CROP_FRACTION = OUT / (OUT + 32)
#: The shortest decoded side whose central crop is still >= OUT pixels.
MIN_SIDE = math.ceil(OUT / CROP_FRACTION)            # 256


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
