"""infeed.Image: JPEG and PNG values decoded, cropped, resized, flipped and cast into the batch.

Pixels are checked against a plain numpy resampler with TensorFlow's
conventions (and against TensorFlow itself where it is installed); the random
crops and flips against the record's name, whatever reads it.
"""

import dataclasses
import io
import logging
import struct
import zlib

import ml_dtypes
import numpy as np
import pytest
import simplejpeg
from PIL import Image as PILImage

import infeed
from infeed import Daemon, Dataset, DecodeError, ExampleParser, FixedLen, Image, encode_example
from infeed.example import _image
from infeed.example import image as image_module
from infeed.example._image import resize_into
from infeed.example.spec import spec_from_json, spec_to_json


@pytest.fixture(autouse=True, params=["window", "simplejpeg"])
def jpeg_decoder(request, monkeypatch):
    """Every test with each JPEG decoder a build may have: the crop window's (libjpeg-turbo's headers found) and
    simplejpeg's whole-image decode (the build without them)."""
    if request.param == "simplejpeg":
        monkeypatch.setattr(image_module, "_jpeg", None)
    elif image_module._jpeg is None:
        pytest.skip("built without libjpeg-turbo's headers")
    return request.param


def photo(height=375, width=500, seed=0) -> np.ndarray:
    """A smooth RGB picture with edges (JPEG-friendly, and resampling errors show)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([128 + 100 * np.sin(x / (17 + 5 * c) + y / (23 + 3 * c) + c) for c in range(3)], axis=-1)
    base[height // 3: height // 2, width // 4: width // 2] = rng.integers(0, 255, 3)
    return np.clip(base, 0, 255).astype(np.uint8)


def jpeg(pixels, quality=90, **kw) -> bytes:
    return simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality=quality, **kw)


def pil_bytes(pixels_or_image, fmt="PNG", **kw) -> bytes:
    im = pixels_or_image if isinstance(pixels_or_image, PILImage.Image) else PILImage.fromarray(pixels_or_image)
    out = io.BytesIO()
    im.save(out, fmt, **kw)
    return out.getvalue()


def record(data: bytes, label: int = 0, key="image/encoded") -> bytes:
    return encode_example({key: data, "label": label})


def decode(spec: Image, data: bytes, ids=(0, 0, 0), seed=0) -> np.ndarray:
    parser = ExampleParser({"image": spec}, seed=seed)
    return parser.parse([record(data)], ids=[ids])["image"][0]


def reference_resize(pixels: np.ndarray, window, size, antialias=False) -> np.ndarray:
    """Separable triangle-filter resampling with half-pixel centres over the window's pixels, in float64."""
    y0, x0, h, w = window
    crop = pixels[y0:y0 + h, x0:x0 + w].astype(np.float64)

    def matrix(n_in, n_out):
        scale = n_in / n_out
        support = scale if antialias and scale > 1 else 1.0
        m = np.zeros((n_out, n_in))
        for i in range(n_out):
            centre = (i + 0.5) * scale
            j = np.arange(n_in)
            weights = np.maximum(0.0, 1 - np.abs(j + 0.5 - centre) / support)
            if weights.sum() == 0:
                weights[min(max(int(centre), 0), n_in - 1)] = 1
            m[i] = weights / weights.sum()
        return m

    rows, cols = matrix(h, size[0]), matrix(w, size[1])
    return np.einsum("ij,jkc,lk->ilc", rows, crop, cols, optimize=True)


def central_window(height, width, fraction=0.875):
    """ResNet's evaluation crop (TensorFlow's official preprocessing): a square, whole pixels."""
    crop = int(fraction * min(height, width))
    return (height - crop + 1) // 2, (width - crop + 1) // 2, crop, crop


# ---------------------------------------------------------------------------
# The spec


@pytest.mark.parametrize("kwargs, message", [
    ({"size": (0, 3)}, "size"), ({"size": 224}, "size"), ({"channels": 2}, "channels"),
    ({"dtype": "int32"}, "dtype"), ({"resize": "stretch"}, "resize"), ({"area": (0.5, 0.2)}, "area"),
    ({"area": (0.1, 1.5)}, "area"), ({"aspect": (0, 1)}, "aspect"), ({"central_fraction": 0}, "central_fraction"),
    ({"mean": 0.5}, "normalised values"), ({"dtype": "uint16", "std": 2}, "normalised values"),
    ({"dtype": "int8"}, "mean=128"), ({"dtype": "int8", "std": 2}, "mean=128"),
    ({"dtype": "float32", "std": 1e-300}, "fit float32"),
    ({"dtype": "int16", "mean": 1e30, "std": 1e-10}, "fit float32"),
    ({"dtype": "float32", "std": 0}, "std"),
    ({"dtype": "float32", "mean": (1, 2)}, "mean"), ({"max_pixels": 0}, "max_pixels"), ({"key": ""}, "key"),
])
def test_a_bad_image_spec_is_a_value_error_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Image(**kwargs)


