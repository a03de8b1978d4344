/* AVX2 quantization kernels, bit-exact with quant_scalar.c: min/max, quantize (8 lanes of
 * float32 math, 32 codes per store), dequantize, bit packing by whole-vector shifts, and the
 * dtype conversions (F16C for float16). x86-64 only. Every function carries its own target
 * attribute, without FMA so a multiply and an add are never fused; the file builds without
 * -mavx2 and nothing here runs unless dispatch.c has seen AVX2, POPCNT and F16C. */
#include "../runtime/kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include "quant_common.h"
#include "quant_simd.h"

#define AVX2_FN static __attribute__((target("avx2,f16c,popcnt")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,f16c,popcnt")))

/* ---- min / max ---- */

/* Lane-wise running min and max, and a mask of lanes that met a NaN: vminps/vmaxps drop NaNs
 * (they return the second operand), so NaNs are caught by unordered compares, and infinities
 * show up in the min or max themselves. */
typedef struct {
    __m256 lo, hi, nan;
} minmax_acc;

AVX2_INLINE void minmax_step(minmax_acc *a, __m256 v) {
    a->lo = _mm256_min_ps(v, a->lo);
    a->hi = _mm256_max_ps(v, a->hi);
    a->nan = _mm256_or_ps(a->nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

/* Four vectors at once: a tree, so each accumulator takes one dependent op per step, and one
 * unordered compare per pair of vectors. */
AVX2_INLINE void minmax_step4(minmax_acc *a, const float *p) {
    __m256 v0 = _mm256_loadu_ps(p), v1 = _mm256_loadu_ps(p + 8);
    __m256 v2 = _mm256_loadu_ps(p + 16), v3 = _mm256_loadu_ps(p + 24);
    __m256 lo = _mm256_min_ps(_mm256_min_ps(v0, v1), _mm256_min_ps(v2, v3));
    __m256 hi = _mm256_max_ps(_mm256_max_ps(v0, v1), _mm256_max_ps(v2, v3));
    __m256 nan = _mm256_or_ps(_mm256_cmp_ps(v0, v1, _CMP_UNORD_Q),
                              _mm256_cmp_ps(v2, v3, _CMP_UNORD_Q));
    a->lo = _mm256_min_ps(lo, a->lo);
    a->hi = _mm256_max_ps(hi, a->hi);
    a->nan = _mm256_or_ps(a->nan, nan);
}

AVX2_INLINE float hmin(__m256 v) {
    __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_min_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_min_ss(m, _mm_shuffle_ps(m, m, 1)));
}

AVX2_INLINE float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

AVX2_FN int minmax_avx2(const float *x, size_t n, float *mn, float *mx) {
    /* Fewer than 8 elements: pad with x[0], as a repeat changes neither extreme nor verdict. */
    float pad[8];
    const float *p = x;
    size_t m = n;
    if (n < 8) {
        for (size_t i = 0; i < 8; i++) pad[i] = x[i < n ? i : 0];
        p = pad;
        m = 8;
    }
    __m256 first = _mm256_loadu_ps(p);
    minmax_acc acc = {first, first, _mm256_setzero_ps()};
    size_t i = 0;
    for (; i + 32 <= m; i += 32) minmax_step4(&acc, p + i);
    for (; i + 8 <= m; i += 8) minmax_step(&acc, _mm256_loadu_ps(p + i));
    if (i < m) minmax_step(&acc, _mm256_loadu_ps(p + m - 8)); /* overlaps: repeats are harmless */
    float lo = hmin(acc.lo), hi = hmax(acc.hi);
    /* Without NaNs the extremes are exact, so an infinity would be one of them. */
    int nonfinite = _mm256_movemask_ps(acc.nan) != 0 || isinf(lo) || isinf(hi);
    *mn = lo;
    *mx = hi;
    return nonfinite;
}

/* ---- quantize ---- */

typedef struct {
    __m256 mn, inv;
    __m256i key;
    __m128i levels;
} quant_params;

AVX2_INLINE __m256i mix32(__m256i x) {
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)AC_HASH_MUL1));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)AC_HASH_MUL2));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

