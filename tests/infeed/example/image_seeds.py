"""Small valid images of every kind infeed.Image reads, for the fuzzers to mutate."""

import io

import numpy as np
from PIL import Image as PILImage


def seed_images() -> list[bytes]:
    """JPEGs (baseline, progressive, gray, CMYK) and PNGs (RGB, RGBA, palette, 16-bit gray), 12x17 pixels."""
    pixels = np.random.default_rng(0).integers(0, 255, (12, 17, 3), dtype=np.uint8)
    image = PILImage.fromarray(pixels)
    kinds = [(image, "JPEG", {}), (image, "JPEG", {"progressive": True}), (image.convert("L"), "JPEG", {}),
             (image.convert("CMYK"), "JPEG", {}), (image, "PNG", {}), (image.convert("RGBA"), "PNG", {}),
             (image.quantize(8), "PNG", {}), (PILImage.fromarray(pixels[..., 0].astype(np.uint16) * 200), "PNG", {})]
    out = []
    for im, fmt, options in kinds:
        buffer = io.BytesIO()
        im.save(buffer, fmt, **options)
        out.append(buffer.getvalue())
    return out
