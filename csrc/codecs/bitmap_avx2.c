/* AVX2 bitmap kernels, one bitmap byte (8 elements) per step: a compare + movemask gives the
 * bitmap byte, and a shuffle table indexed by that byte left-packs (encode) or scatters
 * (decode) the lanes in one permute. x86-64 only. Every function carries its own target
 * attribute, so the file builds without -mavx2 and nothing here runs unless dispatch.c has
 * seen AVX2 and POPCNT on the CPU. */
#include "../runtime/kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>
#include "bitmap_tables.h"
#include "bitmap_loops.h"

#define AVX2_FN static __attribute__((target("avx2,popcnt")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,popcnt")))

/* Lane constants for one element width: AVX2 compares are signed, so the unsigned test
 * (bits & absmask) >= thr is done as (bits & absmask) > thr - 1 on nonnegative lanes, with
 * thr clamped to absmask + 1 (above which nothing is kept) so thr - 1 stays nonnegative. */
typedef struct {
    __m256i absmask, thr_m1;
} lane_consts;

AVX2_INLINE __m256i broadcast(size_t es, uint64_t x) {
    return es == 2 ? _mm256_set1_epi16((short)x)
         : es == 4 ? _mm256_set1_epi32((int)x)
                   : _mm256_set1_epi64x((long long)x);
}

AVX2_INLINE lane_consts make_consts(size_t es, uint64_t thr) {
    uint64_t absmask = (1ull << (8 * es - 1)) - 1;
    lane_consts c = {broadcast(es, absmask), broadcast(es, thr > absmask ? absmask : thr - 1)};
    return c;
}

AVX2_INLINE unsigned pc(unsigned m) { return (unsigned)_mm_popcnt_u32(m); }

/* Kept-lane masks (bit j = lane j is nonzero); use_thr is a constant after inlining. */
AVX2_INLINE unsigned keep_8x16(__m128i v, const lane_consts *k, int use_thr) {
    __m128i c = use_thr ? _mm_cmpgt_epi16(_mm_and_si128(v, _mm256_castsi256_si128(k->absmask)),
                                          _mm256_castsi256_si128(k->thr_m1))
                        : _mm_cmpeq_epi16(v, _mm_setzero_si128());
    /* Saturating pack turns each all-ones/zero word into one byte for movemask. */
    unsigned m = (unsigned)_mm_movemask_epi8(_mm_packs_epi16(c, c)) & 0xFFu;
    return use_thr ? m : m ^ 0xFFu;
}

AVX2_INLINE unsigned keep_8x32(__m256i v, const lane_consts *k, int use_thr) {
    __m256i c = use_thr ? _mm256_cmpgt_epi32(_mm256_and_si256(v, k->absmask), k->thr_m1)
                        : _mm256_cmpeq_epi32(v, _mm256_setzero_si256());
    unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(c));
    return use_thr ? m : m ^ 0xFFu;
}

AVX2_INLINE unsigned keep_4x64(__m256i v, const lane_consts *k, int use_thr) {
    __m256i c = use_thr ? _mm256_cmpgt_epi64(_mm256_and_si256(v, k->absmask), k->thr_m1)
                        : _mm256_cmpeq_epi64(v, _mm256_setzero_si256());
    unsigned m = (unsigned)_mm256_movemask_pd(_mm256_castsi256_pd(c));
    return use_thr ? m : m ^ 0xFu;
}

/* vpermd by a row of lane numbers (bytes, widened to 32-bit indices). */
AVX2_INLINE __m256i permute_by(__m256i v, const uint8_t *row) {
    return _mm256_permutevar8x32_epi32(
        v, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)row)));
}

/* vpermd by an expand row, zeroing the lanes marked 0x80: the sign-extending widen makes
 * those indices negative, and blendv selects on the sign bit. */
AVX2_INLINE void expand_store(unsigned char *dst, __m256i v, const uint8_t *row) {
    __m256i idx = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)row));
    __m256 x = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(v, idx));
    x = _mm256_blendv_ps(x, _mm256_setzero_ps(), _mm256_castsi256_ps(idx));
    _mm256_storeu_ps((float *)dst, x);
}

/* Encodes the 8 elements at s: left-packs the kept ones to out with full-vector stores (at
 * most 32 bytes past the last kept one) and returns the bitmap byte. */
