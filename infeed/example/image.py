"""Encoded images in Examples: :class:`~infeed.example.spec.Image` features decoded straight into the batch.

A JPEG is decoded at the smallest DCT scale (1/2, 1/4, 1/8 of its size: the
scales libjpeg-turbo decodes faster than the full size) that keeps the crop
window at least as large as the output. Where infeed was built with
libjpeg-turbo's headers (``_jpeg.pyx``: the manylinux wheels, and any build
that found them), only the crop's window is decoded, its iMCU columns and its
rows, and resized into the batch row without the GIL; elsewhere (``_jpeg``
missing: the build said so) the whole image is decoded through simplejpeg.
PNG goes through Pillow (an optional extra, imported on the first PNG).
:func:`infeed.example._image.resize_into` crops, resizes, flips, normalises
and casts decoded pixels into the batch row in one pass.

Random crops and flips draw from the record's own generator
(:mod:`infeed.example.randomness`): the same image comes out for the same
``(seed, epoch, file, record)`` whatever the worker count, the host or a resume.
"""

from __future__ import annotations

import io
import logging
import math
import struct
import warnings
import numpy as np

from infeed.example import _image
from infeed.example.randomness import record_generator
from infeed.example.spec import Image

try:
    from infeed.example import _jpeg
except ImportError:           # built without libjpeg-turbo's headers: JPEGs decode whole through simplejpeg
    _jpeg = None

__all__ = ["ImageDecoder", "BadImage", "JPEG_DECODER"]

#: Which decoder JPEGs go through in this build: the crop window's own, or simplejpeg's whole-image decode.
JPEG_DECODER = "libjpeg-turbo crop window" if _jpeg is not None else "simplejpeg"
_log = logging.getLogger(__name__)
_said_whole = False                # the build's lack said once a process, at its first JPEG

#: The DCT scales libjpeg-turbo decodes faster than the full size (its M/8 scales for other M are slower).
_DCT_DIVISORS = (8, 4, 2)
_JPEG_MAGIC = b"\xff\xd8\xff"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_JPEG_COLORSPACES = {1: "GRAY", 3: "RGB", 4: "RGBA"}
_PIL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
#: Attempts at a random crop before the central fallback (as torchvision's RandomResizedCrop).
_CROP_ATTEMPTS = 10


class BadImage(Exception):
    """An image value that cannot be decoded; ``found`` says what it is instead."""

    def __init__(self, found: str):
        super().__init__(found)
        self.found = found


def _central_window(height: int, width: int, aspect: float, fraction: float) -> tuple:
    """The central window of ``fraction`` of the largest one of ``aspect`` (width / height), in whole pixels."""
    if width / height > aspect:
        crop_h, crop_w = height * fraction, height * fraction * aspect
    else:
        crop_h, crop_w = width * fraction / aspect, width * fraction
    crop_h, crop_w = max(1, min(height, int(crop_h))), max(1, min(width, int(crop_w)))
    return (height - crop_h + 1) // 2, (width - crop_w + 1) // 2, crop_h, crop_w


def _random_window(height: int, width: int, area: tuple, aspect: tuple, rng: np.random.Generator) -> tuple:
    """torchvision's RandomResizedCrop window: ``area`` of the image, log-uniform ``aspect``, whole pixels."""
    total = height * width
    log_low, log_high = math.log(aspect[0]), math.log(aspect[1])
    for _ in range(_CROP_ATTEMPTS):
        target = total * rng.uniform(area[0], area[1])
        ratio = math.exp(rng.uniform(log_low, log_high))
        crop_w = int(round(math.sqrt(target * ratio)))
        crop_h = int(round(math.sqrt(target / ratio)))
        if 0 < crop_w <= width and 0 < crop_h <= height:
            return int(rng.integers(0, height - crop_h + 1)), int(rng.integers(0, width - crop_w + 1)), crop_h, crop_w
    ratio = min(max(width / height, aspect[0]), aspect[1])
    return _central_window(height, width, ratio, 1.0)


