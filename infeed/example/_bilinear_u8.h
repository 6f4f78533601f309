/* Bilinear resampling of 8-bit RGB into 8-bit RGB in fixed point: the image stage's common case (a crop of a
 * decoded JPEG to uint8 with no normalisation), in half the work of the float kernel of _image.pyx.
 *
 * Per output row, the vertical pass blends two source rows into a line of int16 in 1/128ths of a level
 * (Q7): col = 128 p + round(128 (q - p) w1), w1 in 1/32768ths (AVX2's mulhrs). The horizontal pass blends two
 * pixels of that line with weights in 1/16384ths that sum to 16384 exactly: out = (a w0 + b w1 + 2^20) >> 21.
 * Both roundings together move a value by less than 0.02 of a level from the float kernel's, so an output
 * differs from it by one level at most, and only where the float value lies that close to a half.
 *
 * The AVX2 and the portable code compute the same integers (tests compare them): the AVX2 one is picked at run
 * time. Pure functions, safe without the GIL. */
#ifndef INFEED_BILINEAR_U8_H
#define INFEED_BILINEAR_U8_H

#include <stddef.h>
#include <stdint.h>

/* int16 taps an output row of n pixels needs (infeed_bilinear_u8_taps). */
size_t infeed_bilinear_u8_taps_size(int n);

/* Lays out the horizontal weights: output pixel i blends pixels offsets[i] / 3 and the next one with weights
 * 1 - w1[i] and w1[i] (0 <= w1 <= 1). */
void infeed_bilinear_u8_taps(int n, const float *w1, int16_t *taps);

/* The vertical pass: col[i] = p[i] blended with q[i] at weight w1 (0 <= w1 <= 1; q may be p), for i < n. */
void infeed_bilinear_u8_vertical(const uint8_t *p, const uint8_t *q, float w1, ptrdiff_t n, int16_t *col);

/* The horizontal pass into n RGB pixels at out (3 n bytes, nothing past them written). offsets[i]: the first
 * source pixel's int16 offset in col (mirrored already when the output is); col holds 8 int16 of zeros past its
 * last pixel, as an edge pixel's second tap may weigh 0 past it. */
void infeed_bilinear_u8_horizontal(const int16_t *col, int n, const ptrdiff_t *offsets, const int16_t *taps,
                                   uint8_t *out);

/* 1: AVX2 where the CPU has it (the default), 0: the portable code whatever the CPU has. Returns the setting
 * in use before. For tests and benchmarks. */
int infeed_bilinear_u8_set_simd(int enabled);

/* "avx2" or "portable": what the two passes run now. */
const char *infeed_bilinear_u8_impl(void);

#endif