AVX2_INLINE unsigned encode8(size_t es, const unsigned char *s, unsigned char *out,
                             const lane_consts *k, int use_thr) {
    if (es == 2) {
        __m128i v = _mm_loadu_si128((const __m128i *)s);
        unsigned m = keep_8x16(v, k, use_thr);
        __m128i shuf = _mm_loadu_si128((const __m128i *)ac_pack_8x16[m]);
        _mm_storeu_si128((__m128i *)out, _mm_shuffle_epi8(v, shuf));
        return m;
    }
    if (es == 4) {
        __m256i v = _mm256_loadu_si256((const __m256i *)s);
        unsigned m = keep_8x32(v, k, use_thr);
        _mm256_storeu_si256((__m256i *)out, permute_by(v, ac_pack_8x32[m]));
        return m;
    }
    __m256i lo = _mm256_loadu_si256((const __m256i *)s);
    __m256i hi = _mm256_loadu_si256((const __m256i *)(s + 32));
    unsigned mlo = keep_4x64(lo, k, use_thr), mhi = keep_4x64(hi, k, use_thr);
    _mm256_storeu_si256((__m256i *)out, permute_by(lo, ac_pack_4x64[mlo]));
    _mm256_storeu_si256((__m256i *)(out + 8 * pc(mlo)), permute_by(hi, ac_pack_4x64[mhi]));
    return mlo | mhi << 4;
}

/* Decodes 8 elements with bitmap byte m into dst (exactly 8 * es bytes) from the packed
 * values at v, of which 8 must be readable whatever m is. */
AVX2_INLINE void decode8(size_t es, unsigned m, const unsigned char *v, unsigned char *dst) {
    if (es == 2) {
        __m128i shuf = _mm_loadu_si128((const __m128i *)ac_expand_8x16[m]);
        __m128i x = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)v), shuf);
        _mm_storeu_si128((__m128i *)dst, x);
    } else if (es == 4) {
        expand_store(dst, _mm256_loadu_si256((const __m256i *)v), ac_expand_8x32[m]);
    } else {
        unsigned mlo = m & 0xFu, mhi = m >> 4;
        expand_store(dst, _mm256_loadu_si256((const __m256i *)v), ac_expand_4x64[mlo]);
        expand_store(dst + 32, _mm256_loadu_si256((const __m256i *)(v + 8 * pc(mlo))),
                     ac_expand_4x64[mhi]);
    }
}

#define STEP8_ENCODE encode8
#define POP8 pc
AC_DEFINE_ENCODE_LOOP(AVX2_INLINE)

AVX2_FN size_t popcount_avx2(const uint8_t *p, size_t nbytes) {
    /* Four independent sums so the popcnt latencies overlap. */
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 32 <= nbytes; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, sizeof w);
        s0 += (uint64_t)_mm_popcnt_u64(w[0]);
        s1 += (uint64_t)_mm_popcnt_u64(w[1]);
        s2 += (uint64_t)_mm_popcnt_u64(w[2]);
        s3 += (uint64_t)_mm_popcnt_u64(w[3]);
    }
    for (; i + 8 <= nbytes; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, sizeof w);
        s0 += (uint64_t)_mm_popcnt_u64(w);
    }
    for (; i < nbytes; i++) s0 += pc(p[i]);
    return (size_t)(s0 + s1 + s2 + s3);
}

#define STEP8_DECODE decode8
AC_DEFINE_DECODE_LOOP(AVX2_INLINE)

AC_DEFINE_BITMAP_ENTRY_POINTS(AVX2_FN, 16, 2)
AC_DEFINE_BITMAP_ENTRY_POINTS(AVX2_FN, 32, 4)
AC_DEFINE_BITMAP_ENTRY_POINTS(AVX2_FN, 64, 8)

AVX2_FN void bytes_bits_avx2(const uint8_t *src, size_t n, uint8_t *bitmap) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(src + i));
        uint32_t bits = ~(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, _mm256_setzero_si256()));
        memcpy(bitmap + i / 8, &bits, 4);
    }
    ac_bytes_bits_tail(src, i, n, bitmap);
}

int ac_kernels_avx2(ac_kernels *k) {
    AC_FILL_BITMAP_TABLE(k, popcount_avx2, bytes_bits_avx2);
    return 1;
}

#else

int ac_kernels_avx2(ac_kernels *k) {
    (void)k;
    return 0;
}

#endif
