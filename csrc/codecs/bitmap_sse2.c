/* SSE2 bitmap kernels (the x86-64 baseline, so no target attributes). SSE2 has no variable
 * shuffle, so only the tests are vector code: compare + movemask give each bitmap byte, and
 * compaction / expansion are branch-free scalar loops over its 8 elements. x86-64 only. */
#include "../runtime/kernels.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#include <string.h>
#include "bitmap_tables.h"
#include "bitmap_loops.h"

/* Lane constants for one element width: SSE2 compares are signed, so the unsigned test
 * (bits & absmask) >= thr is done as (bits & absmask) > thr - 1 on nonnegative lanes, with
 * thr clamped to absmask + 1 (above which nothing is kept) so thr - 1 stays nonnegative. */
typedef struct {
    __m128i absmask, thr_m1;
} lane_consts;

static inline __m128i broadcast(size_t es, uint64_t x) {
    return es == 2 ? _mm_set1_epi16((short)x)
         : es == 4 ? _mm_set1_epi32((int)x)
                   : _mm_set1_epi64x((long long)x);
}

static inline lane_consts make_consts(size_t es, uint64_t thr) {
    uint64_t absmask = (1ull << (8 * es - 1)) - 1;
    lane_consts c = {broadcast(es, absmask), broadcast(es, thr > absmask ? absmask : thr - 1)};
    return c;
}

/* Kept-lane masks (bit j = lane j is nonzero); use_thr is a constant after inlining. */
static inline unsigned keep_8x16(__m128i v, const lane_consts *k, int use_thr) {
    __m128i c = use_thr ? _mm_cmpgt_epi16(_mm_and_si128(v, k->absmask), k->thr_m1)
                        : _mm_cmpeq_epi16(v, _mm_setzero_si128());
    /* Saturating pack turns each all-ones/zero word into one byte for movemask. */
    unsigned m = (unsigned)_mm_movemask_epi8(_mm_packs_epi16(c, c)) & 0xFFu;
    return use_thr ? m : m ^ 0xFFu;
}

static inline unsigned keep_4x32(__m128i v, const lane_consts *k, int use_thr) {
    __m128i c = use_thr ? _mm_cmpgt_epi32(_mm_and_si128(v, k->absmask), k->thr_m1)
                        : _mm_cmpeq_epi32(v, _mm_setzero_si128());
    unsigned m = (unsigned)_mm_movemask_ps(_mm_castsi128_ps(c));
    return use_thr ? m : m ^ 0xFu;
}

static inline unsigned keep_2x64(__m128i v, const lane_consts *k, int use_thr) {
    if (use_thr) {
        /* No 64-bit compare in SSE2: a > thr - 1 iff (thr - 1) - a is negative, which cannot
         * overflow as both are in [0, 2^63). */
        __m128i diff = _mm_sub_epi64(k->thr_m1, _mm_and_si128(v, k->absmask));
        return (unsigned)_mm_movemask_pd(_mm_castsi128_pd(diff));
    }
    /* A 64-bit lane is zero iff both of its 32-bit halves are. */
    __m128i zero_halves = _mm_cmpeq_epi32(v, _mm_setzero_si128());
    unsigned z = (unsigned)_mm_movemask_ps(_mm_castsi128_ps(zero_halves));
    z &= z >> 1;
    return ((z & 1u) | ((z >> 1) & 2u)) ^ 3u;
}

static inline __m128i load(const unsigned char *p) { return _mm_loadu_si128((const __m128i *)p); }

/* Bitmap byte of the 8 elements at s. */
static inline unsigned keep8(size_t es, const unsigned char *s, const lane_consts *k,
                             int use_thr) {
    if (es == 2) return keep_8x16(load(s), k, use_thr);
    if (es == 4) return keep_4x32(load(s), k, use_thr) | keep_4x32(load(s + 16), k, use_thr) << 4;
    return keep_2x64(load(s), k, use_thr) | keep_2x64(load(s + 16), k, use_thr) << 2 |
           keep_2x64(load(s + 32), k, use_thr) << 4 | keep_2x64(load(s + 48), k, use_thr) << 6;
}