def test_the_spec_round_trips_through_json_and_lays_out_the_batch(tmp_path):
    spec = {"image": Image(size=(32, 48), channels=1, dtype="bfloat16", resize="random_resized_crop", flip=True,
                           mean=127.5, std=(64,)), "label": FixedLen((), "int64")}
    assert spec_from_json(spec_to_json(spec)) == spec
    signed = {"image": Image(dtype="int8", mean=128, std=(1, 2, 3))}
    assert spec_from_json(spec_to_json(signed)) == signed
    assert ExampleParser(signed).allocate(2)["image"].dtype == np.int8
    out = ExampleParser(spec).allocate(4)
    assert out["image"].shape == (4, 32, 48, 1) and out["image"].dtype == ml_dtypes.bfloat16
    path = str(tmp_path / "a.tfrecord")
    with infeed.TFRecordWriter(path) as w:
        w.write(record(jpeg(photo(40, 60))))
    assert Dataset(path, spec, batch_size=8).template()["image"] == ((8, 32, 48, 1), ml_dtypes.bfloat16)


def test_two_images_may_read_one_feature_and_other_specs_may_not_share_it():
    pixels = photo(120, 160)
    parser = ExampleParser({"small": Image(size=(8, 8)), "large": Image(size=(64, 64), resize="pad")})
    out = parser.parse([record(jpeg(pixels))])
    assert out["small"].shape == (1, 8, 8, 3) and out["large"].shape == (1, 64, 64, 3)
    with pytest.raises(ValueError, match="read by both"):
        ExampleParser({"image/encoded": infeed.Bytes(max_bytes=10), "image": Image()})


# ---------------------------------------------------------------------------
# Pixels


@pytest.mark.parametrize("antialias", [False, True])
def test_the_centre_crop_matches_a_reference_resampler(antialias):
    pixels = photo()
    data = jpeg(pixels)
    decoded = simplejpeg.decode_jpeg(data, fastdct=True)
    got = decode(Image(dtype="float32", antialias=antialias), data)
    want = reference_resize(decoded, central_window(375, 500), (224, 224), antialias)
    assert np.abs(got - want).max() < 1e-3


def test_resize_none_copies_the_pixels_and_refuses_another_size():
    pixels = photo(60, 80)
    data = jpeg(pixels)
    got = decode(Image(size=(60, 80), resize=None), data)
    assert np.array_equal(got, simplejpeg.decode_jpeg(data, fastdct=True))
    with pytest.raises(DecodeError, match="resize=None needs 81x60"):
        decode(Image(size=(60, 81), resize=None), data)


def test_pad_fits_the_whole_image_centred_with_zeros_around():
    pixels = np.full((50, 100, 3), 200, np.uint8)
    got = decode(Image(size=(60, 60), resize="pad"), pil_bytes(pixels))
    assert (got[:15] == 0).all() and (got[45:] == 0).all() and (got[15:45] == 200).all()


def test_a_large_jpeg_is_decoded_at_a_dct_scale_that_keeps_the_crop_larger_than_the_output(monkeypatch,
                                                                                           jpeg_decoder):
    pixels = photo(768, 1024)
    data = jpeg(pixels)
    asked, divisors = [], []
    real, real_divisor = simplejpeg.decode_jpeg, image_module.ImageDecoder._dct_divisor

    def spy(*args, **kwargs):
        asked.append((kwargs["min_height"], kwargs["min_width"]))
        return real(*args, **kwargs)

    def divisor_spy(self, *args):
        divisors.append(real_divisor(self, *args))
        return divisors[-1]

    monkeypatch.setattr(simplejpeg, "decode_jpeg", spy)
    monkeypatch.setattr(image_module.ImageDecoder, "_dct_divisor", divisor_spy)
    got = decode(Image(size=(224, 224), dtype="float32"), data)       # crop 672 -> 224: 1/2 keeps 336 >= 224
    small = decode(Image(size=(64, 64), dtype="float32"), data)       # 672 -> 64: 1/8 keeps 84 >= 64
    assert divisors == [2, 8]
    assert asked == ([(384, 512), (96, 128)] if jpeg_decoder == "simplejpeg" else [])
    full = real(data, fastdct=True).astype(np.float64)
    assert np.abs(got - reference_resize(full, central_window(768, 1024), (224, 224), antialias=True)).mean() < 2
    assert np.abs(small - reference_resize(full, central_window(768, 1024), (64, 64), antialias=True)).mean() < 2


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_jpeg_colour_models_grayscale_and_cmyk_give_the_channels_asked(channels):
    pixels = photo(40, 40)
    for source in (PILImage.fromarray(pixels), PILImage.fromarray(pixels).convert("L"),
                   PILImage.fromarray(pixels).convert("CMYK")):
        data = pil_bytes(source, "JPEG", quality=95)
        got = decode(Image(size=(40, 40), channels=channels, resize=None), data)
        assert got.shape == (40, 40, channels)
        want = np.asarray(PILImage.open(io.BytesIO(data)).convert({1: "L", 3: "RGB", 4: "RGBA"}[channels]))
        assert np.abs(got.astype(int) - want.reshape(got.shape)).mean() < 3, source.mode
    if channels == 4:
        assert (got[..., 3] == 255).all()