/* ac_uniform_bits(key, index) * 2^-24 for 8 lanes, given index * AC_HASH_GOLDEN (h). */
AVX2_INLINE __m256 uniform8(__m256i h, __m256i key) {
    __m256i bits = _mm256_srli_epi32(mix32(_mm256_xor_si256(h, key)), 8);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(bits), _mm256_set1_ps(AC_U24_SCALE));
}

/* Unclamped codes of 8 elements as int32 in [0, 2^23]; h as for uniform8. */
AVX2_INLINE __m256i code8(int kind, const float *x, const quant_params *q, __m256i h) {
    const __m256 magic = _mm256_set1_ps(AC_MAGIC_F);
    const __m256i magic_bits = _mm256_set1_epi32((int)AC_MAGIC_BITS);
    __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x), q->mn), q->inv);
    if (kind == AC_Q_NEAREST_TRICK)
        return _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(t, magic)), magic_bits);
    if (kind == AC_Q_NEAREST_CAST) return _mm256_cvtps_epi32(t); /* MXCSR: nearest even */
    __m256 y = _mm256_add_ps(t, uniform8(h, q->key));
    if (kind == AC_Q_FLOOR_CAST) return _mm256_cvttps_epi32(y); /* truncation = floor, y >= 0 */
    /* rint(y) from the magic add, minus one where it rounded up. */
    __m256 m = _mm256_add_ps(y, magic);
    __m256 up = _mm256_cmp_ps(_mm256_sub_ps(m, magic), y, _CMP_GT_OQ);
    return _mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(m), magic_bits),
                            _mm256_castps_si256(up));
}

/* 32 codes from x[0, 32), whose first element has index idx. */
AVX2_INLINE void quantize32(int kind, const float *x, uint32_t idx, const quant_params *q,
                            uint8_t *codes) {
    /* idx * golden per lane, built by adds: lane i gets i * golden more. */
    const __m256i lane = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                            _mm256_set1_epi32((int)AC_HASH_GOLDEN));
    const __m256i step = _mm256_set1_epi32((int)(8u * AC_HASH_GOLDEN));
    __m256i h = _mm256_add_epi32(_mm256_set1_epi32((int)(idx * AC_HASH_GOLDEN)), lane);
    __m256i a = code8(kind, x, q, h);
    __m256i b = code8(kind, x + 8, q, h = _mm256_add_epi32(h, step));
    __m256i c = code8(kind, x + 16, q, h = _mm256_add_epi32(h, step));
    __m256i d = code8(kind, x + 24, q, _mm256_add_epi32(h, step));
    /* Saturating packs turn codes above 255 into 255; min then clamps to levels. The packs
     * interleave 128-bit lanes: dwords come out as a0 b0 c0 d0 a1 b1 c1 d1. */
    __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    bytes = _mm256_min_epu8(bytes, _mm256_broadcastb_epi8(q->levels));
    _mm256_storeu_si256((__m256i *)codes, bytes);
}

AVX2_INLINE void quantize_run(int kind, const float *x, size_t n, float mn, float inv,
                              uint32_t levels, uint32_t key, uint32_t idx0, uint8_t *codes) {
    const quant_params q = {_mm256_set1_ps(mn), _mm256_set1_ps(inv), _mm256_set1_epi32((int)key),
                            _mm_cvtsi32_si128((int)levels)};
#define QUANTIZE_STEP(i, s, d) \
    quantize32(kind, (const float *)(s), idx0 + (uint32_t)(i), &q, (uint8_t *)(d))
    AC_ELEMENTWISE(32, n, x, 4, codes, 1, QUANTIZE_STEP);
#undef QUANTIZE_STEP
}

#define DEFINE_QUANTIZE(NAME, KIND)                                                        \
    AVX2_FN void NAME(const float *x, size_t n, float mn, float inv, uint32_t levels,        \
                      uint32_t key, uint32_t idx0, uint8_t *codes) {                         \
        quantize_run(KIND, x, n, mn, inv, levels, key, idx0, codes);                         \
    }
