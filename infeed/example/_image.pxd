# The resize kernel's C entry point, for the JPEG decoder (_jpeg.pyx), which resizes the rows it decodes
# without making an array of them.

cdef int resize_pixels(const void *src, bint sixteen, int src_h, int src_w, int channels, double y0, double x0,
                       double height, double width, char *dst, Py_ssize_t out_stride, int out_kind, int out_h,
                       int out_w, bint flip, bint antialias, const float *scales, const float *biases) noexcept nogil
