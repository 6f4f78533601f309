# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A JPEG's crop window decoded and resized into a batch row: libjpeg-turbo's libjpeg API (``_jpeg_window.c``),
then the resize kernel of ``_image.pyx`` on the decoded rows, with no array made of them and without the GIL.

Only what the crop needs is decoded: at the DCT scale the caller picks, the whole iMCU columns around the
window (``jpeg_crop_scanline``) and its rows (``jpeg_skip_scanlines`` past those above it; those below are never
decoded). Two columns more on each side, where the image has them, keep the pixels the kernel reads the same as
in a decode of the whole image: libjpeg upsamples a window's edge column from that column alone.

Memory: a decoder holds libjpeg's decompress object (a few KiB) and a buffer of the last window's pixels,
``rows x (columns + 36) x 4`` bytes at most (4 for CMYK and RGBA, else the channels), kept between images up to
:data:`KEEP_BYTES` and freed after an image that needed more. While it decodes, libjpeg also holds the
image's own memory (a progressive file's coefficients: 2 bytes per coefficient of the whole image), freed before
the call returns. The caller bounds all of it by checking the header's pixels against ``max_pixels`` first.
"""

from libc.math cimport ceil, floor
from libc.stdint cimport uint8_t
from libc.stdlib cimport free, malloc

cimport numpy as cnp

from infeed.example._image cimport resize_pixels

cnp.import_array()

cdef extern from "_jpeg_window.h":
    ctypedef struct infeed_jpeg:
        pass
    ctypedef struct infeed_jpeg_header:
        int height, width, cmyk
    ctypedef struct infeed_jpeg_window:
        int channels, fast_dct, denom, y_lo, y_hi, x_lo, x_hi
    enum: ALIGN_SLACK "INFEED_JPEG_ALIGN_SLACK"
    infeed_jpeg *infeed_jpeg_new() nogil
    void infeed_jpeg_free(infeed_jpeg *j) nogil
    const char *infeed_jpeg_message(const infeed_jpeg *j) nogil
    int infeed_jpeg_scaled(int size, int denom) nogil
    int infeed_jpeg_read_header(infeed_jpeg *j, const uint8_t *data, size_t size, infeed_jpeg_header *header) nogil
    int infeed_jpeg_decode(infeed_jpeg *j, const uint8_t *data, size_t size, const infeed_jpeg_window *window,
                           uint8_t *out, size_t capacity, int *first_col, int *cols) nogil

#: The most bytes of window buffer a decoder keeps between images (a larger one is freed after its image).
KEEP_BYTES = 32 << 20
#: Columns decoded beyond each side of the window, where the image has them (see the module's docstring).
DEF EDGE = 2


class JpegError(ValueError):
    """libjpeg's message for a JPEG it cannot decode (corrupt data and a premature end included)."""