DEFINE_QUANTIZE(quantize_trick_nearest, AC_Q_NEAREST_TRICK)
DEFINE_QUANTIZE(quantize_cast_nearest, AC_Q_NEAREST_CAST)
DEFINE_QUANTIZE(quantize_trick_stochastic, AC_Q_FLOOR_TRICK)
DEFINE_QUANTIZE(quantize_cast_stochastic, AC_Q_FLOOR_CAST)
AC_DEFINE_GROUP_KERNELS(AVX2_FN, minmax_avx2, quantize_run)

/* ---- dequantize ---- */

AVX2_INLINE void dequantize32(int trick, const uint8_t *codes, __m256 mn, __m256 scale,
                              float *out) {
    for (int j = 0; j < 4; j++) {
        __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 8 * j)));
        __m256 f = trick ? _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(
                                             c, _mm256_set1_epi32((int)AC_MAGIC_BITS))),
                                         _mm256_set1_ps(AC_MAGIC_F))
                         : _mm256_cvtepi32_ps(c);
        _mm256_storeu_ps(out + 8 * j, _mm256_add_ps(mn, _mm256_mul_ps(f, scale)));
    }
}

AVX2_INLINE void dequantize_run(int trick, const uint8_t *codes, size_t n, float mn, float scale,
                                float *out) {
    const __m256 vmn = _mm256_set1_ps(mn), vscale = _mm256_set1_ps(scale);
#define DEQUANTIZE_STEP(i, s, d) dequantize32(trick, (s), vmn, vscale, (float *)(d))
    AC_ELEMENTWISE(32, n, codes, 1, out, 4, DEQUANTIZE_STEP);
#undef DEQUANTIZE_STEP
}

AVX2_FN void dequantize_trick(const uint8_t *c, size_t n, float mn, float scale, float *out) {
    dequantize_run(1, c, n, mn, scale, out);
}
AVX2_FN void dequantize_cast(const uint8_t *c, size_t n, float mn, float scale, float *out) {
    dequantize_run(0, c, n, mn, scale, out);
}
AC_DEFINE_DEQUANTIZE_GROUPS(AVX2_FN, dequantize_run)

/* ---- bit packing: byte j of a block holds codes j + 32 i at bit offset bits * i ---- */

AVX2_INLINE __m256i load32(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

AVX2_INLINE void pack_run(int bits, const uint8_t *codes, size_t nblocks, uint8_t *out) {
    const int k = 8 / bits;
    for (size_t b = 0; b < nblocks; b++, codes += 32 * k, out += 32) {
        /* Horner from the top row; the partial byte stays below 2^(8 - bits) before each
         * shift, so 16-bit shifts never carry into the neighbouring byte. */
        __m256i acc = load32(codes + 32 * (k - 1));
        for (int i = k - 2; i >= 0; i--)
            acc = _mm256_or_si256(_mm256_slli_epi16(acc, bits), load32(codes + 32 * i));
        _mm256_storeu_si256((__m256i *)out, acc);
    }
}

AVX2_INLINE void unpack_run(int bits, const uint8_t *in, size_t nblocks, uint8_t *codes) {
    const int k = 8 / bits;
    const __m256i mask = _mm256_set1_epi8((char)((1 << bits) - 1));
    for (size_t b = 0; b < nblocks; b++, in += 32, codes += 32 * k) {
        /* Bits the 16-bit shifts bring in from the next byte land above the mask. */
        __m256i v = load32(in);
        for (int i = 0; i < k; i++, v = _mm256_srli_epi16(v, bits))
            _mm256_storeu_si256((__m256i *)(codes + 32 * i), _mm256_and_si256(v, mask));
    }
}

#define DEFINE_PACK(BITS)                                                                  \
    AVX2_FN void pack_##BITS(const uint8_t *codes, size_t nblocks, uint8_t *out) {           \
        pack_run(BITS, codes, nblocks, out);                                                 \
    }                                                                                        \
    AVX2_FN void unpack_##BITS(const uint8_t *in, size_t nblocks, uint8_t *codes) {          \
        unpack_run(BITS, in, nblocks, codes);                                                \
    }
DEFINE_PACK(1)
DEFINE_PACK(2)
DEFINE_PACK(4)

/* ---- dtype conversions, 8 elements per step ---- */