/* Store every element, advance past the kept ones: writes at most one element past them. */
static inline void compact8(size_t es, const unsigned char *s, unsigned char *o, unsigned m) {
    size_t c = 0;
    for (unsigned j = 0; j < 8; j++) {
        memcpy(o + c * es, s + j * es, es);
        c += (m >> j) & 1u;
    }
}

/* Read the next packed value for every element and mask it to zero where the bit is clear,
 * so 8 values from v must be readable whatever m is. */
static inline void expand8(size_t es, unsigned m, const unsigned char *v, unsigned char *d) {
    size_t c = 0;
    for (unsigned j = 0; j < 8; j++) {
        uint64_t bit = (m >> j) & 1u, x = 0;
        memcpy(&x, v + c * es, es);
        x &= 0 - bit;
        memcpy(d + j * es, &x, es);
        c += bit;
    }
}

/* One bitmap byte: the kept-lane mask, then the branch-free compaction. */
static inline __attribute__((always_inline)) unsigned encode8(size_t es, const unsigned char *s,
                                                              unsigned char *out,
                                                              const lane_consts *k, int use_thr) {
    unsigned m = keep8(es, s, k, use_thr);
    compact8(es, s, out, m);
    return m;
}

#define STEP8_ENCODE encode8
#define POP8 ac_pop8
AC_DEFINE_ENCODE_LOOP(static inline __attribute__((always_inline)))

/* Bit-sliced popcount: per-byte counts by SWAR steps, summed by psadbw against zero. */
static inline __m128i byte_counts(__m128i x) {
    const __m128i m1 = _mm_set1_epi8(0x55), m2 = _mm_set1_epi8(0x33), m4 = _mm_set1_epi8(0x0F);
    x = _mm_sub_epi8(x, _mm_and_si128(_mm_srli_epi16(x, 1), m1));
    x = _mm_add_epi8(_mm_and_si128(x, m2), _mm_and_si128(_mm_srli_epi16(x, 2), m2));
    x = _mm_and_si128(_mm_add_epi8(x, _mm_srli_epi16(x, 4)), m4);
    return _mm_sad_epu8(x, _mm_setzero_si128());
}

static size_t popcount_sse2(const uint8_t *p, size_t nbytes) {
    __m128i acc = _mm_setzero_si128();
    size_t i = 0;
    for (; i + 16 <= nbytes; i += 16) acc = _mm_add_epi64(acc, byte_counts(load(p + i)));
    if (i < nbytes) {
        unsigned char tail[16] = {0};
        memcpy(tail, p + i, nbytes - i);
        acc = _mm_add_epi64(acc, byte_counts(load(tail)));
    }
    uint64_t halves[2];
    memcpy(halves, &acc, sizeof halves);
    return (size_t)(halves[0] + halves[1]);
}

#define STEP8_DECODE expand8
AC_DEFINE_DECODE_LOOP(static inline __attribute__((always_inline)))

AC_DEFINE_BITMAP_ENTRY_POINTS(static, 16, 2)
AC_DEFINE_BITMAP_ENTRY_POINTS(static, 32, 4)
AC_DEFINE_BITMAP_ENTRY_POINTS(static, 64, 8)

static void bytes_bits_sse2(const uint8_t *src, size_t n, uint8_t *bitmap) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        unsigned zero = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(load(src + i), _mm_setzero_si128()));
        uint16_t bits = (uint16_t)~zero;
        memcpy(bitmap + i / 8, &bits, 2);
    }
    ac_bytes_bits_tail(src, i, n, bitmap);
}

int ac_kernels_sse2(ac_kernels *k) {
    AC_FILL_BITMAP_TABLE(k, popcount_sse2, bytes_bits_sse2);
    return 1;
}

#else

int ac_kernels_sse2(ac_kernels *k) {
    (void)k;
    return 0;
}

#endif
