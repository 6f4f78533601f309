#include "_crc32c.h"

#include <string.h>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#endif

/* ---- table fallback: slicing-by-8 over the reflected polynomial 0x82f63b78 ---- */

static uint32_t crc_table[8][256];
static int table_ready = 0;

static void build_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[t][i] = c;
        }
    }
    table_ready = 1;
}

static uint32_t crc32c_table(uint32_t crc, const uint8_t *p, size_t n) {
    if (!table_ready) build_table(); /* idempotent: a race writes equal values */
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc; /* little-endian hosts only reach here; big-endian uses the byte loop */
        crc = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^
              crc_table[5][(w >> 16) & 0xff] ^ crc_table[4][(w >> 24) & 0xff] ^
              crc_table[3][(w >> 32) & 0xff] ^ crc_table[2][(w >> 40) & 0xff] ^
              crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
static uint32_t crc32c_bytes(uint32_t crc, const uint8_t *p, size_t n) {
    if (!table_ready) build_table();
    crc = ~crc;
    while (n--) crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}
#define CRC_FALLBACK crc32c_bytes
#else
#define CRC_FALLBACK crc32c_table
#endif

/* ---- hardware paths ---- */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_HW_CRC 1
#define HW_NAME "sse4.2"

/* One crc32q waits for the previous one (3 cycles latency, 1 per cycle
 * throughput), so one stream runs at a third of the instruction's speed.  Long
 * buffers are therefore split into three interleaved streams whose CRCs are
 * combined: for the raw register, crc(A || B) = shift_|B|(crc(A)) ^ crc(B, from 0),
 * and shifting over a fixed number of zero bytes is linear, so it is four table
 * lookups (the tables are built once, with the instruction itself). */
#define LONG_BLOCK 8192
#define SHORT_BLOCK 256
#define TINY_BLOCK 64

static uint32_t shift_long[4][256], shift_short[4][256], shift_tiny[4][256];
static int shift_ready = 0;

__attribute__((target("sse4.2")))
static void build_shift(uint32_t table[4][256], size_t zeros) {
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) {
            uint64_t x = (uint64_t)b << (8 * k);
            for (size_t i = 0; i < zeros; i += 8) x = _mm_crc32_u64(x, 0);
            table[k][b] = (uint32_t)x;
        }
}

__attribute__((target("sse4.2")))
static void build_shifts(void) {
    build_shift(shift_long, LONG_BLOCK);
    build_shift(shift_short, SHORT_BLOCK);
    build_shift(shift_tiny, TINY_BLOCK);
    shift_ready = 1; /* idempotent: a race writes equal values */
}

static inline uint64_t shift(uint32_t table[4][256], uint64_t c) {
    return table[0][c & 0xff] ^ table[1][(c >> 8) & 0xff] ^ table[2][(c >> 16) & 0xff] ^
           table[3][(c >> 24) & 0xff];
}

#define INTERLEAVED(BLOCK, TABLE)                                                   \
    while (n >= 3 * (BLOCK)) {                                                      \
        uint64_t c1 = 0, c2 = 0;                                                    \
        const uint8_t *stop = p + (BLOCK);                                          \
        do {                                                                        \
            uint64_t a, b, d;                                                       \
            memcpy(&a, p, 8); memcpy(&b, p + (BLOCK), 8); memcpy(&d, p + 2 * (BLOCK), 8); \
            c = _mm_crc32_u64(c, a);                                                \
            c1 = _mm_crc32_u64(c1, b);                                              \
            c2 = _mm_crc32_u64(c2, d);                                              \
            p += 8;                                                                 \
        } while (p < stop);                                                         \
        c = shift(TABLE, c) ^ c1;                                                   \
        c = shift(TABLE, c) ^ c2;                                                   \
        p += 2 * (BLOCK);                                                           \
        n -= 3 * (BLOCK);                                                           \
    }

__attribute__((target("sse4.2")))
static uint32_t crc32c_hw(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    if (n >= 3 * TINY_BLOCK) {
        if (!shift_ready) build_shifts();
        INTERLEAVED(LONG_BLOCK, shift_long)
        INTERLEAVED(SHORT_BLOCK, shift_short)
        INTERLEAVED(TINY_BLOCK, shift_tiny)
    }
    while (n >= 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        c = _mm_crc32_u64(c, a);
        p += 8;
        n -= 8;
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}

static int hw_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}

#elif defined(__aarch64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <arm_acle.h>
#define HAVE_HW_CRC 1
#define HW_NAME "armv8-crc"

__attribute__((target("+crc")))
static uint32_t crc32c_hw(uint32_t crc, const uint8_t *p, size_t n) {
    uint32_t c = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        c = __crc32cb(c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        c = __crc32cd(c, a);
        p += 8;
        n -= 8;
    }
    while (n--) c = __crc32cb(c, *p++);
    return ~c;
}

static int hw_available(void) { return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0; }
#endif

/* ---- dispatch, resolved once ---- */

typedef uint32_t (*crc_fn)(uint32_t, const uint8_t *, size_t);
static crc_fn chosen = 0;
static const char *chosen_name = "table";

static void choose(void) {
#ifdef HAVE_HW_CRC
    if (hw_available()) {
        chosen_name = HW_NAME;
        chosen = crc32c_hw;
        return;
    }
#endif
    chosen_name = "table";
    chosen = CRC_FALLBACK;
}

uint32_t infeed_crc32c_extend(uint32_t crc, const uint8_t *data, size_t n) {
    if (!chosen) choose();
    return chosen(crc, data, n);
}

const char *infeed_crc32c_impl(void) {
    if (!chosen) choose();
    return chosen_name;
}

/* For tests and benchmarks: the table path regardless of the CPU. */
uint32_t infeed_crc32c_table(uint32_t crc, const uint8_t *data, size_t n) {
    return CRC_FALLBACK(crc, data, n);
}
