/* See _jpeg_window.h. */
#include "_jpeg_window.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 1005000
#error "infeed's JPEG decoder needs libjpeg-turbo 1.5 or newer (jpeg_crop_scanline, jpeg_skip_scanlines)"
#endif

struct infeed_jpeg {
    struct jpeg_decompress_struct cinfo;
    struct jpeg_error_mgr errors;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX + 64];
};

/* libjpeg's error_exit: the message kept, then back to the entry point's setjmp (never returns). */
static void fail(j_common_ptr cinfo) {
    infeed_jpeg *j = (infeed_jpeg *)cinfo->client_data;
    (*cinfo->err->format_message)(cinfo, j->message);
    longjmp(j->jump, 1);
}

/* libjpeg's emit_message: a warning (level -1) fails as an error; trace messages are dropped, nothing printed. */
static void message(j_common_ptr cinfo, int level) {
    if (level < 0)
        fail(cinfo);
}

infeed_jpeg *infeed_jpeg_new(void) {
    infeed_jpeg *j = (infeed_jpeg *)calloc(1, sizeof(infeed_jpeg));
    if (j == NULL)
        return NULL;
    j->cinfo.err = jpeg_std_error(&j->errors);
    j->errors.error_exit = fail;
    j->errors.emit_message = message;
    j->cinfo.client_data = j;
    if (setjmp(j->jump)) {                 /* out of memory in libjpeg's first pool */
        free(j);
        return NULL;
    }
    jpeg_create_decompress(&j->cinfo);
    return j;
}

void infeed_jpeg_free(infeed_jpeg *j) {
    if (j == NULL)
        return;
    jpeg_destroy_decompress(&j->cinfo);
    free(j);
}

const char *infeed_jpeg_message(const infeed_jpeg *j) { return j->message; }

int infeed_jpeg_scaled(int size, int denom) { return (int)(((long)size + denom - 1) / denom); }

static int is_cmyk(const struct jpeg_decompress_struct *cinfo) {
    return cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
}

static void start(infeed_jpeg *j, const uint8_t *data, size_t size) {
    j->message[0] = '\0';
    jpeg_mem_src(&j->cinfo, (const unsigned char *)data, (unsigned long)size);
    jpeg_read_header(&j->cinfo, TRUE);
}

int infeed_jpeg_read_header(infeed_jpeg *j, const uint8_t *data, size_t size, infeed_jpeg_header *header) {
    if (setjmp(j->jump)) {
        jpeg_abort_decompress(&j->cinfo);
        return -1;
    }
    start(j, data, size);
    header->height = (int)j->cinfo.image_height;
    header->width = (int)j->cinfo.image_width;
    header->cmyk = is_cmyk(&j->cinfo);
    jpeg_abort_decompress(&j->cinfo);
    return 0;
}

/* CMYK pixels (4 bytes each, as libjpeg gives them: inverted where an Adobe marker says so, as Adobe's
 * applications write them) to channels bytes each, in place (the output is never ahead of the input). RGB is
 * c k / 255 rounded (TensorFlow truncates it), gray the RGB's luma with libjpeg's weights. */
static void convert_cmyk(uint8_t *pixels, size_t count, int channels, int inverted) {
    size_t i;
    for (i = 0; i < count; i++) {
        const uint8_t *p = pixels + 4 * i;
        unsigned c = p[0], m = p[1], y = p[2], k = p[3];
        unsigned r, g, b;
        uint8_t *q = pixels + (size_t)channels * i;
        if (!inverted) {
            c = 255 - c; m = 255 - m; y = 255 - y; k = 255 - k;
        }
        r = (c * k + 127) / 255;
        g = (m * k + 127) / 255;
        b = (y * k + 127) / 255;
        if (channels == 1) {
            q[0] = (uint8_t)((19595 * r + 38470 * g + 7471 * b + 32768) >> 16);
        } else {
            q[0] = (uint8_t)r;
            q[1] = (uint8_t)g;
            q[2] = (uint8_t)b;
            if (channels == 4)
                q[3] = 255;
        }
    }
}

