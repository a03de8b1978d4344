/* SSE2 quantization kernels (the x86-64 baseline, so no target attributes), bit-exact with
 * quant_scalar.c: min/max, quantize (16 codes per store), dequantize, bit packing, and the
 * bfloat16 and float64 conversions. float16 stays scalar: SSE2 has no conversion for it.
 * SSE2 lacks a 32-bit low multiply, so the stochastic-rounding hash builds one from pmuludq.
 * x86-64 only. */
#include "../runtime/kernels.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#include <math.h>
#include "quant_common.h"
#include "quant_simd.h"

/* ---- min / max ---- */

/* Lane-wise running min and max, and a mask of lanes that met a NaN: minps/maxps drop NaNs
 * (they return the second operand), so NaNs are caught by unordered compares, and infinities
 * show up in the min or max themselves. */
typedef struct {
    __m128 lo, hi, nan;
} minmax_acc;

static inline void minmax_step(minmax_acc *a, __m128 v) {
    a->lo = _mm_min_ps(v, a->lo);
    a->hi = _mm_max_ps(v, a->hi);
    a->nan = _mm_or_ps(a->nan, _mm_cmpunord_ps(v, v));
}

/* Four vectors at once: a tree, so each accumulator takes one dependent op per step, and one
 * unordered compare per pair of vectors. */
static inline void minmax_step4(minmax_acc *a, const float *p) {
    __m128 v0 = _mm_loadu_ps(p), v1 = _mm_loadu_ps(p + 4);
    __m128 v2 = _mm_loadu_ps(p + 8), v3 = _mm_loadu_ps(p + 12);
    __m128 lo = _mm_min_ps(_mm_min_ps(v0, v1), _mm_min_ps(v2, v3));
    __m128 hi = _mm_max_ps(_mm_max_ps(v0, v1), _mm_max_ps(v2, v3));
    __m128 nan = _mm_or_ps(_mm_cmpunord_ps(v0, v1), _mm_cmpunord_ps(v2, v3));
    a->lo = _mm_min_ps(lo, a->lo);
    a->hi = _mm_max_ps(hi, a->hi);
    a->nan = _mm_or_ps(a->nan, nan);
}

static inline float hmin(__m128 m) {
    m = _mm_min_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_min_ss(m, _mm_shuffle_ps(m, m, 1)));
}