AVX2_INLINE void f16_to_f32_8(const unsigned char *s, float *d) {
    __m128i h = _mm_loadu_si128((const __m128i *)s);
    __m256 f = _mm256_cvtph_ps(h);
    /* F16C quiets signalling NaNs (sets mantissa bit 22); the reference carries the payload
     * over unchanged, so clear that bit again where it came from a clear half bit 9. */
    __m256i half_bits = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 13);
    __m256i nan_quiet = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q)),
                                         _mm256_set1_epi32(0x400000));
    __m256i clear = _mm256_andnot_si256(half_bits, nan_quiet);
    _mm256_storeu_ps(d, _mm256_andnot_ps(_mm256_castsi256_ps(clear), f));
}

AVX2_INLINE void f32_to_f16_8(const float *s, unsigned char *d) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128((__m128i *)d, h);
}

AVX2_INLINE void bf16_to_f32_8(const unsigned char *s, float *d) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)s));
    _mm256_storeu_si256((__m256i *)d, _mm256_slli_epi32(w, 16));
}

AVX2_INLINE void f32_to_bf16_8(const float *s, unsigned char *d) {
    __m256i x = _mm256_loadu_si256((const __m256i *)s);
    /* Round to nearest even on the dropped half; NaN: keep the top bits, forced quiet. */
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(x, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF)),
                                     _mm256_set1_epi32(0x7F800000));
    __m256i quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x400000));
    /* Arithmetic shift: every high half fits int16 as a signed value, so packs is exact. */
    __m256i hi = _mm256_srai_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
    __m128i h = _mm_packs_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
    _mm_storeu_si128((__m128i *)d, h);
}

AVX2_INLINE void f64_to_f32_8(const unsigned char *s, float *d) {
    /* vcvtpd2ps rounds by MXCSR (nearest even), as the scalar cast does. */
    __m128 lo = _mm256_cvtpd_ps(_mm256_loadu_pd((const double *)s));
    __m128 hi = _mm256_cvtpd_ps(_mm256_loadu_pd((const double *)(s + 32)));
    _mm256_storeu_ps(d, _mm256_set_m128(hi, lo));
}

AVX2_INLINE void f32_to_f64_8(const float *s, unsigned char *d) {
    _mm256_storeu_pd((double *)d, _mm256_cvtps_pd(_mm_loadu_ps(s)));
    _mm256_storeu_pd((double *)(d + 32), _mm256_cvtps_pd(_mm_loadu_ps(s + 4)));
}

#define F16_TO_F32(i, s, d) f16_to_f32_8((s), (float *)(d))
#define BF16_TO_F32(i, s, d) bf16_to_f32_8((s), (float *)(d))
#define F64_TO_F32(i, s, d) f64_to_f32_8((s), (float *)(d))
#define F32_TO_F16(i, s, d) f32_to_f16_8((const float *)(s), (d))
#define F32_TO_BF16(i, s, d) f32_to_bf16_8((const float *)(s), (d))
#define F32_TO_F64(i, s, d) f32_to_f64_8((const float *)(s), (d))

AC_DEFINE_TO_F32(AVX2_FN, f16_to_f32_n, F16_TO_F32, 2)
AC_DEFINE_TO_F32(AVX2_FN, bf16_to_f32_n, BF16_TO_F32, 2)
AC_DEFINE_TO_F32(AVX2_FN, f64_to_f32_n, F64_TO_F32, 8)
AC_DEFINE_FROM_F32(AVX2_FN, f32_to_f16_n, F32_TO_F16, 2)
AC_DEFINE_FROM_F32(AVX2_FN, f32_to_bf16_n, F32_TO_BF16, 2)
AC_DEFINE_FROM_F32(AVX2_FN, f32_to_f64_n, F32_TO_F64, 8)

int ac_quant_kernels_avx2(ac_kernels *k) {
    AC_FILL_QUANT_TABLE(k, minmax_avx2, ac_pack8_copy, ac_unpack8_copy);
    AC_FILL_F16_CONVERSIONS(k);
    AC_FILL_BF16_F64_CONVERSIONS(k);
    return 1;
}

#else

int ac_quant_kernels_avx2(ac_kernels *k) {
    (void)k;
    return 0;
}

#endif
