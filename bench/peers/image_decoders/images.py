"""The test images: JPEGs made from the two photos scikit-learn ships, at the sizes timed (:func:`make_images`);
small files for the capability checks (:func:`feature_images`); one large JPEG for the GIL check."""

from __future__ import annotations

import io

import numpy as np

SIZES = ((500, 375), (640, 480), (1024, 768))      # (width, height)
QUALITY = 90


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


def gil_probe_image() -> bytes:
    """A 3000x2000 JPEG: one decode call long enough (tens of ms) to see whether other threads run during it."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(sample_photos()[0]).resize((3000, 2000), Image.BICUBIC).save(buf, "JPEG", quality=QUALITY)
    return buf.getvalue()
