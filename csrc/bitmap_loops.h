/* The block loops every SIMD bitmap path shares; each ISA file supplies only its 8-element
 * step. Include after defining, in the ISA file:
 *   STEP8_DECODE(es, m, v, dst)  expand 8 elements with bitmap byte m; may read 8 values at v
 *   POP8(m)                      number of set bits of a byte
 *   encode_loop(...)             the ISA's encode loop
 * then instantiate with AC_DEFINE_BITMAP_ENTRY_POINTS(QUALIFIERS, BITS, ES). */
#ifndef ACTCODEC_BITMAP_LOOPS_H
#define ACTCODEC_BITMAP_LOOPS_H

#include <string.h>

/* Decodes n elements from the `total` values at vals. Full 8-value loads straight from vals
 * while at least 8 values remain; then from a zero-padded copy of the (fewer than 8) rest,
 * so nothing is read past vals[total): a byte starts at most 7 values in and reads at most 8
 * from there. Padding bits are ignored, as in the scalar kernel. */
#define AC_DEFINE_DECODE_LOOP(QUALIFIERS)                                                   \
    QUALIFIERS void decode_loop(size_t es, const uint8_t *bitmap, size_t n,                 \
                                const void *vals, size_t total, void *dst) {               \
        const unsigned char *v = (const unsigned char *)vals;                               \
        unsigned char *d = (unsigned char *)dst;                                            \
        size_t nfull = n / 8, ntail = n % 8, p = 0, i = 0;                                  \
        unsigned tail_m = ntail ? bitmap[nfull] & ((1u << ntail) - 1u) : 0u;                \
        for (; i < nfull && total - p >= 8; i++) {                                          \
            STEP8_DECODE(es, bitmap[i], v + p * es, d + i * 8 * es);                        \
            p += POP8(bitmap[i]);                                                           \
        }                                                                                   \
        unsigned char rest[15 * 8] = {0};                                                   \
        if (total > p) memcpy(rest, v + p * es, (total - p) * es);                          \
        size_t q = 0;                                                                       \
        for (; i < nfull; i++) {                                                            \
            STEP8_DECODE(es, bitmap[i], rest + q * es, d + i * 8 * es);                     \
            q += POP8(bitmap[i]);                                                           \
        }                                                                                   \
        if (ntail) {                                                                        \
            unsigned char last[64];                                                         \
            STEP8_DECODE(es, tail_m, rest + q * es, last);                                  \
            memcpy(d + nfull * 8 * es, last, ntail * es);                                   \
        }                                                                                   \
    }

/* The threshold test is chosen once per call: each entry point holds two specialised loops. */
#define AC_DEFINE_BITMAP_ENTRY_POINTS(QUALIFIERS, BITS, ES)                                 \
    QUALIFIERS size_t bm_encode_##BITS(const void *src, size_t n, uint8_t *bitmap,          \
                                       void *out, uint64_t thr) {                           \
        return thr ? encode_loop(ES, src, n, bitmap, out, thr, 1)                           \
                   : encode_loop(ES, src, n, bitmap, out, 0, 0);                            \
    }                                                                                       \
    QUALIFIERS void bm_decode_##BITS(const uint8_t *bitmap, size_t n, const void *vals,     \
                                     size_t nvals, void *dst) {                             \
        decode_loop(ES, bitmap, n, vals, nvals, dst);                                       \
    }

#endif