static inline float hmax(__m128 m) {
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

static int minmax_sse2(const float *x, size_t n, float *mn, float *mx) {
    /* Fewer than 4 elements: pad with x[0], as a repeat changes neither extreme nor verdict. */
    float pad[4];
    const float *p = x;
    size_t m = n;
    if (n < 4) {
        for (size_t i = 0; i < 4; i++) pad[i] = x[i < n ? i : 0];
        p = pad;
        m = 4;
    }
    __m128 first = _mm_loadu_ps(p);
    minmax_acc acc = {first, first, _mm_setzero_ps()};
    size_t i = 0;
    for (; i + 16 <= m; i += 16) minmax_step4(&acc, p + i);
    for (; i + 4 <= m; i += 4) minmax_step(&acc, _mm_loadu_ps(p + i));
    if (i < m) minmax_step(&acc, _mm_loadu_ps(p + m - 4)); /* overlaps: repeats are harmless */
    float lo = hmin(acc.lo), hi = hmax(acc.hi);
    /* Without NaNs the extremes are exact, so an infinity would be one of them. */
    int nonfinite = _mm_movemask_ps(acc.nan) != 0 || isinf(lo) || isinf(hi);
    *mn = lo;
    *mx = hi;
    return nonfinite;
}

/* ---- quantize ---- */

typedef struct {
    __m128 mn, inv;
    __m128i key, levels;
} quant_params;

/* Low 32 bits of a * c per lane, c a broadcast constant: pmuludq multiplies lanes 0 and 2,
 * a second one the odd lanes shifted down, and the low halves are interleaved back. */
static inline __m128i mullo32(__m128i a, __m128i c) {
    __m128i even = _mm_mul_epu32(a, c), odd = _mm_mul_epu32(_mm_srli_epi64(a, 32), c);
    return _mm_unpacklo_epi32(_mm_shuffle_epi32(even, _MM_SHUFFLE(0, 0, 2, 0)),
                              _mm_shuffle_epi32(odd, _MM_SHUFFLE(0, 0, 2, 0)));
}

static inline __m128i mix32(__m128i x) {
    x = _mm_xor_si128(x, _mm_srli_epi32(x, 16));
    x = mullo32(x, _mm_set1_epi32((int)AC_HASH_MUL1));
    x = _mm_xor_si128(x, _mm_srli_epi32(x, 15));
    x = mullo32(x, _mm_set1_epi32((int)AC_HASH_MUL2));
    return _mm_xor_si128(x, _mm_srli_epi32(x, 16));
}

/* ac_uniform_bits(key, index) * 2^-24 for 4 lanes, given index * AC_HASH_GOLDEN (h). */
static inline __m128 uniform4(__m128i h, __m128i key) {
    __m128i bits = _mm_srli_epi32(mix32(_mm_xor_si128(h, key)), 8);
    return _mm_mul_ps(_mm_cvtepi32_ps(bits), _mm_set1_ps(AC_U24_SCALE));
}

/* Unclamped codes of 4 elements as int32 in [0, 2^23]; h as for uniform4. */
static inline __m128i code4(int kind, const float *x, const quant_params *q, __m128i h) {
    const __m128 magic = _mm_set1_ps(AC_MAGIC_F);
    const __m128i magic_bits = _mm_set1_epi32((int)AC_MAGIC_BITS);
    __m128 t = _mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(x), q->mn), q->inv);
    if (kind == AC_Q_NEAREST_TRICK)
        return _mm_sub_epi32(_mm_castps_si128(_mm_add_ps(t, magic)), magic_bits);
    if (kind == AC_Q_NEAREST_CAST) return _mm_cvtps_epi32(t); /* MXCSR: nearest even */
    __m128 y = _mm_add_ps(t, uniform4(h, q->key));
    if (kind == AC_Q_FLOOR_CAST) return _mm_cvttps_epi32(y); /* truncation = floor, y >= 0 */
    /* rint(y) from the magic add, minus one where it rounded up. */
    __m128 m = _mm_add_ps(y, magic);
    __m128 up = _mm_cmpgt_ps(_mm_sub_ps(m, magic), y);
    return _mm_add_epi32(_mm_sub_epi32(_mm_castps_si128(m), magic_bits), _mm_castps_si128(up));
}

/* 16 codes from x[0, 16), whose first element has index idx. */
static inline void quantize16(int kind, const float *x, uint32_t idx, const quant_params *q,
                              uint8_t *codes) {
    /* idx * golden per lane, built by adds: lane i gets i * golden more. */
    const __m128i lane = _mm_setr_epi32(0, (int)AC_HASH_GOLDEN, (int)(2u * AC_HASH_GOLDEN),
                                        (int)(3u * AC_HASH_GOLDEN));
    const __m128i step = _mm_set1_epi32((int)(4u * AC_HASH_GOLDEN));
    __m128i h = _mm_add_epi32(_mm_set1_epi32((int)(idx * AC_HASH_GOLDEN)), lane);
    __m128i a = code4(kind, x, q, h);
    __m128i b = code4(kind, x + 4, q, h = _mm_add_epi32(h, step));
    __m128i c = code4(kind, x + 8, q, h = _mm_add_epi32(h, step));
    __m128i d = code4(kind, x + 12, q, _mm_add_epi32(h, step));
    /* Saturating packs turn codes above 255 into 255; min then clamps to levels. */
    __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d));
    _mm_storeu_si128((__m128i *)codes, _mm_min_epu8(bytes, q->levels));
}

static inline __attribute__((always_inline)) void quantize_run(int kind, const float *x,
                                                               size_t n, float mn, float inv,
                                                               uint32_t levels, uint32_t key,
                                                               uint32_t idx0, uint8_t *codes) {
    const quant_params q = {_mm_set1_ps(mn), _mm_set1_ps(inv), _mm_set1_epi32((int)key),
                            _mm_set1_epi8((char)levels)};
#define QUANTIZE_STEP(i, s, d) \
    quantize16(kind, (const float *)(s), idx0 + (uint32_t)(i), &q, (uint8_t *)(d))
    AC_ELEMENTWISE(16, n, x, 4, codes, 1, QUANTIZE_STEP);
#undef QUANTIZE_STEP
}

#define DEFINE_QUANTIZE(NAME, KIND)                                                        \
    static void NAME(const float *x, size_t n, float mn, float inv, uint32_t levels,         \
                     uint32_t key, uint32_t idx0, uint8_t *codes) {                          \
        quantize_run(KIND, x, n, mn, inv, levels, key, idx0, codes);                         \
    }
