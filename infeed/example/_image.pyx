# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The image stage's kernel: crop, resize, flip, normalise and cast in one pass, into a row of a batch.

``resize_into`` reads a window ``[y0, y0 + height) x [x0, x0 + width)`` of a
decoded image (fractional bounds: the window of a crop after the decoder's DCT
scaling), resamples it to ``out_h x out_w`` pixels placed at ``(top, left)`` of
the output row, mirrored left to right when asked, and writes
``value * scale[c] + bias[c]`` cast to the row's dtype (integers rounded to
nearest, halves up, and clamped; float16 and bfloat16 rounded to nearest even).

Resampling is separable with half-pixel centres, as ``tf.image.resize``: a
triangle filter of radius one source pixel (bilinear, 2 taps per axis), or with
``antialias`` of radius ``max(1, source pixels per output pixel)`` (what
``tf.image.resize(..., antialias=True)`` and Pillow's bilinear do when
shrinking). Taps that fall outside the image are dropped and the others
renormalised (an edge pixel repeats, as TensorFlow clamps).

8-bit RGB into uint8 with neither scale nor bias, bilinear (a crop of a decoded
JPEG as most models take it), is resampled in fixed point instead
(``_bilinear_u8.c``, half the float kernel's time): the same values rounded, or
one level off where the float value lies within 0.02 of a half.

Bounds: the window is checked against the image and the placement against the
row before anything is read or written; every tap index is clamped into the
image when the taps are computed, so the loops need no checks of their own.
"""

from libc.math cimport floor, ceil, fabs
from libc.stdint cimport int8_t, int16_t, uint8_t, uint16_t, uint32_t
from libc.stdlib cimport calloc, malloc, free
from libc.string cimport memcpy

from infeed.example.halves cimport bfloat16_bits, float16_bits

import numpy as np
cimport numpy as cnp

cnp.import_array()

# Output element types.
DEF OUT_U8 = 0
DEF OUT_U16 = 1
DEF OUT_F32 = 2
DEF OUT_F16 = 3
DEF OUT_BF16 = 4
DEF OUT_I8 = 5
DEF OUT_I16 = 6

OUTPUT_TYPES = {"uint8": OUT_U8, "uint16": OUT_U16, "float32": OUT_F32, "float16": OUT_F16, "bfloat16": OUT_BF16,
                "int8": OUT_I8, "int16": OUT_I16}
#: The same by numpy's type number, for numpy's own types.
_NUMPY_OUTPUT_TYPES = {np.dtype(name).num: kind for name, kind in OUTPUT_TYPES.items() if name != "bfloat16"}


cdef struct Axis:
    int n                  # output pixels
    int max_taps           # stride of weights
    int *first             # per output pixel: first source index
    int *count             # per output pixel: taps used
    float *weights         # per output pixel: max_taps weights (normalised)
    Py_ssize_t *offsets    # pair_plan: per output position, its first source pixel's offset in floats (mirrored)
    float *taps            # pair_plan: per output position, its two weights times each channel's scale


cdef void bilinear_taps(Axis *ax, double start, double scale, int first, int last) noexcept nogil:
    """``axis_taps`` where the support is one source pixel: the two pixels around each output pixel's centre,
    weighted by distance (the same taps the general loop finds, without its search and normalisation)."""
    cdef int i, k, lo
    cdef double at, f
    cdef float *w
    for i in range(ax.n):
        at = start + (i + 0.5) * scale - 0.5             # the centre, in the coordinates of pixel centres
        lo = <int>floor(at)
        f = at - lo
        if lo < first:                                    # before the window's first pixel: that pixel alone
            lo, f = first, 0.0
        elif lo >= last:                                  # at or past its last: that pixel alone
            lo, f = last, 0.0
        w = ax.weights + i * ax.max_taps
        for k in range(ax.max_taps):
            w[k] = 0.0
        w[0] = <float>(1.0 - f)
        w[1] = <float>f
        ax.first[i] = lo
        ax.count[i] = 2 if f > 0.0 else 1


cdef int axis_taps(Axis *ax, double start, double length, int n_out, int n_src, bint antialias) noexcept nogil:
    """The taps of ``n_out`` output pixels resampling ``[start, start + length)`` of ``n_src`` pixels: only
    the pixels the window covers (a crop's edge pixel repeats, as when the crop is cut out first)."""
    cdef double scale = length / n_out                   # source pixels per output pixel
    cdef double support = scale if antialias and scale > 1.0 else 1.0
    cdef double centre, w, total
    cdef int i, j, lo, hi, k
    cdef int first = <int>floor(start + 1e-6), last = <int>ceil(start + length - 1e-6) - 1
    if first < 0:
        first = 0
    if last > n_src - 1:
        last = n_src - 1
    ax.n = n_out
    ax.max_taps = <int>ceil(2.0 * support) + 2
    ax.first = <int *>malloc(sizeof(int) * n_out)
    ax.count = <int *>malloc(sizeof(int) * n_out)
    ax.weights = <float *>malloc(sizeof(float) * n_out * ax.max_taps)
    if ax.first == NULL or ax.count == NULL or ax.weights == NULL:
        return -1
    if support == 1.0:
        bilinear_taps(ax, start, scale, first, last)
        return 0
    for i in range(n_out):
        centre = start + (i + 0.5) * scale               # in source coordinates, pixel j spans [j, j + 1)
        lo = <int>floor(centre - support - 0.5)
        hi = <int>ceil(centre + support - 0.5)
        if lo < first:
            lo = first
        if hi > last:
            hi = last
        if hi - lo + 1 > ax.max_taps:
            hi = lo + ax.max_taps - 1
        total = 0.0
        k = 0
        for j in range(lo, hi + 1):
            w = 1.0 - fabs(j + 0.5 - centre) / support
            if w < 0.0:
                w = 0.0
            ax.weights[i * ax.max_taps + k] = <float>w
            total += w
            k += 1
        if total <= 0.0:                                  # the centre lies beyond an edge: take the edge pixel
            j = lo if centre - 0.5 < lo else hi
            ax.first[i] = j
            ax.count[i] = 1
            ax.weights[i * ax.max_taps] = 1.0
            for k in range(1, ax.max_taps):
                ax.weights[i * ax.max_taps + k] = 0.0
            continue
        while k > 1 and ax.weights[i * ax.max_taps + k - 1] == 0.0:
            k -= 1
        j = 0
        while j < k - 1 and ax.weights[i * ax.max_taps + j] == 0.0:
            j += 1
        ax.first[i] = lo + j
        ax.count[i] = k - j
        for k in range(ax.max_taps):          # the taps past count weigh 0 (the 2-tap loops read them)
            ax.weights[i * ax.max_taps + k] = <float>(ax.weights[i * ax.max_taps + j + k] / total) \
                if k < ax.count[i] else 0.0
    return 0


cdef void free_axis(Axis *ax) noexcept nogil:
    free(ax.first)
    free(ax.count)
    free(ax.weights)
    free(ax.offsets)
    free(ax.taps)


cdef bint pair_plan(Axis *xs, int channels, bint flip, const float *scale) noexcept nogil:
    """``xs.offsets`` and ``xs.taps`` for ``infeed_horizontal_pairs`` when no output pixel has more than two
    taps (bilinear; ``xs.first`` relative to the window): False, planning nothing, otherwise. The taps of output
    positions ``2j`` and ``2j + 1`` lie together, 16 floats: the first weights of both, then the second ones."""
    cdef int i, x, c
    cdef float *t
    for x in range(xs.n):
        if xs.count[x] > 2:
            return False
    xs.offsets = <Py_ssize_t *>malloc(sizeof(Py_ssize_t) * xs.n)
    xs.taps = <float *>calloc(<size_t>(xs.n + 1) * 8, sizeof(float))
    if xs.offsets == NULL or xs.taps == NULL:
        return False
    for i in range(xs.n):
        x = xs.n - 1 - i if flip else i
        xs.offsets[i] = <Py_ssize_t>xs.first[x] * channels
        t = xs.taps + 16 * (i >> 1) + 4 * (i & 1)
        for c in range(channels):
            t[c] = xs.weights[x * xs.max_taps] * scale[c]
            t[8 + c] = xs.weights[x * xs.max_taps + 1] * scale[c]
    return True


cdef extern from "_bilinear_u8.h":
    size_t bilinear_u8_taps_size "infeed_bilinear_u8_taps_size"(int n) noexcept nogil
    void bilinear_u8_taps "infeed_bilinear_u8_taps"(int n, const float *w1, int16_t *taps) noexcept nogil
    void bilinear_u8_vertical "infeed_bilinear_u8_vertical"(const uint8_t *p, const uint8_t *q, float w1,
                                                            Py_ssize_t n, int16_t *col) noexcept nogil
    void bilinear_u8_horizontal "infeed_bilinear_u8_horizontal"(const int16_t *col, int n, const Py_ssize_t *offsets,
                                                                const int16_t *taps, uint8_t *out) noexcept nogil
    int bilinear_u8_set_simd "infeed_bilinear_u8_set_simd"(int enabled) noexcept nogil
    const char *bilinear_u8_impl "infeed_bilinear_u8_impl"() noexcept nogil


cdef extern from *:
    """
    #include <math.h>
    /* The vertical taps of one output row: column[i] = sum_k w[k] * src[k * stride + i]. Compiled for AVX2 too
       where the compiler can (picked at run time), as the loops over a row are where the time goes. */
    #if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
    #define INFEED_CLONES __attribute__((target_clones("avx2", "default")))
    #else
    #define INFEED_CLONES
    #endif
    #define INFEED_VERTICAL(NAME, T) \
    INFEED_CLONES static void NAME(const T *restrict src, Py_ssize_t stride, const float *restrict w, int taps, \
                                   Py_ssize_t n, float *restrict column) { \
        const T *restrict p = src; \
        const T *restrict q = src + stride; \
        float w0 = w[0], w1; \
        if (taps == 2) { \
            w1 = w[1]; \
            for (Py_ssize_t i = 0; i < n; i++) column[i] = w0 * (float)p[i] + w1 * (float)q[i]; \
            return; \
        } \
        for (Py_ssize_t i = 0; i < n; i++) column[i] = w0 * (float)p[i]; \
        for (int k = 1; k < taps; k++) { \
            const T *restrict r = src + k * stride; \
            float wk = w[k]; \
            for (Py_ssize_t i = 0; i < n; i++) column[i] += wk * (float)r[i]; \
        } \
    }
    /* Casts of a line of floats to integers, rounded half up and clamped, in the integer domain (which the
       compiler vectorises: the values are within the output's range but for a rounding overshoot). */
    #define INFEED_STORE(NAME, T, MAX) \
    INFEED_CLONES static void NAME(const float *restrict line, Py_ssize_t n, T *restrict dst) { \
        for (Py_ssize_t i = 0; i < n; i++) { \
            int v = (int)(line[i] + 0.5f); \
            v = v < 0 ? 0 : v; \
            dst[i] = (T)(v > MAX ? MAX : v); \
        } \
    }
    INFEED_STORE(infeed_store_u8, uint8_t, 255)
    INFEED_STORE(infeed_store_u16, uint16_t, 65535)
    /* The same into signed integers, whose values (normalised: mean and std) may lie anywhere: clamped as floats
       first (a NaN to the lowest), then rounded half up. */
    #define INFEED_STORE_SIGNED(NAME, T, MIN, MAX) \
    INFEED_CLONES static void NAME(const float *restrict line, Py_ssize_t n, T *restrict dst) { \
        for (Py_ssize_t i = 0; i < n; i++) { \
            float v = line[i] > (float)(MIN) ? line[i] : (float)(MIN); \
            v = v < (float)(MAX) ? v : (float)(MAX); \
            dst[i] = (T)(int)floorf(v + 0.5f); \
        } \
    }
    INFEED_STORE_SIGNED(infeed_store_i8, int8_t, -128, 127)
    INFEED_STORE_SIGNED(infeed_store_i16, int16_t, -32768, 32767)
    INFEED_VERTICAL(infeed_vertical_u8, uint8_t)
    INFEED_VERTICAL(infeed_vertical_u16, uint16_t)

    /* The horizontal taps of one output row of 3 or 4 channels, scaled, biased and mirrored when asked: each
       output pixel is one 4-float vector (SSE, in every x86-64), the sum of its taps' source pixels read 4 floats
       at a time, two taps at least (a tap past count weighs 0). With 3 channels the 4th lane spills into the next
       pixel's first float, which the next pixel (in increasing order of the output, hence the loop's direction
       when mirroring) then overwrites: ``line`` has one float more than its pixels, ``column`` two pixels and a
       float of zeros. */
    #if defined(__SSE2__)
    #include <emmintrin.h>
    static inline __m128 infeed_taps(const float *restrict q, const float *restrict w, int count, int channels) {
        __m128 acc = _mm_add_ps(_mm_mul_ps(_mm_set1_ps(w[0]), _mm_loadu_ps(q)),
                                _mm_mul_ps(_mm_set1_ps(w[1]), _mm_loadu_ps(q + channels)));
        if (__builtin_expect(count != 2, 0)) {      /* weights past count are 0: count 1 reads one more pixel */
            for (int k = 2; k < count; k++)
                acc = _mm_add_ps(acc, _mm_mul_ps(_mm_set1_ps(w[k]), _mm_loadu_ps(q + k * channels)));
        }
        return acc;
    }
    static void infeed_horizontal_vec(const float *restrict column, int channels, int n, const int *restrict first,
                                      const int *restrict count, const float *restrict weights, int max_taps,
                                      int flip, const float *restrict scale, const float *restrict bias,
                                      float *restrict line) {
        __m128 s = _mm_setr_ps(scale[0], scale[1], scale[2], channels == 4 ? scale[3] : 0.0f);
        __m128 b = _mm_setr_ps(bias[0], bias[1], bias[2], channels == 4 ? bias[3] : 0.0f);
        if (flip) {
            for (int i = 0; i < n; i++) {
                int x = n - 1 - i;
                __m128 acc = infeed_taps(column + (Py_ssize_t)first[x] * channels,
                                         weights + (Py_ssize_t)x * max_taps, count[x], channels);
                _mm_storeu_ps(line + (Py_ssize_t)i * channels, _mm_add_ps(_mm_mul_ps(acc, s), b));
            }
        } else {
            for (int x = 0; x < n; x++) {
                __m128 acc = infeed_taps(column + (Py_ssize_t)first[x] * channels,
                                         weights + (Py_ssize_t)x * max_taps, count[x], channels);
                _mm_storeu_ps(line + (Py_ssize_t)x * channels, _mm_add_ps(_mm_mul_ps(acc, s), b));
            }
        }
    }
    /* The same for two taps at most per output pixel (bilinear), with each pixel's two weights already
       multiplied by the channels' scales (``taps``, see pair_plan) and its source offset already mirrored
       (``offsets``, in floats): two loads, two multiplies and adds, a store. With AVX2, two output pixels an
       iteration in the two halves of 8-float vectors, packed together (3 channels) before one store, which
       writes two floats past them (``line`` has room for them; the next pair overwrites them). */
    static inline __m128 infeed_pair(const float *restrict column, int channels, Py_ssize_t offset,
                                     const float *restrict t) {
        const float *restrict q = column + offset;
        return _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(t), _mm_loadu_ps(q)),
                          _mm_mul_ps(_mm_loadu_ps(t + 8), _mm_loadu_ps(q + channels)));
    }
    #if defined(__GNUC__) && defined(__x86_64__)
    #include <immintrin.h>
    #define INFEED_PAIRS_AVX2 1
    __attribute__((target("avx2"))) static int infeed_horizontal_pairs_avx2(
            const float *restrict column, int channels, int n, const Py_ssize_t *restrict offsets,
            const float *restrict taps, __m128 b, float *restrict line) {
        const __m256 b2 = _mm256_set_m128(b, b);
        const __m256i pack = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7);
        int i = 0;
        for (; i + 1 < n; i += 2) {
            const float *restrict q0 = column + offsets[i];
            const float *restrict q1 = column + offsets[i + 1];
            const float *restrict t = taps + 8 * (Py_ssize_t)i;
            __m256 a = _mm256_loadu2_m128(q1, q0);
            __m256 c = _mm256_loadu2_m128(q1 + channels, q0 + channels);
            __m256 acc = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(t), a),
                                                     _mm256_mul_ps(_mm256_loadu_ps(t + 8), c)), b2);
            if (channels == 3)
                acc = _mm256_permutevar8x32_ps(acc, pack);
            _mm256_storeu_ps(line + (Py_ssize_t)i * channels, acc);
        }
        return i;
    }
    #else
    #define INFEED_PAIRS_AVX2 0
    #endif
    static void infeed_horizontal_pairs(const float *restrict column, int channels, int n,
                                        const Py_ssize_t *restrict offsets, const float *restrict taps,
                                        const float *restrict bias, float *restrict line) {
        __m128 b = _mm_setr_ps(bias[0], bias[1], bias[2], channels == 4 ? bias[3] : 0.0f);
        int i = 0;
    #if INFEED_PAIRS_AVX2
        static int avx2 = -1;
        if (avx2 < 0)
            avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
        if (avx2)
            i = infeed_horizontal_pairs_avx2(column, channels, n, offsets, taps, b, line);
    #endif
        for (; i < n; i++) {
            __m128 acc = infeed_pair(column, channels, offsets[i], taps + 16 * (Py_ssize_t)(i >> 1) + 4 * (i & 1));
            _mm_storeu_ps(line + (Py_ssize_t)i * channels, _mm_add_ps(acc, b));
        }
    }
    #define INFEED_HORIZONTAL_VEC 1
    #else
    static void infeed_horizontal_pairs(const float *column, int channels, int n, const Py_ssize_t *offsets,
                                        const float *taps, const float *bias, float *line) {}
    static void infeed_horizontal_vec(const float *column, int channels, int n, const int *first, const int *count,
                                      const float *weights, int max_taps, int flip, const float *scale,
                                      const float *bias, float *line) {}
    #define INFEED_HORIZONTAL_VEC 0
    #endif
    """
    void store_u8 "infeed_store_u8"(const float *line, Py_ssize_t n, uint8_t *dst) noexcept nogil
    void store_u16 "infeed_store_u16"(const float *line, Py_ssize_t n, uint16_t *dst) noexcept nogil
    void store_i8 "infeed_store_i8"(const float *line, Py_ssize_t n, int8_t *dst) noexcept nogil
    void store_i16 "infeed_store_i16"(const float *line, Py_ssize_t n, int16_t *dst) noexcept nogil
    void vertical_u8 "infeed_vertical_u8"(const uint8_t *src, Py_ssize_t stride, const float *w, int taps,
                                          Py_ssize_t n, float *column) noexcept nogil
    void vertical_u16 "infeed_vertical_u16"(const uint16_t *src, Py_ssize_t stride, const float *w, int taps,
                                            Py_ssize_t n, float *column) noexcept nogil
    bint HORIZONTAL_VEC "INFEED_HORIZONTAL_VEC"
    void horizontal_pairs "infeed_horizontal_pairs"(const float *column, int channels, int n,
                                                    const Py_ssize_t *offsets, const float *taps,
                                                    const float *bias, float *line) noexcept nogil
    void horizontal_vec "infeed_horizontal_vec"(const float *column, int channels, int n, const int *first,
                                                const int *count, const float *weights, int max_taps, int flip,
                                                const float *scale, const float *bias, float *line) noexcept nogil


cdef void store_line(const float *line, Py_ssize_t n, char *dst, int kind) noexcept nogil:
    """``dst[:n] = line[:n]`` cast to ``kind`` (integers clamped and rounded half up)."""
    cdef Py_ssize_t i
    cdef uint32_t bits
    if kind == OUT_U8:
        store_u8(line, n, <uint8_t *>dst)
    elif kind == OUT_U16:
        store_u16(line, n, <uint16_t *>dst)
    elif kind == OUT_F32:
        memcpy(dst, line, n * sizeof(float))
    elif kind == OUT_I8:
        store_i8(line, n, <int8_t *>dst)
    elif kind == OUT_I16:
        store_i16(line, n, <int16_t *>dst)
    elif kind == OUT_BF16:
        for i in range(n):
            memcpy(&bits, &line[i], 4)
            (<uint16_t *>dst)[i] = bfloat16_bits(bits)
    else:
        for i in range(n):
            memcpy(&bits, &line[i], 4)
            (<uint16_t *>dst)[i] = float16_bits(bits)


ctypedef fused pixel_t:
    uint8_t
    uint16_t


cdef bint resample_bilinear_u8(const uint8_t *src, Py_ssize_t src_stride, Axis *ys, Axis *xs, Py_ssize_t width,
                               char *out, Py_ssize_t out_stride, bint flip) noexcept nogil:
    """``resample`` of 8-bit RGB into uint8, unscaled, in fixed point (``_bilinear_u8.h``) where no output pixel
    has more than two taps on either axis: False, having written nothing, otherwise (or short of memory).
    ``src`` points at the window's first column, ``xs.first`` is relative to it."""
    cdef int x, y, i
    for y in range(ys.n):
        if ys.count[y] > 2:
            return False
    for x in range(xs.n):
        if xs.count[x] > 2:
            return False
    cdef Py_ssize_t *offsets = <Py_ssize_t *>malloc(sizeof(Py_ssize_t) * xs.n)
    cdef float *w1 = <float *>malloc(sizeof(float) * xs.n)
    cdef int16_t *taps = <int16_t *>malloc(sizeof(int16_t) * bilinear_u8_taps_size(xs.n))
    cdef int16_t *column = <int16_t *>calloc(width + 16, sizeof(int16_t))     # zeros past it: see the header
    cdef bint planned = offsets != NULL and w1 != NULL and taps != NULL and column != NULL
    cdef const uint8_t *p
    if planned:
        for i in range(xs.n):
            x = xs.n - 1 - i if flip else i
            offsets[i] = <Py_ssize_t>xs.first[x] * 3
            w1[i] = xs.weights[x * xs.max_taps + 1] if xs.count[x] == 2 else 0.0
        bilinear_u8_taps(xs.n, w1, taps)
        for y in range(ys.n):
            p = src + ys.first[y] * src_stride
            if ys.count[y] == 2:
                bilinear_u8_vertical(p, p + src_stride, ys.weights[y * ys.max_taps + 1], width, column)
            else:
                bilinear_u8_vertical(p, p, 0.0, width, column)
            bilinear_u8_horizontal(column, xs.n, offsets, taps, <uint8_t *>(out + y * out_stride))
    free(offsets)
    free(w1)
    free(taps)
    free(column)
    return planned


cdef bint unscaled(const float *scale, const float *bias, int channels) noexcept nogil:
    cdef int c
    for c in range(channels):
        if scale[c] != 1.0 or bias[c] != 0.0:
            return False
    return True


cdef void resample(const pixel_t *src, Py_ssize_t src_stride, int channels, Axis *ys, Axis *xs,
                   float *column, float *line, char *out, Py_ssize_t out_stride, int kind, bint flip,
                   const float *scale, const float *bias) noexcept nogil:
    """Per output row: the vertical taps over the window's columns into ``column`` (contiguous, vectorised),
    then the horizontal taps into ``line`` (scaled and biased, mirrored when asked), stored cast into ``out``;
    8-bit RGB into uint8, unscaled and bilinear, in fixed point instead (``resample_bilinear_u8``).
    ``xs.first`` is made relative to the window's first column here."""
    cdef int y, x, c, k, x_lo = xs.first[0], x_hi = 0
    cdef Py_ssize_t width, o
    cdef const pixel_t *p
    cdef const float *w
    cdef const float *q
    cdef float acc
    for x in range(xs.n):
        x_lo = xs.first[x] if xs.first[x] < x_lo else x_lo
        x_hi = xs.first[x] + xs.count[x] if xs.first[x] + xs.count[x] > x_hi else x_hi
    for x in range(xs.n):
        xs.first[x] -= x_lo
    width = <Py_ssize_t>(x_hi - x_lo) * channels
    if pixel_t is uint8_t:
        if kind == OUT_U8 and channels == 3 and unscaled(scale, bias, channels) and \
                resample_bilinear_u8(src + x_lo * channels, src_stride, ys, xs, width, out, out_stride, flip):
            return
    cdef bint pairs = HORIZONTAL_VEC and channels >= 3 and pair_plan(xs, channels, flip, scale)
    for y in range(ys.n):
        p = src + ys.first[y] * src_stride + x_lo * channels
        w = ys.weights + y * ys.max_taps
        if pixel_t is uint8_t:
            vertical_u8(p, src_stride, w, ys.count[y], width, column)
        else:
            vertical_u16(p, src_stride, w, ys.count[y], width, column)
        if pairs:
            horizontal_pairs(column, channels, xs.n, xs.offsets, xs.taps, bias, line)
        elif HORIZONTAL_VEC and channels >= 3:
            horizontal_vec(column, channels, xs.n, xs.first, xs.count, xs.weights, xs.max_taps, flip, scale, bias,
                           line)
        else:
            for x in range(xs.n):
                w = xs.weights + x * xs.max_taps
                q = column + <Py_ssize_t>xs.first[x] * channels
                o = <Py_ssize_t>((xs.n - 1 - x) if flip else x) * channels
                for c in range(channels):
                    acc = 0.0
                    for k in range(xs.count[x]):
                        acc = acc + w[k] * q[channels * k + c]
                    line[o + c] = acc * scale[c] + bias[c]
        store_line(line, <Py_ssize_t>xs.n * channels, out + y * out_stride, kind)


def set_simd(bint enabled):
    """Whether the fixed-point kernel (8-bit RGB into uint8) uses AVX2 where the CPU has it (the default) or its
    portable code, which computes the same bytes; returns the setting before. For tests and benchmarks."""
    return bool(bilinear_u8_set_simd(enabled))


def fixed_point_impl():
    """``"avx2"`` or ``"portable"``: what the fixed-point kernel runs now."""
    return bilinear_u8_impl().decode()


cdef object _output_kind(cnp.ndarray out):
    """The OUT_* of ``out``'s dtype, or None (by type number for numpy's own types: ``dtype.name`` is slow)."""
    cdef int t = cnp.PyArray_TYPE(out)
    if not cnp.PyTypeNum_ISUSERDEF(t):
        return _NUMPY_OUTPUT_TYPES.get(t)
    return OUTPUT_TYPES.get(out.dtype.name)          # bfloat16 (ml_dtypes): a user-defined type


cdef object _per_channel(value, int channels):
    """``value`` as ``channels`` contiguous float32 (as it is when it already is: the decoder's own arrays)."""
    if type(value) is np.ndarray and value.dtype == np.float32 and value.shape == (channels,) \
            and value.flags.c_contiguous:
        return value
    return np.broadcast_to(np.asarray(value, np.float32), (channels,)).copy()


def resize_into(cnp.ndarray image not None, double y0, double x0, double height, double width,
                cnp.ndarray out not None, int top, int left, int out_h, int out_w, bint flip=False,
                bint antialias=False, scale=None, bias=None):
    """Resamples ``image[y0:y0+height, x0:x0+width]`` (``[H, W, C]`` uint8 or uint16) into
    ``out[top:top+out_h, left:left+out_w]`` (``[h, w, C]``, see the module's docstring)."""
    if image.ndim != 3 or out.ndim != 3 or image.shape[2] != out.shape[2]:
        raise ValueError(f"image {(<object>image).shape} and out {(<object>out).shape} must both be [H, W, C] "
                         f"with the same C")
    cdef int image_type = cnp.PyArray_TYPE(image)
    if image_type != cnp.NPY_UINT8 and image_type != cnp.NPY_UINT16:
        raise ValueError(f"image must be uint8 or uint16, got {image.dtype}")
    kind = _output_kind(out)
    if kind is None:
        raise ValueError(f"out must be one of {sorted(OUTPUT_TYPES)}, got {out.dtype}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(image) or not cnp.PyArray_IS_C_CONTIGUOUS(out) \
            or not cnp.PyArray_ISWRITEABLE(out):
        raise ValueError("image and out must be C-contiguous, out writable")
    cdef int src_h = image.shape[0], src_w = image.shape[1], channels = image.shape[2]
    if not (height > 0 and width > 0 and y0 >= 0 and x0 >= 0 and y0 + height <= src_h + 1e-6
            and x0 + width <= src_w + 1e-6):
        raise ValueError(f"window ({y0}, {x0}, {height}, {width}) is not inside the {src_h}x{src_w} image")
    if not (out_h > 0 and out_w > 0 and top >= 0 and left >= 0 and top + out_h <= out.shape[0]
            and left + out_w <= out.shape[1]):
        raise ValueError(f"placement ({top}, {left}, {out_h}, {out_w}) is not inside out {(<object>out).shape}")
    cdef cnp.ndarray s = _per_channel(1.0 if scale is None else scale, channels)
    cdef cnp.ndarray b = _per_channel(0.0 if bias is None else bias, channels)
    cdef Py_ssize_t out_stride = out.strides[0]
    cdef int item = out.dtype.itemsize
    cdef char *dst = <char *>cnp.PyArray_DATA(out) + top * out_stride + left * channels * item
    cdef const void *src = cnp.PyArray_DATA(image)
    cdef bint sixteen = image_type == cnp.NPY_UINT16
    cdef int out_kind = kind, done
    with nogil:
        done = resize_pixels(src, sixteen, src_h, src_w, channels, y0, x0, height, width, dst, out_stride, out_kind,
                             out_h, out_w, flip, antialias, <const float *>cnp.PyArray_DATA(s),
                             <const float *>cnp.PyArray_DATA(b))
    if done < 0:
        raise MemoryError()


cdef int resize_pixels(const void *src, bint sixteen, int src_h, int src_w, int channels, double y0, double x0,
                       double height, double width, char *dst, Py_ssize_t out_stride, int out_kind, int out_h,
                       int out_w, bint flip, bint antialias, const float *scales, const float *biases) noexcept nogil:
    """``resize_into`` on raw pixels (packed rows of ``src_w * channels`` uint8, or uint16 when ``sixteen``)
    whose window and placement the caller has checked: 0, or -1 short of memory. The JPEG decoder's way in."""
    cdef Axis ys, xs
    cdef float *column = NULL
    cdef float *line = NULL
    cdef int done = -1
    ys.first = ys.count = xs.first = xs.count = NULL
    ys.weights = xs.weights = ys.taps = xs.taps = NULL
    ys.offsets = xs.offsets = NULL
    if axis_taps(&ys, y0, height, out_h, src_h, antialias) == 0 and \
            axis_taps(&xs, x0, width, out_w, src_w, antialias) == 0:
        # zeros past the pixels: the horizontal loops read up to two pixels and a float beyond a last tap; and
        # they write up to two floats past a line's last pixel
        column = <float *>calloc(src_w * channels + 12, sizeof(float))
        line = <float *>malloc(sizeof(float) * (out_w * channels + 2))
        if column != NULL and line != NULL:
            if sixteen:
                resample(<const uint16_t *>src, <Py_ssize_t>src_w * channels, channels, &ys, &xs, column, line,
                         dst, out_stride, out_kind, flip, scales, biases)
            else:
                resample(<const uint8_t *>src, <Py_ssize_t>src_w * channels, channels, &ys, &xs, column, line,
                         dst, out_stride, out_kind, flip, scales, biases)
            done = 0
    free_axis(&ys)
    free_axis(&xs)
    free(column)
    free(line)
    return done