def test_a_build_without_the_window_decoder_says_so_once_at_its_first_jpeg(jpeg_decoder, monkeypatch, caplog):
    monkeypatch.setattr(image_module, "_said_whole", False)
    data = jpeg(photo(48, 64))
    with caplog.at_level(logging.WARNING, logger="infeed.example.image"):
        decode(Image(size=(32, 32)), data)
        decode(Image(size=(32, 32)), data)
    said = [r.getMessage() for r in caplog.records if "built without libjpeg-turbo's headers" in r.getMessage()]
    assert len(said) == (1 if jpeg_decoder == "simplejpeg" else 0)


def test_a_progressive_jpeg_decodes_as_the_baseline_one():
    pixels = photo(64, 64)
    base = decode(Image(size=(64, 64), resize=None), pil_bytes(pixels, "JPEG", quality=95))
    progressive = decode(Image(size=(64, 64), resize=None), pil_bytes(pixels, "JPEG", quality=95, progressive=True))
    assert np.abs(base.astype(int) - progressive).mean() < 1


def test_png_kinds_palette_alpha_gray_and_sixteen_bits():
    pixels = photo(30, 40)
    rgba = np.dstack([pixels, np.full((30, 40), 7, np.uint8)])
    assert np.array_equal(decode(Image(size=(30, 40), resize=None), pil_bytes(rgba)), pixels)       # alpha dropped
    assert np.array_equal(decode(Image(size=(30, 40), channels=4, resize=None), pil_bytes(rgba)), rgba)
    palette = PILImage.fromarray(pixels).quantize(16)
    assert np.array_equal(decode(Image(size=(30, 40), resize=None), pil_bytes(palette)),
                          np.asarray(palette.convert("RGB")))
    deep = (np.arange(30 * 40, dtype=np.uint16).reshape(30, 40) * 50)
    data = pil_bytes(PILImage.fromarray(deep))
    assert np.array_equal(decode(Image(size=(30, 40), channels=1, dtype="uint16", resize=None), data)[..., 0], deep)
    as_bytes = decode(Image(size=(30, 40), channels=1, resize=None), data)[..., 0]
    assert np.array_equal(as_bytes, np.floor(deep / 257 + 0.5).astype(np.uint8))


@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("dtype", ["uint8", "uint16", "float32"])
def test_a_sixteen_bit_gray_png_keeps_its_levels_for_any_channel_count(channels, dtype):
    """Pillow's convert("RGB") clips 16-bit gray at 255: level 40000 came out as 255 in RGB, not 156."""
    deep = np.array([[0, 255, 256, 39963, 40000, 65535]], np.uint16)
    got = decode(Image(size=(1, 6), channels=channels, dtype=dtype, resize=None), pil_bytes(PILImage.fromarray(deep)))
    levels = {"uint16": deep, "float32": deep / np.float32(257), "uint8": np.floor(deep / 257 + 0.5)}[dtype]
    for c in range(min(channels, 3)):
        assert np.allclose(got[..., c], levels), c
    if channels == 4:                                               # gray has no alpha: opaque
        assert (got[..., 3] == (65535 if dtype == "uint16" else 255)).all()
    assert got[0, 4, 0] == {"uint8": 156, "uint16": 40000, "float32": np.float32(40000 / 257)}[dtype]
    resize = Image(size=(1, 4), channels=channels, dtype=dtype, resize="pad")         # through the resize too
    resized = decode(resize, pil_bytes(PILImage.fromarray(deep)))
    alone = decode(dataclasses.replace(resize, channels=1), pil_bytes(PILImage.fromarray(deep)))
    tolerance = 1e-4 if dtype == "float32" else 0                     # the 3-channel kernel's float: 1 ulp off
    assert all(np.allclose(resized[..., c], alone[..., 0], rtol=0, atol=tolerance) for c in range(min(channels, 3)))


