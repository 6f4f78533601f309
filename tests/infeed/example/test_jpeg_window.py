"""The crop-window JPEG decoder (infeed/example/_jpeg.pyx over libjpeg-turbo): only the crop's iMCU columns and
rows decoded, the same pixels as a decode of the whole photo.

Every kind of JPEG the suite holds out (baseline 4:4:4 / 4:2:2 / 4:2:0 / 4:4:0 / 4:1:1, progressive, restart
markers, gray, CMYK, an EXIF orientation) is cut at every kind of place: at the edges, across iMCU boundaries,
smaller than one iMCU. The window is checked against the whole image decoded by the same library, pixel for
pixel, and the batch rows against simplejpeg's whole-image path (the build without libjpeg-turbo's headers).
"""

import io
import threading

import numpy as np
import pytest
import simplejpeg
from PIL import Image as PILImage

from infeed import ExampleParser, Image, encode_example
from infeed.example import image as image_module

_jpeg = pytest.importorskip("infeed.example._jpeg", reason="built without libjpeg-turbo's headers")

HEIGHT, WIDTH = 157, 203               # neither a multiple of an iMCU (8, 16 or 32 pixels)


def photo(height=HEIGHT, width=WIDTH, seed=1) -> np.ndarray:
    """Smooth colour with sharp edges and noise: chroma that upsampling differences would show."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([128 + 90 * np.sin(x / (9 + 4 * c) + y / (13 + 3 * c) + c) for c in range(3)], axis=-1)
    base[(y.astype(int) // 11 + x.astype(int) // 7) % 5 == 0] = rng.integers(0, 255, 3)
    return np.clip(base + rng.normal(0, 6, base.shape), 0, 255).astype(np.uint8)


def pil_jpeg(image: PILImage.Image, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", quality=92, **options)
    return out.getvalue()


def kinds() -> dict:
    pixels = photo()
    image = PILImage.fromarray(pixels)
    exif = PILImage.Exif()
    exif[0x0112] = 6                   # orientation: rotate 90 degrees (ignored, as tf.io.decode_jpeg does)
    out = {f"baseline {s}": simplejpeg.encode_jpeg(pixels, quality=92, colorsubsampling=s)
           for s in ("444", "422", "420", "440", "411")}
    out["progressive 4:2:0"] = pil_jpeg(image, progressive=True, subsampling=2)
    out["progressive 4:4:4"] = pil_jpeg(image, progressive=True, subsampling=0)
    out["restart markers"] = pil_jpeg(image, restart_marker_blocks=3)
    out["restart markers, progressive"] = pil_jpeg(image, restart_marker_rows=1, progressive=True)
    out["gray"] = pil_jpeg(image.convert("L"))
    out["cmyk"] = pil_jpeg(image.convert("CMYK"))
    out["exif orientation 6"] = pil_jpeg(image, exif=exif.tobytes())
    return out


KINDS = kinds()

#: (y0, x0, height, width) of the 157x203 photo: whole, corners, edges, iMCU-aligned, across boundaries, tiny.
WINDOWS = [(0, 0, HEIGHT, WIDTH), (0, 0, 9, 17), (HEIGHT - 9, WIDTH - 17, 9, 17), (0, WIDTH - 1, HEIGHT, 1),
           (HEIGHT - 1, 0, 1, WIDTH), (16, 32, 16, 32), (15, 31, 18, 34), (37, 61, 3, 5), (8, 8, 1, 1),
           (100, 150, 57, 53), (50, 7, 60, 190), (71, 95, 7, 7)]


def window_pixels(data: bytes, window, channels=3, fast_dct=True) -> np.ndarray:
    """The window decoded by the window decoder at full scale and copied out unresized (1:1 taps are exact)."""
    decoder = _jpeg.WindowDecoder()
    height, width = decoder.header(data)
    y0, x0, h, w = window
    out = np.zeros((h, w, channels), np.uint8)
    ones, zeros = np.ones(channels, np.float32), np.zeros(channels, np.float32)
    decoder.decode_into(data, height, width, 1, y0, x0, h, w, out, 0, 0, h, w, 0, False, False, fast_dct, ones,
                        zeros)
    return out


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_window_is_the_same_pixels_as_the_whole_image_decoded(kind):
    data = KINDS[kind]
    for channels in (1, 3, 4):
        whole = window_pixels(data, (0, 0, HEIGHT, WIDTH), channels)
        for window in WINDOWS:
            y0, x0, h, w = window
            got = window_pixels(data, window, channels)
            assert np.array_equal(got, whole[y0:y0 + h, x0:x0 + w]), (kind, channels, window)
        if channels == 4:
            assert (whole[..., 3] == 255).all()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_whole_image_is_within_a_level_or_two_of_pillow(kind):
    data = KINDS[kind]
    for channels, mode in ((1, "L"), (3, "RGB")):
        want = np.asarray(PILImage.open(io.BytesIO(data)).convert(mode)).reshape(HEIGHT, WIDTH, channels)
        got = window_pixels(data, (0, 0, HEIGHT, WIDTH), channels, fast_dct=False).astype(int)
        difference = np.abs(got - want)
        # CMYK to gray: Pillow takes the luma of its own RGB with other weights and truncations
        assert difference.mean() < (1.5 if kind == "cmyk" else 0.6) and difference.max() <= 8, (kind, channels)


def rows(spec: Image, data: bytes, decoder: str, monkeypatch, count=6) -> np.ndarray:
    """``count`` records of ``data`` decoded by ``spec`` (their own random crops and flips) through ``decoder``."""
    with monkeypatch.context() as patch:
        if decoder == "simplejpeg":
            patch.setattr(image_module, "_jpeg", None)
        parser = ExampleParser({"image": spec}, seed=7)
    record = encode_example({"image/encoded": data})
    return parser.parse([record] * count, ids=[(0, 0, i) for i in range(count)])["image"]


SPECS = [Image(size=(64, 64)), Image(size=(32, 48), resize="random_resized_crop", flip=True),
         Image(size=(16, 16), resize="random_resized_crop", area=(0.01, 0.05)),      # smaller than an iMCU, 1/8
         Image(size=(100, 100), resize="pad"), Image(size=(HEIGHT, WIDTH), resize=None),
         Image(size=(20, 20), dtype="float32", mean=(120, 110, 100), std=(60, 50, 40), antialias=True),
         Image(size=(24, 24), channels=1, dtype="uint16"), Image(size=(30, 30), channels=4, fast_dct=False),
         Image(size=(40, 40), dct_scaling=False, dtype="bfloat16")]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_batch_rows_match_simplejpegs_whole_image_path(kind, monkeypatch):
    for spec in SPECS:
        window = rows(spec, KINDS[kind], "window", monkeypatch).astype(np.float64)
        whole = rows(spec, KINDS[kind], "simplejpeg", monkeypatch).astype(np.float64)
        level = 1.0 if spec.dtype in ("uint8", "bfloat16") else 257.0 if spec.dtype == "uint16" else 1 / 50
        difference = np.abs(window - whole) / level
        # bfloat16 keeps 8 bits: a level's difference before rounding can be two after. simplejpeg's CMYK is a
        # level brighter than c k / 255 rounded (which Pillow's CMYK gives, and TensorFlow's truncated)
        assert difference.max() <= 2 and difference.mean() < (1.05 if kind == "cmyk" else 0.05), (kind, spec)


def test_large_photos_decode_at_each_dct_scale_like_the_whole_image(monkeypatch):
    data = simplejpeg.encode_jpeg(photo(768, 1024, seed=2), quality=90, colorsubsampling="420")
    for spec in (Image(size=(224, 224)), Image(size=(224, 224), resize="random_resized_crop", flip=True),
                 Image(size=(64, 64)), Image(size=(160, 96), resize="random_resized_crop")):
        window = rows(spec, data, "window", monkeypatch, count=16).astype(int)
        whole = rows(spec, data, "simplejpeg", monkeypatch, count=16).astype(int)
        assert np.abs(window - whole).max() <= 1, spec


def test_broken_jpegs_are_bad_images_with_libjpegs_message():
    decoder = image_module.ImageDecoder(Image(size=(8, 8)), 0, 0)
    out = np.zeros((8, 8, 3), np.uint8)
    data = KINDS["baseline 420"]
    sos = data.find(b"\xff\xda")
    cases = {data[:len(data) // 2]: "a broken JPEG: Premature end of JPEG file",
             data[:sos] + b"\x00\x01" + data[sos:]: "a broken JPEG header: Corrupt JPEG data: 2 extraneous bytes",
             data[:200]: "a broken JPEG header: ",
             b"\xff\xd8\xff\xe0" + bytes(40): "a broken JPEG header: "}
    for value, message in cases.items():
        with pytest.raises(image_module.BadImage) as raised:
            decoder.decode(value, out)
        assert raised.value.found.startswith(message), raised.value.found
    decoder.decode(data, out)                      # the decoder is whole after each failure


def test_max_pixels_is_checked_before_a_buffer_is_sized():
    data = bytearray(KINDS["baseline 420"])
    sof = data.find(b"\xff\xc0")
    data[sof + 5:sof + 9] = (60000).to_bytes(2, "big") + (60000).to_bytes(2, "big")     # 60000 x 60000 declared
    decoder = image_module.ImageDecoder(Image(size=(8, 8)), 0, 0)
    with pytest.raises(image_module.BadImage, match="a 60000x60000 image, more than max_pixels"):
        decoder.decode(bytes(data), np.zeros((8, 8, 3), np.uint8))
    assert decoder._window.buffer_bytes == 0


def test_the_window_buffer_is_bounded_by_the_window_and_freed_past_keep_bytes(monkeypatch):
    decoder = _jpeg.WindowDecoder()
    data = KINDS["baseline 420"]
    ones, zeros = np.ones(3, np.float32), np.zeros(3, np.float32)
    out = np.zeros((10, 10, 3), np.uint8)
    decoder.header(data)
    decoder.decode_into(data, HEIGHT, WIDTH, 1, 40, 50, 10, 10, out, 0, 0, 10, 10, 0, False, False, True, ones, zeros)
    assert 0 < decoder.buffer_bytes <= 10 * (10 + 4 + 32 + 4) * 4
    monkeypatch.setattr(_jpeg, "KEEP_BYTES", 100)
    decoder.decode_into(data, HEIGHT, WIDTH, 1, 40, 50, 10, 10, out, 0, 0, 10, 10, 0, False, False, True, ones, zeros)
    assert decoder.buffer_bytes == 0


def test_decode_into_checks_what_it_is_given():
    decoder = _jpeg.WindowDecoder()
    data = KINDS["baseline 420"]
    ones, zeros = np.ones(3, np.float32), np.zeros(3, np.float32)
    out = np.zeros((10, 10, 3), np.uint8)
    decoder.header(data)
    good = dict(height=HEIGHT, width=WIDTH, denom=1, y0=0, x0=0, crop_h=10, crop_w=10, out=out, top=0, left=0,
                out_h=10, out_w=10, out_kind=0, flip=False, antialias=False, fast_dct=True, scale=ones, bias=zeros)
    for change, message in [({"y0": HEIGHT - 5}, "window"), ({"crop_w": WIDTH + 1}, "window"),
                            ({"denom": 3}, "denom"), ({"top": 1}, "placement"), ({"out": out[:, ::2]}, "out must"),
                            ({"scale": np.ones(4, np.float32)}, "scale and bias"),
                            ({"bias": np.zeros(3)}, "scale and bias")]:
        with pytest.raises(ValueError, match=message):
            decoder.decode_into(data, **{**good, **change})
    with pytest.raises(_jpeg.JpegError, match="no bytes"):
        decoder.decode_into(b"", **good)


def test_decoders_of_their_own_decode_in_threads_at_once_and_a_shared_one_refuses_a_second_thread():
    data = simplejpeg.encode_jpeg(photo(384, 512, seed=3), quality=90)
    ones, zeros = np.ones(3, np.float32), np.zeros(3, np.float32)
    want = np.zeros((64, 64, 3), np.uint8)
    _jpeg.WindowDecoder().decode_into(data, 384, 512, 2, 10, 20, 300, 400, want, 0, 0, 64, 64, 0, False, False, True,
                                      ones, zeros)
    shared, outcomes = _jpeg.WindowDecoder(), []

    def work(decoder):
        for _ in range(40):
            out = np.zeros((64, 64, 3), np.uint8)
            try:
                decoder.decode_into(data, 384, 512, 2, 10, 20, 300, 400, out, 0, 0, 64, 64, 0, False, False, True,
                                    ones, zeros)
            except RuntimeError as e:
                outcomes.append(str(e))
            else:
                outcomes.append(np.array_equal(out, want))

    for decoders in ([_jpeg.WindowDecoder(), _jpeg.WindowDecoder()], [shared, shared]):
        outcomes.clear()
        threads = [threading.Thread(target=work, args=(d,)) for d in decoders]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(outcomes) == 80
        refused = [o for o in outcomes if isinstance(o, str)]
        assert all(o is True for o in outcomes if not isinstance(o, str))
        assert all(o == "a WindowDecoder decodes one image at a time: give each thread its own" for o in refused)
        if decoders[0] is not decoders[1]:
            assert not refused