DEFINE_QUANTIZE(quantize_trick_nearest, AC_Q_NEAREST_TRICK)
DEFINE_QUANTIZE(quantize_cast_nearest, AC_Q_NEAREST_CAST)
DEFINE_QUANTIZE(quantize_trick_stochastic, AC_Q_FLOOR_TRICK)
DEFINE_QUANTIZE(quantize_cast_stochastic, AC_Q_FLOOR_CAST)
AC_DEFINE_GROUP_KERNELS(static, minmax_sse2, quantize_run)

/* ---- dequantize ---- */

static inline void dequantize16(int trick, const uint8_t *codes, __m128 mn, __m128 scale,
                                float *out) {
    const __m128i zero = _mm_setzero_si128();
    __m128i v = _mm_loadu_si128((const __m128i *)codes);
    __m128i w[2] = {_mm_unpacklo_epi8(v, zero), _mm_unpackhi_epi8(v, zero)};
    for (int j = 0; j < 4; j++) {
        __m128i c = (j & 1) ? _mm_unpackhi_epi16(w[j >> 1], zero)
                            : _mm_unpacklo_epi16(w[j >> 1], zero);
        __m128 f = trick ? _mm_sub_ps(_mm_castsi128_ps(_mm_or_si128(
                                          c, _mm_set1_epi32((int)AC_MAGIC_BITS))),
                                      _mm_set1_ps(AC_MAGIC_F))
                         : _mm_cvtepi32_ps(c);
        _mm_storeu_ps(out + 4 * j, _mm_add_ps(mn, _mm_mul_ps(f, scale)));
    }
}

static inline __attribute__((always_inline)) void dequantize_run(int trick, const uint8_t *codes,
                                                                 size_t n, float mn,
                                                                 float scale, float *out) {
    const __m128 vmn = _mm_set1_ps(mn), vscale = _mm_set1_ps(scale);
#define DEQUANTIZE_STEP(i, s, d) dequantize16(trick, (s), vmn, vscale, (float *)(d))
    AC_ELEMENTWISE(16, n, codes, 1, out, 4, DEQUANTIZE_STEP);
#undef DEQUANTIZE_STEP
}

static void dequantize_trick(const uint8_t *c, size_t n, float mn, float scale, float *out) {
    dequantize_run(1, c, n, mn, scale, out);
}
static void dequantize_cast(const uint8_t *c, size_t n, float mn, float scale, float *out) {
    dequantize_run(0, c, n, mn, scale, out);
}
AC_DEFINE_DEQUANTIZE_GROUPS(static, dequantize_run)

/* ---- bit packing: byte j of a block holds codes j + 32 i at bit offset bits * i ---- */

static inline __m128i load16(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }

static inline __attribute__((always_inline)) void pack_run(int bits, const uint8_t *codes,
                                                           size_t nblocks, uint8_t *out) {
    const int k = 8 / bits;
    for (size_t b = 0; b < nblocks; b++, codes += 32 * k, out += 32)
        for (int half = 0; half < 32; half += 16) {
            /* Horner from the top row; the partial byte stays below 2^(8 - bits) before each
             * shift, so 16-bit shifts never carry into the neighbouring byte. */
            __m128i acc = load16(codes + 32 * (k - 1) + half);
            for (int i = k - 2; i >= 0; i--)
                acc = _mm_or_si128(_mm_slli_epi16(acc, bits), load16(codes + 32 * i + half));
            _mm_storeu_si128((__m128i *)(out + half), acc);
        }
}

static inline __attribute__((always_inline)) void unpack_run(int bits, const uint8_t *in,
                                                             size_t nblocks, uint8_t *codes) {
    const int k = 8 / bits;
    const __m128i mask = _mm_set1_epi8((char)((1 << bits) - 1));
    for (size_t b = 0; b < nblocks; b++, in += 32, codes += 32 * k)
        for (int half = 0; half < 32; half += 16) {
            /* Bits the 16-bit shifts bring in from the next byte land above the mask. */
            __m128i v = load16(in + half);
            for (int i = 0; i < k; i++, v = _mm_srli_epi16(v, bits))
                _mm_storeu_si128((__m128i *)(codes + 32 * i + half), _mm_and_si128(v, mask));
        }
}