def _png_size(data) -> tuple[int, int]:
    """(height, width) from a PNG's IHDR chunk, which the format puts first."""
    if len(data) < 24 or bytes(data[12:16]) != b"IHDR":
        raise BadImage(f"a broken PNG: no IHDR chunk first ({len(data)} bytes)")
    width, height = struct.unpack(">II", bytes(data[16:24]))
    if width == 0 or height == 0:
        raise BadImage(f"a broken PNG: it declares {width}x{height} pixels")
    return height, width


class ImageDecoder:
    """Decodes one :class:`Image` feature's values into rows of its output, with a reusable pixel buffer."""

    def __init__(self, spec: Image, seed: int, stream: int):
        self.spec, self.seed, self.stream = spec, seed, stream
        self._buffer = np.empty(0, np.uint8)
        self._window = _jpeg.WindowDecoder() if _jpeg is not None else None
        self._out_kind = _image.OUTPUT_TYPES[spec.dtype]
        mean = np.zeros(spec.channels) if spec.mean is None else np.asarray(spec.mean)
        std = np.ones(spec.channels) if spec.std is None else np.asarray(spec.std)
        self._affine = {}          # source bit depth -> (scale, bias) per channel
        for depth, unit in ((8, 1.0), (16, 257.0)):
            if spec.dtype == "uint16":
                scale, bias = np.full(spec.channels, 257.0 / unit), np.zeros(spec.channels)
            elif spec.dtype == "uint8":
                scale, bias = np.full(spec.channels, 1.0 / unit), np.zeros(spec.channels)
            else:
                scale, bias = 1.0 / (unit * std), -mean / std
            self._affine[depth] = (scale.astype(np.float32), bias.astype(np.float32))

    def decode(self, data, out: np.ndarray, ids=None) -> None:
        """Decodes ``data`` (bytes-like) into ``out`` (``[H, W, C]`` of the spec); raises :class:`BadImage`.
        ``ids``: the record's ``(epoch, file, record)``, for the random crop and flip."""
        spec = self.spec
        if len(data) == 0:
            raise BadImage("an empty value")
        head = bytes(data[:8])
        jpeg = head.startswith(_JPEG_MAGIC)
        if jpeg:
            height, width = self._jpeg_size(data)
        elif head == _PNG_MAGIC:
            height, width = _png_size(data)
        else:
            raise BadImage(f"neither JPEG nor PNG: {len(data)} bytes starting {head!r}")
        if height * width > spec.max_pixels:
            raise BadImage(f"a {width}x{height} image, more than max_pixels={spec.max_pixels}")
        rng = record_generator(self.seed, ids if ids is not None else (0, 0, 0), self.stream) if spec.random else None
        out_h, out_w = spec.size
        top, left = 0, 0
        if spec.resize == "center_crop":
            window = _central_window(height, width, out_w / out_h, spec.central_fraction)
        elif spec.resize == "random_resized_crop":
            window = _random_window(height, width, spec.area, spec.aspect, rng)
        else:
            window = (0, 0, height, width)
            if spec.resize == "pad":
                fit = min(out_h / height, out_w / width)
                placed_h, placed_w = max(1, min(out_h, round(height * fit))), max(1, min(out_w, round(width * fit)))
                top, left = (out_h - placed_h) // 2, (out_w - placed_w) // 2
                out_h, out_w = placed_h, placed_w
                out[...] = 0
            elif (height, width) != spec.size:
                raise BadImage(f"a {width}x{height} image where resize=None needs {spec.size[1]}x{spec.size[0]}")
        flip = bool(rng.random() < 0.5) if spec.flip else False
        y0, x0, crop_h, crop_w = window
        if jpeg and self._window is not None:
            scale, bias = self._affine[8]
            try:
                self._window.decode_into(data, height, width, self._dct_divisor(crop_h / out_h, crop_w / out_w),
                                         y0, x0, crop_h, crop_w, out, top, left, out_h, out_w, self._out_kind, flip,
                                         spec.antialias, spec.fast_dct, scale, bias)
            except _jpeg.JpegError as e:
                raise BadImage(f"a broken JPEG: {e}") from None
            return
        if jpeg:
            pixels = self._jpeg_pixels(data, height, width, crop_h / out_h, crop_w / out_w)
        else:
            pixels = self._png_pixels(data)
        sy, sx = pixels.shape[0] / height, pixels.shape[1] / width
        scale, bias = self._affine[16 if pixels.dtype == np.uint16 else 8]
        _image.resize_into(pixels, y0 * sy, x0 * sx, crop_h * sy, crop_w * sx, out, top, left, out_h, out_w,
                           flip=flip, antialias=spec.antialias, scale=scale, bias=bias)

    # --- JPEG -------------------------------------------------------------------------------
    def _jpeg_size(self, data) -> tuple[int, int]:
        if self._window is not None:
            try:
                return self._window.header(data)
            except _jpeg.JpegError as e:
                raise BadImage(f"a broken JPEG header: {e}") from None
        import simplejpeg

        try:
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        except Exception as e:       # simplejpeg raises ValueError; anything else is as bad
            raise BadImage(f"a broken JPEG header: {e}") from None
        return height, width

    def _dct_divisor(self, shrink_h: float, shrink_w: float) -> int:
        """The largest of :data:`_DCT_DIVISORS` that the crop's shrink allows on both axes (1 without
        ``dct_scaling``)."""
        if not self.spec.dct_scaling:
            return 1
        return next((d for d in _DCT_DIVISORS if shrink_h >= d and shrink_w >= d), 1)

    def _jpeg_pixels(self, data, height: int, width: int, shrink_h: float, shrink_w: float) -> np.ndarray:
        """The image at the smallest fast DCT scale that keeps the crop at least the output's size (full size
        without ``dct_scaling``)."""
        import simplejpeg

        global _said_whole
        if _jpeg is None and not _said_whole:
            _said_whole = True
            _log.warning("infeed was built without libjpeg-turbo's headers: JPEGs are decoded whole through "
                         "simplejpeg, not just their crop window (slower for crops). Install libjpeg-dev (Debian, "
                         "Ubuntu) or libjpeg-turbo-devel (Fedora, RHEL) and reinstall, or install the wheel")
        divisor = self._dct_divisor(shrink_h, shrink_w)
        min_h, min_w = -(-height // divisor), -(-width // divisor)
        need = (min_h + 1) * (min_w + 1) * self.spec.channels
        if self._buffer.size < need:
            self._buffer = np.empty(need, np.uint8)
        try:
            return simplejpeg.decode_jpeg(data, colorspace=_JPEG_COLORSPACES[self.spec.channels],
                                          fastdct=self.spec.fast_dct, min_height=min_h, min_width=min_w,
                                          buffer=self._buffer)
        except Exception as e:
            raise BadImage(f"a broken JPEG: {e}") from None

    # --- PNG --------------------------------------------------------------------------------
    def _png_pixels(self, data) -> np.ndarray:
        try:
            from PIL import Image as PILImage
        except ImportError:
            raise BadImage("a PNG image, and PNG decoding needs Pillow: pip install 'tpu-estimator-jax[png]'") \
                from None
        channels = self.spec.channels
        try:
            with warnings.catch_warnings():         # the size is checked against max_pixels already
                warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)
                png = PILImage.open(io.BytesIO(data), formats=["PNG"])
                png.load()
            if png.mode in ("I;16", "I;16B", "I"):        # 16-bit gray: its levels kept whole, whatever the channels
                gray = np.asarray(png, dtype=np.uint16 if png.mode != "I" else np.int32)
                gray = np.clip(gray, 0, 65535).astype(np.uint16, copy=False)
                # Pillow's convert("RGB") clips I;16 at 255 (40000 became 255): gray is repeated instead, and
                # an alpha of RGBA is opaque, so the 16-bit path scales them as for one channel.
                pixels = gray if channels == 1 else np.repeat(gray[..., None], channels, axis=2)
                if channels == 4:
                    pixels[..., 3] = 65535
            else:
                pixels = np.asarray(png.convert(_PIL_MODES[channels]))
        except Exception as e:
            raise BadImage(f"a broken PNG: {e}") from None
        return np.ascontiguousarray(pixels.reshape(pixels.shape[0], pixels.shape[1], channels))