def test_float_outputs_are_normalised_and_halves_are_the_float32_values_rounded():
    data = jpeg(photo(100, 120))
    plain = decode(Image(size=(50, 50), dtype="float32"), data)
    mean, std = (123.7, 116.3, 103.5), (58.4, 57.1, 57.4)
    normalised = decode(Image(size=(50, 50), dtype="float32", mean=mean, std=std), data)
    assert np.allclose(normalised, (plain - mean) / np.array(std), atol=1e-4)
    for dtype in ("bfloat16", "float16"):
        half = decode(Image(size=(50, 50), dtype=dtype, mean=mean, std=std), data)
        assert half.dtype == np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
        assert np.array_equal(half, normalised.astype(half.dtype))
    # uint8 from 8-bit RGB is resampled in fixed point: the float32 values rounded, or a level off where they lie
    # within 0.02 of a half
    as_u8 = decode(Image(size=(50, 50)), data).astype(int)
    rounded = np.clip(np.floor(plain + 0.5), 0, 255)
    assert np.abs(as_u8 - rounded).max() <= 1
    off = as_u8 != rounded
    assert (np.abs(plain[off] - np.floor(plain[off]) - 0.5) < 0.02).all()


def test_signed_outputs_are_the_normalised_values_rounded_half_up_and_clamped():
    data = jpeg(photo(100, 120))
    plain = decode(Image(size=(50, 50), dtype="float32"), data)
    centred = decode(Image(size=(50, 50), dtype="int8", mean=128), data)      # an int8-quantised model's input
    assert centred.dtype == np.int8
    assert np.array_equal(centred, np.clip(np.floor(plain - 128 + 0.5), -128, 127).astype(np.int8))
    assert np.array_equal(decode(Image(size=(50, 50), dtype="int16"), data), np.floor(plain + 0.5))
    mean, std = (123.7, 116.3, 103.5), (0.25, 0.5, 4.0)       # 1 / std levels: beyond int8, clamped
    normalised = decode(Image(size=(50, 50), dtype="float32", mean=mean, std=std), data)
    for dtype, (low, high) in (("int8", (-128, 127)), ("int16", (-32768, 32767))):
        got = decode(Image(size=(50, 50), dtype=dtype, mean=mean, std=std), data)
        assert got.dtype == np.dtype(dtype)
        assert np.array_equal(got, np.clip(np.floor(normalised + 0.5), low, high))
    assert centred.min() < 0 < centred.max() and decode(Image(size=(50, 50), dtype="int8", mean=mean, std=std),
                                                         data).min() == -128


@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("out_w", [7, 8, 33])
@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("pixel", [np.uint8, np.uint16])
def test_the_kernel_matches_the_reference_for_any_channels_width_flip_and_placement(channels, out_w, flip, pixel):
    # Odd and even widths cover the kernel's two-pixels-at-a-time rows and their tail; placement inside a larger
    # row checks that nothing is written around the window (the row loops write floats past a line, never past
    # the output's pixels).
    rng = np.random.default_rng(channels * 100 + out_w)
    image = rng.integers(0, np.iinfo(pixel).max, (41, 57, channels), dtype=pixel)
    window = (3, 5, 30, 44)
    out = np.full((13, out_w + 4, channels), -7.0, np.float32)
    resize_into(image, *window, out, 1, 2, 11, out_w, flip=flip, scale=np.arange(1, channels + 1) / 2, bias=0.25)
    want = reference_resize(image, window, (11, out_w)) * (np.arange(1, channels + 1) / 2) + 0.25
    got = out[1:12, 2:2 + out_w]
    np.testing.assert_allclose(got, want[:, ::-1] if flip else want, rtol=1e-5, atol=1e-2)
    outside = np.ones(out.shape[:2], bool)
    outside[1:12, 2:2 + out_w] = False
    assert (out[outside] == -7.0).all()


@pytest.mark.parametrize("simd", [True, False], ids=["avx2-where-present", "portable"])
@pytest.mark.parametrize("out_w", [1, 7, 8, 9, 33, 224])
@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("window", [(3.5, 5.25, 30.0, 44.0), (0, 0, 41, 57), (40.2, 56.5, 0.8, 0.5), (10, 0, 31, 1)],
                         ids=["inside", "whole", "last-pixel", "one-column"])