cdef class WindowDecoder:
    """One thread's JPEG decoder: ``header`` reads the size, ``decode_into`` decodes a window into a row."""

    cdef infeed_jpeg *_jpeg
    cdef uint8_t *_buffer
    cdef size_t _capacity
    cdef bint _cmyk
    cdef bint _busy          # set under the GIL around each call: one image at a time, whatever the threads

    def __cinit__(self):
        self._jpeg = infeed_jpeg_new()
        if self._jpeg == NULL:
            raise MemoryError()

    def __dealloc__(self):
        infeed_jpeg_free(self._jpeg)
        free(self._buffer)

    cdef _enter(self):
        if self._busy:
            raise RuntimeError("a WindowDecoder decodes one image at a time: give each thread its own")
        self._busy = True

    @property
    def buffer_bytes(self) -> int:
        """The window buffer's size now."""
        return self._capacity

    def header(self, const uint8_t[::1] data):
        """``(height, width)`` from the header; :class:`JpegError` if it is broken."""
        cdef infeed_jpeg_header h
        cdef int done
        if data.shape[0] == 0:
            raise JpegError("no bytes")
        self._enter()
        try:
            with nogil:
                done = infeed_jpeg_read_header(self._jpeg, &data[0], data.shape[0], &h)
        finally:
            self._busy = False
        if done < 0:
            raise JpegError(infeed_jpeg_message(self._jpeg).decode("utf-8", "replace"))
        self._cmyk = h.cmyk
        return h.height, h.width

    def decode_into(self, const uint8_t[::1] data, int height, int width, int denom, double y0, double x0,
                    double crop_h, double crop_w, cnp.ndarray out, int top, int left, int out_h, int out_w,
                    int out_kind, bint flip, bint antialias, bint fast_dct, cnp.ndarray scale, cnp.ndarray bias):
        """Decodes the window ``[y0, y0 + crop_h) x [x0, x0 + crop_w)`` (pixels of the ``height x width``
        image, read by ``header`` just before) at 1/``denom`` and resizes it into ``out[top:top + out_h,
        left:left + out_w]`` (``[h, w, C]``, C-contiguous, of the output kind ``out_kind``), mirrored if ``flip``,
        times ``scale`` plus ``bias`` (C float32 each). The caller has checked the window, the placement and
        the pixels against ``max_pixels``."""
        if data.shape[0] == 0:
            raise JpegError("no bytes")
        if out.ndim != 3 or not cnp.PyArray_IS_C_CONTIGUOUS(out) or not cnp.PyArray_ISWRITEABLE(out) \
                or out.shape[2] not in (1, 3, 4):
            raise ValueError("out must be a writable C-contiguous [H, W, C] array of 1, 3 or 4 channels")
        cdef int channels = out.shape[2]
        if not (out_h > 0 and out_w > 0 and top >= 0 and left >= 0 and top + out_h <= out.shape[0]
                and left + out_w <= out.shape[1]):
            raise ValueError(f"placement ({top}, {left}, {out_h}, {out_w}) is not inside out {(<object>out).shape}")
        if not (height > 0 and width > 0 and crop_h > 0 and crop_w > 0 and y0 >= 0 and x0 >= 0
                and y0 + crop_h <= height and x0 + crop_w <= width):
            raise ValueError(f"window ({y0}, {x0}, {crop_h}, {crop_w}) is not inside the {height}x{width} image")
        if denom not in (1, 2, 4, 8):
            raise ValueError(f"denom must be 1, 2, 4 or 8, not {denom}")
        for values in (scale, bias):
            if cnp.PyArray_TYPE(values) != cnp.NPY_FLOAT32 or values.shape[0] != channels \
                    or not cnp.PyArray_IS_C_CONTIGUOUS(values):
                raise ValueError(f"scale and bias must be {channels} contiguous float32")
        cdef int sh = infeed_jpeg_scaled(height, denom), sw = infeed_jpeg_scaled(width, denom)
        cdef double sy = <double>sh / height, sx = <double>sw / width
        cdef double wy = y0 * sy, wx = x0 * sx, wh = crop_h * sy, ww = crop_w * sx
        cdef infeed_jpeg_window window
        cdef int first_col = 0, cols = 0, done, rows
        window.channels, window.fast_dct, window.denom = channels, fast_dct, denom
        window.y_lo = max(0, <int>floor(wy + 1e-6))
        window.y_hi = min(sh, <int>ceil(wy + wh - 1e-6))
        window.x_lo = max(0, <int>floor(wx + 1e-6) - EDGE)
        window.x_hi = min(sw, <int>ceil(wx + ww - 1e-6) + EDGE)
        if window.y_hi <= window.y_lo:
            window.y_hi = window.y_lo + 1
        if window.x_hi <= window.x_lo:
            window.x_hi = window.x_lo + 1
        rows = window.y_hi - window.y_lo
        cdef size_t need = <size_t>rows * (window.x_hi - window.x_lo + ALIGN_SLACK + 2 * EDGE) * \
            (4 if self._cmyk or channels == 4 else channels)
        cdef Py_ssize_t out_stride = out.strides[0]
        cdef char *dst = <char *>cnp.PyArray_DATA(out) + top * out_stride + left * out.strides[1]
        cdef const float *scales = <const float *>cnp.PyArray_DATA(scale)
        cdef const float *biases = <const float *>cnp.PyArray_DATA(bias)
        self._enter()
        try:
            if need > self._capacity:
                free(self._buffer)
                self._capacity = 0
                self._buffer = <uint8_t *>malloc(need)
                if self._buffer == NULL:
                    raise MemoryError(f"{need} bytes for a JPEG window")
                self._capacity = need
            with nogil:
                done = infeed_jpeg_decode(self._jpeg, &data[0], data.shape[0], &window, self._buffer,
                                          self._capacity, &first_col, &cols)
                if done == 0:
                    done = 1 + resize_pixels(self._buffer, False, rows, cols, channels, wy - window.y_lo,
                                             wx - first_col, wh, ww, dst, out_stride, out_kind, out_h, out_w, flip,
                                             antialias, scales, biases)
        finally:
            self._busy = False
            if self._capacity > KEEP_BYTES:
                free(self._buffer)
                self._buffer, self._capacity = NULL, 0
        if done < 0:
            raise JpegError(infeed_jpeg_message(self._jpeg).decode("utf-8", "replace"))
        if done == 0:
            raise MemoryError("resizing a JPEG window")
