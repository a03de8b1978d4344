/* Portable scalar bitmap kernels: the reference every SIMD path must match byte for byte. */
#include <string.h>
#include "../runtime/kernels.h"
#include "bitmap_loops.h"

/* Branch-free compaction: always store, advance only for nonzero. Loads and stores go
 * through memcpy because payload buffers parsed from bytes need not be aligned. */
#define AC_DEFINE_SCALAR_BITMAP(BITS, T, ABSMASK)                                          \
    static size_t bm_encode_##BITS(const void *src, size_t n, uint8_t *bitmap, void *out,   \
                                   uint64_t thr) {                                          \
        const unsigned char *s = (const unsigned char *)src;                                \
        unsigned char *o = (unsigned char *)out;                                            \
        size_t count = 0;                                                                   \
        for (size_t i = 0; i < n; i += 8) {                                                 \
            size_t m = n - i < 8 ? n - i : 8;                                               \
            unsigned byte = 0;                                                              \
            for (size_t j = 0; j < m; j++) {                                                \
                T v;                                                                        \
                memcpy(&v, s + (i + j) * sizeof(T), sizeof(T));                             \
                unsigned nz = thr ? (uint64_t)(v & (T)(ABSMASK)) >= thr : v != 0;           \
                memcpy(o + count * sizeof(T), &v, sizeof(T));                              \
                count += nz;                                                                \
                byte |= nz << j;                                                            \
            }                                                                               \
            bitmap[i / 8] = (uint8_t)byte;                                                  \
        }                                                                                   \
        return count;                                                                       \
    }                                                                                       \
    static void bm_decode_##BITS(const uint8_t *bitmap, size_t n, const void *vals,         \
                                 size_t nvals, void *dst) {                                 \
        const unsigned char *v = (const unsigned char *)vals;                               \
        unsigned char *d = (unsigned char *)dst;                                            \
        size_t p = 0;                                                                       \
        (void)nvals; /* the driver checked popcount(bitmap) == nvals */                     \
        for (size_t i = 0; i < n; i += 8) {                                                 \
            size_t m = n - i < 8 ? n - i : 8;                                               \
            unsigned byte = bitmap[i / 8];                                                  \
            if (byte == 0) { /* runs of zeros and of nonzeros are common: skip bit tests */ \
                memset(d + i * sizeof(T), 0, m * sizeof(T));                                \
                continue;                                                                   \
            }                                                                               \
            if (byte == 0xFFu && m == 8) {                                                  \
                memcpy(d + i * sizeof(T), v + p * sizeof(T), 8 * sizeof(T));                \
                p += 8;                                                                     \
                continue;                                                                   \
            }                                                                               \
            for (size_t j = 0; j < m; j++) {                                                \
                T x = 0;                                                                    \
                if ((byte >> j) & 1u) {                                                     \
                    memcpy(&x, v + p * sizeof(T), sizeof(T));                               \
                    p++;                                                                    \
                }                                                                           \
                memcpy(d + (i + j) * sizeof(T), &x, sizeof(T));                             \
            }                                                                               \
        }                                                                                   \
    }

AC_DEFINE_SCALAR_BITMAP(16, uint16_t, 0x7FFFu)
AC_DEFINE_SCALAR_BITMAP(32, uint32_t, 0x7FFFFFFFu)
AC_DEFINE_SCALAR_BITMAP(64, uint64_t, 0x7FFFFFFFFFFFFFFFull)

static size_t popcount_scalar(const uint8_t *p, size_t nbytes) {
    size_t total = 0, i = 0;
    for (; i + 8 <= nbytes; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        /* SWAR popcount: no popcnt instruction is assumed on the baseline target. */
        w = w - ((w >> 1) & 0x5555555555555555ull);
        w = (w & 0x3333333333333333ull) + ((w >> 2) & 0x3333333333333333ull);
        w = (w + (w >> 4)) & 0x0F0F0F0F0F0F0F0Full;
        total += (size_t)((w * 0x0101010101010101ull) >> 56);
    }
    for (; i < nbytes; i++) {
        unsigned b = p[i];
        while (b) { total += b & 1u; b >>= 1; }
    }
    return total;
}

/* Eight bytes at a time: the top bit of each nonzero byte, gathered into one byte by a
 * multiply (byte j's bit lands at bit 56 + j, no carries). */
static void bytes_bits_scalar(const uint8_t *src, size_t n, uint8_t *bitmap) {
    const uint64_t low7 = 0x7F7F7F7F7F7F7F7Full;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, src + i, 8);
        uint64_t top = (((x & low7) + low7) | x) & ~low7;
        bitmap[i / 8] = (uint8_t)(((top >> 7) * 0x0102040810204080ull) >> 56);
    }
    ac_bytes_bits_tail(src, i, n, bitmap);
}

int ac_kernels_scalar(ac_kernels *k) {
    AC_FILL_BITMAP_TABLE(k, popcount_scalar, bytes_bits_scalar);
    return 1;
}