def test_the_fixed_point_kernel_is_within_a_level_of_the_float_one(simd, out_w, flip, window):
    # 8-bit RGB into uint8, unscaled and bilinear, runs in fixed point (_bilinear_u8.c): the float kernel's
    # values rounded, or a level off only where they lie within 0.02 of a half. Widths cover the AVX2 loop's 8
    # pixels and its tail; windows at the edges give pixels with one tap (the second, weighing 0, read past the
    # last pixel); placement inside a larger row checks that nothing is written around it.
    rng = np.random.default_rng(out_w)
    image = rng.integers(0, 256, (41, 57, 3), dtype=np.uint8)
    image[:20] = np.cumsum(rng.integers(0, 3, (20, 57, 3)), axis=1).astype(np.uint8)    # smooth rows too
    floats = np.zeros((13, out_w + 4, 3), np.float32)
    resize_into(image, *window, floats, 1, 2, 11, out_w, flip=flip)
    want = np.clip(np.floor(floats[1:12, 2:2 + out_w] + 0.5), 0, 255)
    out = np.full((13, out_w + 4, 3), 7, np.uint8)
    before = _image.set_simd(simd)
    try:
        resize_into(image, *window, out, 1, 2, 11, out_w, flip=flip)
    finally:
        _image.set_simd(before)
    got = out[1:12, 2:2 + out_w].astype(int)
    assert np.abs(got - want).max() <= 1
    off = got != want
    values = floats[1:12, 2:2 + out_w][off]
    assert (np.abs(values - np.floor(values) - 0.5) < 0.02).all()
    outside = np.ones(out.shape[:2], bool)
    outside[1:12, 2:2 + out_w] = False
    assert (out[outside] == 7).all()


def test_the_fixed_point_kernels_avx2_and_portable_code_give_the_same_bytes():
    rng = np.random.default_rng(7)
    image = rng.integers(0, 256, (375, 500, 3), dtype=np.uint8)
    results = []
    for simd in (True, False):
        before = _image.set_simd(simd)
        try:
            out = np.zeros((224, 224, 3), np.uint8)
            for window, flip in (((23.5, 86.0, 328.0, 328.0), False), ((10.3, 7.9, 200.4, 350.1), True),
                                 ((0, 0, 100, 60), False)):
                resize_into(image, *window, out, 0, 0, 224, 224, flip=flip)
                results.append(out.copy())
        finally:
            _image.set_simd(before)
    for a, b in zip(results[:3], results[3:]):
        assert np.array_equal(a, b)
    assert _image.fixed_point_impl() in ("avx2", "portable")


def test_the_kernel_refuses_windows_and_placements_outside_its_arrays():
    image, out = np.zeros((10, 10, 3), np.uint8), np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match="window"):
        resize_into(image, 5, 0, 6, 10, out, 0, 0, 4, 4)
    with pytest.raises(ValueError, match="placement"):
        resize_into(image, 0, 0, 10, 10, out, 1, 0, 4, 4)
    with pytest.raises(ValueError, match="same C"):
        resize_into(image, 0, 0, 10, 10, np.zeros((4, 4, 1), np.uint8), 0, 0, 4, 4)
    with pytest.raises(ValueError, match="out must be one of"):
        resize_into(image, 0, 0, 10, 10, np.zeros((4, 4, 3), np.int32), 0, 0, 4, 4)
    with pytest.raises(ValueError, match="out must be one of .* got float8_e4m3fn"):   # a dtype numpy does not own
        resize_into(image, 0, 0, 10, 10, np.zeros((4, 4, 3), ml_dtypes.float8_e4m3fn), 0, 0, 4, 4)
    with pytest.raises(ValueError, match="image must be uint8 or uint16, got int16"):
        resize_into(image.astype(np.int16), 0, 0, 10, 10, out, 0, 0, 4, 4)


# ---------------------------------------------------------------------------
# Random crops and flips


def test_random_crops_and_flips_follow_the_records_name_and_the_seed():
    data = jpeg(photo())
    spec = Image(size=(64, 64), resize="random_resized_crop", flip=True)
    a = decode(spec, data, ids=(0, 1, 2))
    assert np.array_equal(a, decode(spec, data, ids=(0, 1, 2)))
    others = [decode(spec, data, ids=ids) for ids in ((1, 1, 2), (0, 2, 2), (0, 1, 3))]
    others.append(decode(spec, data, ids=(0, 1, 2), seed=1))
    assert all(not np.array_equal(a, b) for b in others)


def test_the_random_window_stays_inside_the_image_and_within_the_area_and_aspect_asked():
    rng = np.random.default_rng(0)
    for _ in range(500):
        height, width = (int(v) for v in rng.integers(1, 400, 2))
        y, x, h, w = image_module._random_window(height, width, (0.08, 1.0), (3 / 4, 4 / 3), rng)
        assert 0 <= y and 0 <= x and 0 < h and 0 < w and y + h <= height and x + w <= width


@pytest.fixture(scope="module")
def photo_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    paths, number = [], 0
    for f, n in enumerate((13, 9, 11)):
        path = str(root / f"train-{f}.tfrecord")
        with infeed.TFRecordWriter(path) as w:
            for r in range(n):
                pixels = photo(90 + 7 * (number % 5), 120 + 11 * (number % 3), seed=number)
                w.write(encode_example({"image/encoded": jpeg(pixels), "id": number}))
                number += 1
        paths.append(path)
    return paths