#define DEFINE_PACK(BITS)                                                                  \
    static void pack_##BITS(const uint8_t *codes, size_t nblocks, uint8_t *out) {            \
        pack_run(BITS, codes, nblocks, out);                                                 \
    }                                                                                        \
    static void unpack_##BITS(const uint8_t *in, size_t nblocks, uint8_t *codes) {           \
        unpack_run(BITS, in, nblocks, codes);                                                \
    }
DEFINE_PACK(1)
DEFINE_PACK(2)
DEFINE_PACK(4)

/* ---- bfloat16 and float64 conversions, 8 elements per step ---- */

static inline void bf16_to_f32_8(const unsigned char *s, float *d) {
    /* Interleaving zero words below each half makes it the high half of a float. */
    __m128i h = _mm_loadu_si128((const __m128i *)s), zero = _mm_setzero_si128();
    _mm_storeu_si128((__m128i *)d, _mm_unpacklo_epi16(zero, h));
    _mm_storeu_si128((__m128i *)(d + 4), _mm_unpackhi_epi16(zero, h));
}

/* High halves of 4 floats rounded to bfloat16, as int32 in [-32768, 32767]. */
static inline __m128i bf16_of4(const float *s) {
    __m128i x = _mm_loadu_si128((const __m128i *)s);
    /* Round to nearest even on the dropped half; NaN: keep the top bits, forced quiet. */
    __m128i odd = _mm_and_si128(_mm_srli_epi32(x, 16), _mm_set1_epi32(1));
    __m128i rounded = _mm_add_epi32(x, _mm_add_epi32(odd, _mm_set1_epi32(0x7FFF)));
    __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(x, _mm_set1_epi32(0x7FFFFFFF)),
                                  _mm_set1_epi32(0x7F800000));
    __m128i quiet = _mm_or_si128(x, _mm_set1_epi32(0x400000));
    __m128i pick = _mm_or_si128(_mm_and_si128(nan, quiet), _mm_andnot_si128(nan, rounded));
    /* Arithmetic shift: every high half fits int16 as a signed value, so packs is exact. */
    return _mm_srai_epi32(pick, 16);
}

static inline void f32_to_bf16_8(const float *s, unsigned char *d) {
    _mm_storeu_si128((__m128i *)d, _mm_packs_epi32(bf16_of4(s), bf16_of4(s + 4)));
}

static inline void f64_to_f32_8(const unsigned char *s, float *d) {
    /* cvtpd2ps rounds by MXCSR (nearest even), as the scalar cast does. */
    for (int j = 0; j < 8; j += 4) {
        __m128 lo = _mm_cvtpd_ps(_mm_loadu_pd((const double *)(s + 8 * j)));
        __m128 hi = _mm_cvtpd_ps(_mm_loadu_pd((const double *)(s + 8 * j + 16)));
        _mm_storeu_ps(d + j, _mm_movelh_ps(lo, hi));
    }
}

static inline void f32_to_f64_8(const float *s, unsigned char *d) {
    for (int j = 0; j < 8; j += 4) {
        __m128 v = _mm_loadu_ps(s + j);
        _mm_storeu_pd((double *)(d + 8 * j), _mm_cvtps_pd(v));
        _mm_storeu_pd((double *)(d + 8 * j + 16), _mm_cvtps_pd(_mm_movehl_ps(v, v)));
    }
}

#define BF16_TO_F32(i, s, d) bf16_to_f32_8((s), (float *)(d))
#define F64_TO_F32(i, s, d) f64_to_f32_8((s), (float *)(d))
#define F32_TO_BF16(i, s, d) f32_to_bf16_8((const float *)(s), (d))
#define F32_TO_F64(i, s, d) f32_to_f64_8((const float *)(s), (d))

AC_DEFINE_TO_F32(static, bf16_to_f32_n, BF16_TO_F32, 2)
AC_DEFINE_TO_F32(static, f64_to_f32_n, F64_TO_F32, 8)
AC_DEFINE_FROM_F32(static, f32_to_bf16_n, F32_TO_BF16, 2)
AC_DEFINE_FROM_F32(static, f32_to_f64_n, F32_TO_F64, 8)

int ac_quant_kernels_sse2(ac_kernels *k) {
    AC_FILL_QUANT_TABLE(k, minmax_sse2, ac_pack8_copy, ac_unpack8_copy);
    AC_FILL_BF16_F64_CONVERSIONS(k);
    return 1;
}

#else

int ac_quant_kernels_sse2(ac_kernels *k) {
    (void)k;
    return 0;
}

#endif
