/* The block loops every SIMD bitmap path shares; each ISA file supplies only its 8-element
 * steps. Define, in the ISA file:
 *   lane_consts, make_consts(es, thr)   the ISA's compare constants
 *   STEP8_ENCODE(es, s, out, &k, use_thr)  left-pack the kept of 8 elements at s to out (may
 *                                       write up to AC_BITMAP_SLACK past them); return the byte
 *   STEP8_DECODE(es, m, v, dst)  expand 8 elements with bitmap byte m; may read 8 values at v
 *   POP8(m)                      number of set bits of a byte
 * then instantiate the loops and AC_DEFINE_BITMAP_ENTRY_POINTS(QUALIFIERS, BITS, ES). */
#ifndef ACTCODEC_BITMAP_LOOPS_H
#define ACTCODEC_BITMAP_LOOPS_H

#include <string.h>

/* Encodes n elements a bitmap byte at a time; the tail goes through a zero-padded copy (zero
 * lanes fail both tests, thr >= 1 when used, so its padding bits come out 0). */
#define AC_DEFINE_ENCODE_LOOP(QUALIFIERS)                                                   \
    QUALIFIERS size_t encode_loop(size_t es, const void *src, size_t n, uint8_t *bitmap,    \
                                  void *out, uint64_t thr, int use_thr) {                   \
        const unsigned char *s = (const unsigned char *)src;                                \
        unsigned char *o = (unsigned char *)out;                                            \
        const lane_consts k = make_consts(es, thr);                                         \
        size_t count = 0, i = 0;                                                            \
        for (; i + 8 <= n; i += 8) {                                                        \
            unsigned m = STEP8_ENCODE(es, s + i * es, o + count * es, &k, use_thr);         \
            bitmap[i / 8] = (uint8_t)m;                                                     \
            count += POP8(m);                                                               \
        }                                                                                   \
        if (i < n) {                                                                        \
            unsigned char tail[64] = {0};                                                   \
            memcpy(tail, s + i * es, (n - i) * es);                                         \
            unsigned m = STEP8_ENCODE(es, tail, o + count * es, &k, use_thr);               \
            bitmap[i / 8] = (uint8_t)m;                                                     \
            count += POP8(m);                                                               \
        }                                                                                   \
        return count;                                                                       \
    }

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

/* The bytes-to-bits tail every ISA shares: bytes [i, n) one at a time (SIMD loops stop at
 * a whole vector; the last bitmap byte may be partial). */
static inline void ac_bytes_bits_tail(const uint8_t *src, size_t i, size_t n, uint8_t *bitmap) {
    for (; i < n; i += 8) {
        unsigned bits = 0;
        for (size_t j = 0; j < 8 && i + j < n; j++) bits |= (unsigned)(src[i + j] != 0) << j;
        bitmap[i / 8] = (uint8_t)bits;
    }
}

/* Every bitmap table entry of one ISA file. */
#define AC_FILL_BITMAP_TABLE(k, POPCOUNT, BYTES_BITS)                                       \
    do {                                                                                    \
        (k)->bytes_bits = BYTES_BITS;                                                       \
        (k)->bm_encode[1] = bm_encode_16;                                                   \
        (k)->bm_encode[2] = bm_encode_32;                                                   \
        (k)->bm_encode[3] = bm_encode_64;                                                   \
        (k)->bm_decode[1] = bm_decode_16;                                                   \
        (k)->bm_decode[2] = bm_decode_32;                                                   \
        (k)->bm_decode[3] = bm_decode_64;                                                   \
        (k)->popcount = POPCOUNT;                                                           \
    } while (0)

#endif