RECORDS_PER_EPOCH = 32         # 33 records in batches of 4, the last one dropped


def sequence(ds, **kw) -> list:
    """``(record id, image)`` of every row of every batch of ``ds`` through a daemon, in order."""
    with Daemon(ds, lock_memory=False, timeout=60, **kw) as feed:
        return [(int(i), image.copy()) for batch in feed for i, image in zip(batch["id"], batch["image"])]


def by_epoch_and_id(rows: list) -> dict:
    return {(n // RECORDS_PER_EPOCH, i): image for n, (i, image) in enumerate(rows)}


def same(a: list, b: list) -> bool:
    return [i for i, _ in a] == [i for i, _ in b] and all(np.array_equal(x, y) for (_, x), (_, y) in zip(a, b))


def test_each_records_crop_is_the_same_for_any_worker_count_order_and_resume(photo_files):
    spec = {"image": Image(size=(32, 32), resize="random_resized_crop", flip=True), "id": FixedLen((), "int64")}
    ds = Dataset(photo_files, spec, batch_size=4, seed=5, num_epochs=2)
    one = sequence(ds, num_workers=1)
    assert len(one) == 2 * RECORDS_PER_EPOCH and same(one, sequence(ds, num_workers=3))
    epochs = by_epoch_and_id(one)
    assert not any(np.array_equal(epochs[0, i], epochs[1, i]) for i in range(32))      # a new draw each epoch
    shuffled = by_epoch_and_id(sequence(ds.replace(shuffle_buffer=8, shuffle_files=True), num_workers=2))
    common = set(epochs) & set(shuffled)
    assert len(common) > 32 and all(np.array_equal(epochs[k], shuffled[k]) for k in common)
    with Daemon(ds, num_workers=2, lock_memory=False, timeout=60) as feed:
        for _ in range(3):
            next(feed)
        state = feed.state()
    assert same(sequence(ds, num_workers=1, state=state), one[12:])


# ---------------------------------------------------------------------------
# Bad images


def jpeg_declaring(height: int, width: int) -> bytes:
    """A small JPEG whose frame header claims another size."""
    data = bytearray(jpeg(photo(16, 16)))
    at = data.index(b"\xff\xc0") + 5
    data[at:at + 4] = struct.pack(">HH", height, width)
    return bytes(data)


def png_declaring(height: int, width: int) -> bytes:
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + header
    ihdr = struct.pack(">I", len(header)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    body = zlib.compress(b"\0" * 64)
    idat = struct.pack(">I", len(body)) + b"IDAT" + body + struct.pack(">I", zlib.crc32(b"IDAT" + body))
    return b"\x89PNG\r\n\x1a\n" + ihdr + idat


GOOD = jpeg(photo(48, 64))
BAD_IMAGES = {
    "empty": (b"", "empty value"),
    "garbage": (b"hello world, not an image", "neither JPEG nor PNG"),
    "truncated jpeg": (GOOD[:len(GOOD) // 2], "broken JPEG"),
    "jpeg header only": (GOOD[:20], "broken JPEG"),
    "truncated png": (pil_bytes(photo(48, 64))[:300], "broken PNG"),
    "jpeg bomb": (jpeg_declaring(60000, 60000), "60000x60000 image, more than max_pixels"),
    "jpeg too large for libjpeg": (jpeg_declaring(65535, 65535), "broken JPEG header"),
    "png bomb": (png_declaring(65535, 65535), "65535x65535 image, more than max_pixels"),
}


@pytest.mark.parametrize("name", list(BAD_IMAGES))
def test_a_bad_image_is_a_decode_error_naming_record_and_feature(name):
    data, message = BAD_IMAGES[name]
    parser = ExampleParser({"image": Image(size=(32, 32)), "label": FixedLen((), "int64")})
    with pytest.raises(DecodeError, match=message) as caught:
        parser.parse([record(GOOD), record(data)], index_base=10)
    assert caught.value.feature == "image/encoded" and caught.value.record_index == 11
    assert caught.value.offset is not None


def test_a_missing_image_or_two_values_is_a_decode_error():
    parser = ExampleParser({"image": Image(size=(8, 8))})
    with pytest.raises(DecodeError, match=r"feature 'image/encoded': .*found no such feature: the record has 'image', "
                                          r"'label' \(nearest first\); an infeed.Image reads the feature its key= "
                                          r"names \(here key='image/encoded'\)"):
        parser.parse([encode_example({"label": 1, "image": [GOOD]})])
    with pytest.raises(DecodeError, match="1 bytes value"):
        parser.parse([encode_example({"image/encoded": [GOOD, GOOD]})])


def test_skip_corrupt_makes_a_bad_images_record_a_zero_row_never_a_copy_of_another():
    parser = ExampleParser({"image": Image(size=(16, 16)), "label": FixedLen((), "int64")}, skip_corrupt=True)
    records = [record(b"bad", 7), record(GOOD, 1), record(b"", 9), record(jpeg(photo(40, 40, seed=3)), 3)]
    out = parser.parse(records)
    assert out["label"].tolist() == [0, 1, 0, 3]
    assert not out["image"][0].any() and not out["image"][2].any() and out["image"][1].any()
    assert parser.skipped_images == 2 and parser.last_skipped_rows == [0, 2]
    assert [e.record_index for e in parser.last_skipped] == [0, 2]
    out = parser.allocate(4)
    parser.parse([record(b"bad"), record(b"worse")], out, start=2)      # a batch of nothing but bad images
    assert parser.last_skipped_rows == [2, 3] and parser.skipped_images == 4 and not out["image"].any()
    parser.parse([record(GOOD, 5)])
    assert parser.last_skipped_rows == [] and parser.last_skipped == []


def _bad_image_records(path, bad=(1, 6, 7, 12)):
    """16 records with ids 0..15 (+100 for a label) of which those in ``bad`` hold an image that does not decode."""
    with infeed.TFRecordWriter(path) as w:
        for i in range(16):
            w.write(encode_example({"image/encoded": b"GIF89a..." if i in bad else GOOD, "id": i, "label": 100 + i}))
    return set(bad)


def test_a_daemon_names_the_file_of_a_bad_image_or_skips_it_with_a_warning(tmp_path, capfd):
    path = str(tmp_path / "bad.tfrecord")
    bad = _bad_image_records(path)
    spec = {"image": Image(size=(16, 16)), "id": FixedLen((), "int64")}
    # the first bad record of either worker's first batch (0-3: worker 0, 4-7: worker 1), whichever fails first
    with pytest.raises(DecodeError, match=r"bad\.tfrecord: record (1|6) \(byte \d+\): feature 'image/encoded'"):
        with Daemon(Dataset(path, spec, batch_size=4), num_workers=2, lock_memory=False, timeout=60) as feed:
            list(feed)
    capfd.readouterr()
    with Daemon(Dataset(path, spec, batch_size=4, skip_corrupt=True), num_workers=2, lock_memory=False,
                timeout=60) as feed:
        batches = list(feed)
    logged = capfd.readouterr().err                                # the workers' warnings
    assert all(f"bad.tfrecord: record {i}: feature 'image/encoded': expected a JPEG or PNG image" in logged
               for i in bad)
    assert logged.count("skipped (skip_corrupt): its row is zeros, flagged in is_padding") == len(bad)
    assert [b["id"].tolist() for b in batches] == [[0, 0, 2, 3], [4, 5, 0, 0], [8, 9, 10, 11], [0, 13, 14, 15]]


@pytest.mark.parametrize("workers", [1, 3])
def test_skipped_images_are_padding_rows_counted_in_stats_the_same_for_any_workers_and_a_resume(tmp_path, workers):
    path = str(tmp_path / "bad.tfrecord")
    bad = _bad_image_records(path)
    spec = {"image": Image(size=(16, 16)), "id": FixedLen((), "int64"), "label": FixedLen((), "int64")}
    dataset = Dataset(path, spec, batch_size=4, skip_corrupt=True, labels="label", shuffle_buffer=8, seed=3)
    with Daemon(dataset, num_workers=workers, lock_memory=False, timeout=60) as feed:
        batches = [{k: np.array(v) for k, v in b.items()} for b in feed]
        stats = feed.stats()
    real = [int(i) for b in batches for i, pad in zip(b["id"], b["is_padding"]) if not pad]
    assert sorted(real) == sorted(set(range(16)) - bad)                  # each good record once
    for b in batches:
        pads = b["is_padding"]
        assert not b["image"][pads].any() and not b["label"][pads].any() and not b["id"][pads].any()
        assert (b["label"][~pads] == b["id"][~pads] + 100).all()
    assert sum(int(b["is_padding"].sum()) for b in batches) == len(bad)
    assert stats.skipped == len(bad) and sum(w.records for w in stats.workers) == 16 - len(bad)
    assert stats.to_json()["skipped"] == len(bad)
    with Daemon(dataset, num_workers=2, lock_memory=False, timeout=60) as feed:          # another W
        assert [b["id"].tolist() for b in feed] == [b["id"].tolist() for b in batches]
    with Daemon(dataset, num_workers=1, lock_memory=False, timeout=60) as feed:
        next(iter(feed))
        state = feed.state()
    with Daemon(dataset, num_workers=workers, state=state, lock_memory=False, timeout=60) as feed:   # a resume
        resumed = [{k: np.array(v) for k, v in b.items()} for b in feed]
    for got, want in zip(resumed, batches[1:], strict=True):
        assert got["is_padding"].tolist() == want["is_padding"].tolist() and got["id"].tolist() == want["id"].tolist()


def test_a_skipped_images_row_is_padding_after_a_transform_too(tmp_path):
    import transforms_for_tests as tx

    path = str(tmp_path / "bad.tfrecord")
    bad = _bad_image_records(path)
    dataset = Dataset(path, {"image": Image(size=(16, 16))}, batch_size=4, skip_corrupt=True,
                      transform="transforms_for_tests:image_halves", outputs=tx.IMAGE_OUTPUTS)
    with Daemon(dataset, num_workers=2, lock_memory=False, timeout=60) as feed:
        batches = [{k: np.array(v) for k, v in b.items()} for b in feed]
    pads = np.concatenate([b["is_padding"] for b in batches])
    assert np.flatnonzero(pads).tolist() == sorted(bad)
    is_view = np.concatenate([b["is_view"] for b in batches])
    assert is_view[~pads].all() and not is_view[pads].any()     # what the transform made of the zeros is not kept


def test_pillow_missing_names_the_extra(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pil(name, *args, **kwargs):
        if name == "PIL" or name.startswith("PIL."):
            raise ImportError("No module named 'PIL'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pil)
    with pytest.raises(DecodeError, match=r"tpu-estimator-jax\[png\]"):
        decode(Image(size=(8, 8)), pil_bytes(photo(8, 8)))


def test_without_dct_scaling_a_jpeg_is_decoded_whole_before_its_crop_is_resized():
    """A 3x shrink: by default decoded at 1/2 scale; with dct_scaling=False at full size, exactly as the same
    pixels given losslessly (a PNG of the full-size decode) go through the same crop and resize."""
    data = jpeg(photo(672, 896))
    whole = simplejpeg.decode_jpeg(data, fastdct=True)
    for spec in (Image(dtype="float32"), Image(dtype="float32", resize="random_resized_crop", area=(0.9, 1),
                                               antialias=True)):
        exact = dataclasses.replace(spec, dct_scaling=False)
        want = decode(exact, pil_bytes(whole), ids=(0, 0, 7))
        assert np.array_equal(decode(exact, data, ids=(0, 0, 7)), want)
        assert not np.array_equal(decode(spec, data, ids=(0, 0, 7)), want)     # scaled: other pixels
    assert spec_from_json(spec_to_json({"i": exact}))["i"] == exact
    assert "dct_scaling" not in spec_to_json({"i": spec})["i"]               # its default: as before it was


# ---------------------------------------------------------------------------
# TensorFlow, where installed


def test_agreement_with_tensorflow():
    tf = pytest.importorskip("tensorflow")
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    data = jpeg(photo())
    decoded = tf.io.decode_jpeg(data, dct_method="INTEGER_FAST").numpy()
    y, x, h, w = central_window(375, 500)
    want = tf.image.resize(decoded[None, y:y + h, x:x + w], (224, 224))[0].numpy()
    assert np.abs(decode(Image(dtype="float32"), data) - want).mean() < 0.01
    want = tf.image.resize(decoded[None], (224, 224), antialias=True)[0].numpy()
    got = decode(Image(dtype="float32", resize="random_resized_crop", area=(1, 1), aspect=(4 / 3, 4 / 3),
                       antialias=True), data)
    assert np.abs(got - want).mean() < 0.01
    big = jpeg(photo(768, 1024))                      # a DCT scale applies: without it, TensorFlow's pixels
    full = tf.io.decode_jpeg(big, dct_method="INTEGER_FAST").numpy()
    y, x, h, w = central_window(768, 1024)
    want = tf.image.resize(full[None, y:y + h, x:x + w], (224, 224))[0].numpy()
    assert np.abs(decode(Image(dtype="float32", dct_scaling=False), big) - want).max() < 0.01
    png = pil_bytes(photo(64, 80))
    assert np.array_equal(decode(Image(size=(64, 80), resize=None), png), tf.io.decode_png(png).numpy())
    cmyk = pil_bytes(PILImage.fromarray(photo(48, 48)).convert("CMYK"), "JPEG", quality=95)
    want = tf.io.decode_jpeg(cmyk, channels=3).numpy().astype(int)
    # TensorFlow truncates c * k / 255 where libjpeg-turbo rounds: ours are up to a few levels brighter.
    difference = decode(Image(size=(48, 48), resize=None, fast_dct=False), cmyk) - want
    assert 0 <= difference.mean() < 3 and np.abs(difference).max() <= 8
