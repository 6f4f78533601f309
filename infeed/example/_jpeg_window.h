/* A JPEG's crop window decoded through libjpeg-turbo's libjpeg API: the whole iMCU columns around the window
 * (jpeg_crop_scanline), its rows alone (jpeg_skip_scanlines past those above, nothing read below), at a DCT
 * scale of 1/1, 1/2, 1/4 or 1/8, into a caller's buffer.
 *
 * libjpeg reports errors through setjmp/longjmp: every entry point here sets its own jump and returns -1 with
 * the library's message (infeed_jpeg_message), so no jump ever crosses a caller's frame, and nothing is printed.
 * A warning (corrupt data, a premature end) is an error too, as TurboJPEG and simplejpeg have it. Nothing here
 * touches Python: the calls are safe without the GIL, one decoder to a thread. */
#ifndef INFEED_JPEG_WINDOW_H
#define INFEED_JPEG_WINDOW_H

#include <stddef.h>
#include <stdint.h>

typedef struct infeed_jpeg infeed_jpeg;

/* What the header declares. */
typedef struct {
    int height, width;
    int cmyk;               /* CMYK or YCCK: decoded as CMYK (4 bytes a pixel) and converted here */
} infeed_jpeg_header;

/* What to decode: the rows [y_lo, y_hi) and at least the columns [x_lo, x_hi) of the image at 1/denom scale. */
typedef struct {
    int channels;           /* 1 gray, 3 RGB, 4 RGBA (opaque) */
    int fast_dct;           /* JDCT_IFAST, else JDCT_ISLOW */
    int denom;              /* 1, 2, 4 or 8 */
    int y_lo, y_hi, x_lo, x_hi;
} infeed_jpeg_window;

/* A decoder (NULL when out of memory) and its release. It holds libjpeg's decompress object between images:
 * its permanent pool (a few KiB); each image's own memory is freed when its call returns. */
infeed_jpeg *infeed_jpeg_new(void);
void infeed_jpeg_free(infeed_jpeg *j);

/* The last error's message (empty before any). */
const char *infeed_jpeg_message(const infeed_jpeg *j);

/* The scaled size libjpeg gives a dimension at 1/denom: ceil(size / denom). */
int infeed_jpeg_scaled(int size, int denom);

/* Columns to allow beyond x_hi - x_lo for the alignment of the window's left edge to an iMCU (the widest iMCU
 * is 32 pixels at full scale). */
#define INFEED_JPEG_ALIGN_SLACK 32

/* Reads the header of data[0:size]: 0, or -1 with the message. */
int infeed_jpeg_read_header(infeed_jpeg *j, const uint8_t *data, size_t size, infeed_jpeg_header *header);

/* Decodes the window of data[0:size] into out: y_hi - y_lo rows of *cols pixels of channels bytes, packed,
 * column 0 being the image's column *first_col (<= x_lo; *first_col + *cols >= x_hi). out must hold
 * (y_hi - y_lo) * (x_hi - x_lo + INFEED_JPEG_ALIGN_SLACK) * (header.cmyk ? 4 : channels) bytes; capacity is
 * checked against what the window takes once it is aligned. 0, or -1 with the message. */
int infeed_jpeg_decode(infeed_jpeg *j, const uint8_t *data, size_t size, const infeed_jpeg_window *window,
                       uint8_t *out, size_t capacity, int *first_col, int *cols);

#endif