/* A decode refused for a reason of ours: the message set, the decompression reset, -1. */
static int refuse(infeed_jpeg *j, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(j->message, sizeof j->message, format, args);
    va_end(args);
    jpeg_abort_decompress(&j->cinfo);
    return -1;
}

int infeed_jpeg_decode(infeed_jpeg *j, const uint8_t *data, size_t size, const infeed_jpeg_window *window,
                       uint8_t *out, size_t capacity, int *first_col, int *cols) {
    struct jpeg_decompress_struct *cinfo = &j->cinfo;
    JDIMENSION xoffset, width;
    size_t pixel, stride;
    int cmyk, rows, r;
    JSAMPROW lines[16];

    if (setjmp(j->jump)) {
        jpeg_abort_decompress(cinfo);
        return -1;
    }
    start(j, data, size);
    cmyk = is_cmyk(cinfo);
    switch (window->channels) {
        case 1: cinfo->out_color_space = JCS_GRAYSCALE; break;
        case 3: cinfo->out_color_space = JCS_RGB; break;
        case 4: cinfo->out_color_space = JCS_EXT_RGBA; break;
        default:
            return refuse(j, "%d channels asked (1, 3 or 4)", window->channels);
    }
    if (cmyk)
        cinfo->out_color_space = JCS_CMYK;            /* libjpeg converts YCCK to CMYK, not CMYK to RGB */
    cinfo->dct_method = window->fast_dct ? JDCT_IFAST : JDCT_ISLOW;
    cinfo->scale_num = 1;
    cinfo->scale_denom = (unsigned int)window->denom;
    jpeg_calc_output_dimensions(cinfo);
    if (window->y_lo < 0 || window->y_hi > (int)cinfo->output_height || window->y_lo >= window->y_hi ||
        window->x_lo < 0 || window->x_hi > (int)cinfo->output_width || window->x_lo >= window->x_hi)
        return refuse(j, "window rows [%d, %d) columns [%d, %d) outside the %ux%u image at 1/%d", window->y_lo,
                      window->y_hi, window->x_lo, window->x_hi, (unsigned)cinfo->output_width,
                      (unsigned)cinfo->output_height, window->denom);
    jpeg_start_decompress(cinfo);
    xoffset = (JDIMENSION)window->x_lo;
    width = (JDIMENSION)(window->x_hi - window->x_lo);
    jpeg_crop_scanline(cinfo, &xoffset, &width);
    pixel = (size_t)(cmyk ? 4 : window->channels);
    stride = (size_t)width * pixel;
    rows = window->y_hi - window->y_lo;
    if ((size_t)rows * stride > capacity || (int)cinfo->output_components != (int)pixel)
        return refuse(j, "the window needs %zu bytes of %d-byte pixels, the buffer holds %zu",
                      (size_t)rows * stride, cinfo->output_components, capacity);
    if (window->y_lo > 0 && jpeg_skip_scanlines(cinfo, (JDIMENSION)window->y_lo) != (JDIMENSION)window->y_lo)
        return refuse(j, "could not skip %d rows", window->y_lo);
    while (cinfo->output_scanline < (JDIMENSION)window->y_hi) {
        int done = (int)cinfo->output_scanline - window->y_lo;
        int want = window->y_hi - (int)cinfo->output_scanline;
        if (want > 16)
            want = 16;
        for (r = 0; r < want; r++)
            lines[r] = out + (size_t)(done + r) * stride;
        if (jpeg_read_scanlines(cinfo, lines, (JDIMENSION)want) == 0)
            return refuse(j, "no rows past row %d", (int)cinfo->output_scanline);
    }
    if (cmyk)
        convert_cmyk(out, (size_t)rows * width, window->channels, cinfo->saw_Adobe_marker);
    jpeg_abort_decompress(cinfo);                    /* the rows below are never decoded */
    *first_col = (int)xoffset;
    *cols = (int)width;
    return 0;
}
