/* Fixed-point bilinear resampling of 8-bit RGB: see _bilinear_u8.h. */
#include "_bilinear_u8.h"

#include <math.h>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define INFEED_BILINEAR_AVX2 1
#else
#define INFEED_BILINEAR_AVX2 0
#endif

#define VERTICAL_ONE 32768      /* the vertical weight's 1 (Q15) */
#define HORIZONTAL_ONE 16384    /* the horizontal weights' 1 (Q14) */
#define SHIFT 21                /* Q7 values times Q14 weights: Q21 */

/* Taps: 16 int16 per vector of two output pixels, pixel i in lane (i >> 2) & 1 of vector (i >> 3) * 4 + (i & 3):
 * the AVX2 pass makes 8 pixels from 4 vectors, pixels i and i + 4 in the two lanes of one. A lane holds the two
 * weights of each channel side by side, (w0, w1, w0, w1, w0, w1, 0, 0), as pmaddwd takes them. */
static size_t tap_index(int i) {
    return 16 * ((size_t)(i >> 3) * 4 + (size_t)(i & 3)) + 8 * (size_t)((i >> 2) & 1);
}

size_t infeed_bilinear_u8_taps_size(int n) {
    return 16 * 4 * (size_t)((n + 7) / 8);
}

void infeed_bilinear_u8_taps(int n, const float *w1, int16_t *taps) {
    const size_t size = infeed_bilinear_u8_taps_size(n);
    for (size_t k = 0; k < size; k++)
        taps[k] = 0;
    for (int i = 0; i < n; i++) {
        long b = lrintf(w1[i] * HORIZONTAL_ONE);
        b = b < 0 ? 0 : (b > HORIZONTAL_ONE ? HORIZONTAL_ONE : b);
        int16_t *t = taps + tap_index(i);
        for (int c = 0; c < 3; c++) {
            t[2 * c] = (int16_t)(HORIZONTAL_ONE - b);
            t[2 * c + 1] = (int16_t)b;
        }
    }
}

static int simd = -1;       /* -1: not yet asked; 1: AVX2; 0: the portable code */

static int use_avx2(void) {
#if INFEED_BILINEAR_AVX2
    if (simd < 0)
        simd = __builtin_cpu_supports("avx2") ? 1 : 0;
    return simd;
#else
    return 0;
#endif
}

int infeed_bilinear_u8_set_simd(int enabled) {
    int before = use_avx2();
#if INFEED_BILINEAR_AVX2
    simd = enabled && __builtin_cpu_supports("avx2") ? 1 : 0;
#else
    (void)enabled;
#endif
    return before;
}

const char *infeed_bilinear_u8_impl(void) {
    return use_avx2() ? "avx2" : "portable";
}

/* --- the vertical pass ------------------------------------------------------------------------------------- */
/* col[i] for i in [i, n): what mulhrs computes, (d w1 + 2^14) >> 15 with an arithmetic shift, in a loop the
 * compiler can vectorise (p and q may be the same row: neither is written). */
static void vertical_portable(const uint8_t *restrict p, const uint8_t *restrict q, int w1, ptrdiff_t i,
                              ptrdiff_t n, int16_t *restrict col) {
    for (; i < n; i++)
        col[i] = (int16_t)(p[i] * 128 + (((q[i] - p[i]) * 128 * w1 + (1 << 14)) >> 15));
}

#if INFEED_BILINEAR_AVX2
__attribute__((target("avx2"))) static ptrdiff_t vertical_avx2(const uint8_t *restrict p, const uint8_t *restrict q,
                                                               int w1, ptrdiff_t n, int16_t *restrict col) {
    const __m256i w = _mm256_set1_epi16((short)w1);
    ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + i)));
        __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(q + i)));
        __m256i d = _mm256_slli_epi16(_mm256_sub_epi16(b, a), 7);
        _mm256_storeu_si256((__m256i *)(col + i), _mm256_add_epi16(_mm256_slli_epi16(a, 7), _mm256_mulhrs_epi16(d, w)));
    }
    return i;
}
#endif

void infeed_bilinear_u8_vertical(const uint8_t *p, const uint8_t *q, float w1, ptrdiff_t n, int16_t *col) {
    long w = lrintf(w1 * VERTICAL_ONE);
    if (w <= 0) {
        w = 0;
        q = p;
    } else if (w >= VERTICAL_ONE) {      /* beyond int16: q alone */
        w = 0;
        p = q;
    }
    ptrdiff_t i = 0;
#if INFEED_BILINEAR_AVX2
    if (use_avx2())
        i = vertical_avx2(p, q, (int)w, n, col);
#endif
    vertical_portable(p, q, (int)w, i, n, col);
}

/* --- the horizontal pass ----------------------------------------------------------------------------------- */
#if INFEED_BILINEAR_AVX2
/* 8 pixels an iteration: 4 vectors of two pixels (i + k and i + k + 4 in its lanes), each a 16-byte load at its
 * source pixel shuffled into (a, b) pairs per channel, multiplied and summed with pmaddwd; rounded, shifted,
 * packed to bytes, the 4th byte of each pixel squeezed out, and stored as 24 bytes. */
__attribute__((target("avx2"))) static int horizontal_avx2(const int16_t *restrict col, int n,
                                                           const ptrdiff_t *restrict offsets,
                                                           const int16_t *restrict taps, uint8_t *restrict out) {
    const __m256i pairs = _mm256_setr_epi8(0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11, -1, -1, -1, -1,
                                           0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11, -1, -1, -1, -1);
    const __m256i squeeze = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
                                             0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    const __m256i together = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7);
    const __m256i half = _mm256_set1_epi32(1 << (SHIFT - 1));
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v[4];
        for (int k = 0; k < 4; k++) {
            __m256i s = _mm256_loadu2_m128i((const __m128i *)(col + offsets[i + k + 4]),
                                            (const __m128i *)(col + offsets[i + k]));
            __m256i t = _mm256_loadu_si256((const __m256i *)(taps + 16 * ((size_t)(i >> 1) + (size_t)k)));
            v[k] = _mm256_srai_epi32(_mm256_add_epi32(_mm256_madd_epi16(_mm256_shuffle_epi8(s, pairs), t), half),
                                     SHIFT);
        }
        __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
        bytes = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(bytes, squeeze), together);
        _mm_storeu_si128((__m128i *)(out + 3 * (size_t)i), _mm256_castsi256_si128(bytes));
        _mm_storel_epi64((__m128i *)(out + 3 * (size_t)i + 16), _mm256_extracti128_si256(bytes, 1));
    }
    return i;
}
#endif

void infeed_bilinear_u8_horizontal(const int16_t *col, int n, const ptrdiff_t *offsets, const int16_t *taps,
                                   uint8_t *out) {
    int i = 0;
#if INFEED_BILINEAR_AVX2
    if (use_avx2())
        i = horizontal_avx2(col, n, offsets, taps, out);
#endif
    for (; i < n; i++) {
        const int16_t *restrict a = col + offsets[i];
        const int16_t *restrict t = taps + tap_index(i);
        const int32_t w0 = t[0], w1 = t[1];
        uint8_t *restrict o = out + 3 * (size_t)i;
        for (int c = 0; c < 3; c++) {
            int32_t v = (a[c] * w0 + a[c + 3] * w1 + (1 << (SHIFT - 1))) >> SHIFT;
            o[c] = (uint8_t)(v > 255 ? 255 : v);
        }
    }
}
