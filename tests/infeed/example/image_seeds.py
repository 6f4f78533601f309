"""Small valid images of every kind infeed.Image reads, for the fuzzers to mutate."""

import io

import numpy as np
from PIL import Image as PILImage


def photo(height: int, width: int) -> PILImage.Image:
    """A smooth RGB picture (waves, ramps, a disc, a little noise) that JPEG compresses to a few hundred bytes per
    thousand pixels, unlike noise."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    r = 128 + 100 * np.sin(x / 9.0) * np.cos(y / 13.0)
    g = 255 * x / max(1, width - 1)
    disc = (x - width * 0.6) ** 2 + (y - height * 0.4) ** 2 < (min(height, width) / 4) ** 2
    b = np.where(disc, 220.0, 40 + 150 * y / max(1, height - 1))
    pixels = np.stack([r, g, b], -1) + np.random.default_rng(1).normal(0, 6, (height, width, 3))
    return PILImage.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def seed_images() -> list[bytes]:
    """JPEGs (baseline, progressive, gray, CMYK) and PNGs (RGB, RGBA, palette, 16-bit gray), 12x17 pixels; then
    JPEGs of several iMCUs for the crop-window decoder (its iMCU columns, skipped rows, DCT scales): 4:4:4, 4:2:2,
    4:2:0 with restart markers every 2 MCUs, progressive 4:2:0, CMYK, and a 96x130 4:2:0 photo (1-3 KB each).
    The first is the tests' good image; new seeds go at the end."""
    pixels = np.random.default_rng(0).integers(0, 255, (12, 17, 3), dtype=np.uint8)
    image = PILImage.fromarray(pixels)
    small, medium, large = photo(33, 47), photo(40, 56), photo(96, 130)
    kinds = [(image, "JPEG", {}), (image, "JPEG", {"progressive": True}), (image.convert("L"), "JPEG", {}),
             (image.convert("CMYK"), "JPEG", {}), (image, "PNG", {}), (image.convert("RGBA"), "PNG", {}),
             (image.quantize(8), "PNG", {}), (PILImage.fromarray(pixels[..., 0].astype(np.uint16) * 200), "PNG", {}),
             (small, "JPEG", {"subsampling": "4:4:4"}), (small, "JPEG", {"subsampling": "4:2:2"}),
             (small, "JPEG", {"subsampling": "4:2:0", "restart_marker_blocks": 2}),
             (medium, "JPEG", {"subsampling": "4:2:0", "progressive": True}),
             (medium.convert("CMYK"), "JPEG", {"restart_marker_rows": 1}),
             (large, "JPEG", {"subsampling": "4:2:0"})]
    out = []
    for im, fmt, options in kinds:
        buffer = io.BytesIO()
        im.save(buffer, fmt, **options)
        out.append(buffer.getvalue())
    return out
