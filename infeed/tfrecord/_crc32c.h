/* CRC32C (Castagnoli) for TFRecord framing: the CPU's CRC instruction where
 * present (SSE4.2 on x86-64, the CRC extension on ARMv8), a slicing-by-8 table
 * elsewhere.  Pure functions, safe to call without the GIL. */
#ifndef INFEED_CRC32C_H
#define INFEED_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends `crc` (0 to start) over `n` bytes at `data`. */
uint32_t infeed_crc32c_extend(uint32_t crc, const uint8_t *data, size_t n);

/* TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
static inline uint32_t infeed_crc32c_mask(uint32_t crc) {
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* Name of the implementation in use: "sse4.2", "armv8-crc" or "table". */
const char *infeed_crc32c_impl(void);

/* The portable table path whatever the CPU has: tests compare both. */
uint32_t infeed_crc32c_table(uint32_t crc, const uint8_t *data, size_t n);

#endif
