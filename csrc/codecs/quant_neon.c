/* NEON quantization kernels (baseline on AArch64), bit-exact with quant_scalar.c: min/max,
 * quantize (16 codes per store), dequantize, bit packing with shift-and-insert, and the
 * float16 / bfloat16 / float64 conversions. Separate multiply and add intrinsics stay
 * separate instructions under ISO C (no contraction). Little-endian AArch64 only. */
#include "../runtime/kernels.h"

/* The lane reinterprets assume little-endian element order. */
#if defined(__aarch64__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#include <arm_neon.h>
#include <math.h>
#include "quant_common.h"
#include "quant_simd.h"

/* ---- min / max ---- */

/* Four vectors into lane-wise running min and max: a tree, so each accumulator takes one
 * dependent op per step. fmin/fmax return NaN when either input is NaN, so a NaN anywhere
 * reaches both results, and an infinity is an extreme itself. */
static inline void minmax_step4(float32x4_t *lo, float32x4_t *hi, const float *p) {
    float32x4_t v0 = vld1q_f32(p), v1 = vld1q_f32(p + 4), v2 = vld1q_f32(p + 8),
                v3 = vld1q_f32(p + 12);
    *lo = vminq_f32(vminq_f32(vminq_f32(v0, v1), vminq_f32(v2, v3)), *lo);
    *hi = vmaxq_f32(vmaxq_f32(vmaxq_f32(v0, v1), vmaxq_f32(v2, v3)), *hi);
}

static int minmax_neon(const float *x, size_t n, float *mn, float *mx) {
    /* Fewer than 4 elements: pad with x[0], as a repeat changes neither extreme nor verdict. */
    float pad[4];
    const float *p = x;
    size_t m = n;
    if (n < 4) {
        for (size_t i = 0; i < 4; i++) pad[i] = x[i < n ? i : 0];
        p = pad;
        m = 4;
    }
    float32x4_t lo4 = vld1q_f32(p), hi4 = lo4;
    size_t i = 0;
    for (; i + 16 <= m; i += 16) minmax_step4(&lo4, &hi4, p + i);
    for (; i + 4 <= m; i += 4) {
        lo4 = vminq_f32(vld1q_f32(p + i), lo4);
        hi4 = vmaxq_f32(vld1q_f32(p + i), hi4);
    }
    if (i < m) { /* overlaps: repeats are harmless */
        lo4 = vminq_f32(vld1q_f32(p + m - 4), lo4);
        hi4 = vmaxq_f32(vld1q_f32(p + m - 4), hi4);
    }
    float lo = vminvq_f32(lo4), hi = vmaxvq_f32(hi4);
    int nonfinite = !isfinite(lo) || !isfinite(hi);
    *mn = lo;
    *mx = hi;
    return nonfinite;
}

/* ---- quantize ---- */

typedef struct {
    float32x4_t mn, inv;
    uint32x4_t key;
    uint8x16_t levels;
} quant_params;

static inline uint32x4_t mix32(uint32x4_t x) {
    x = veorq_u32(x, vshrq_n_u32(x, 16));
    x = vmulq_n_u32(x, AC_HASH_MUL1);
    x = veorq_u32(x, vshrq_n_u32(x, 15));
    x = vmulq_n_u32(x, AC_HASH_MUL2);
    return veorq_u32(x, vshrq_n_u32(x, 16));
}

/* ac_uniform_bits(key, index) * 2^-24 for 4 lanes, given index * AC_HASH_GOLDEN (h). */
static inline float32x4_t uniform4(uint32x4_t h, uint32x4_t key) {
    uint32x4_t bits = vshrq_n_u32(mix32(veorq_u32(h, key)), 8);
    return vmulq_n_f32(vcvtq_f32_u32(bits), AC_U24_SCALE);
}

/* Unclamped codes of 4 elements in [0, 2^23]; h as for uniform4. */
static inline uint32x4_t code4(int kind, const float *x, const quant_params *q, uint32x4_t h) {
    const float32x4_t magic = vdupq_n_f32(AC_MAGIC_F);
    const uint32x4_t magic_bits = vdupq_n_u32(AC_MAGIC_BITS);
    float32x4_t t = vmulq_f32(vsubq_f32(vld1q_f32(x), q->mn), q->inv);
    if (kind == AC_Q_NEAREST_TRICK)
        return vsubq_u32(vreinterpretq_u32_f32(vaddq_f32(t, magic)), magic_bits);
    if (kind == AC_Q_NEAREST_CAST) return vcvtnq_u32_f32(t); /* nearest even */
    float32x4_t y = vaddq_f32(t, uniform4(h, q->key));
    if (kind == AC_Q_FLOOR_CAST) return vcvtq_u32_f32(y); /* truncation = floor, y >= 0 */
    /* rint(y) from the magic add, minus one (all-ones mask) where it rounded up. */
    float32x4_t m = vaddq_f32(y, magic);
    uint32x4_t up = vcgtq_f32(vsubq_f32(m, magic), y);
    return vaddq_u32(vsubq_u32(vreinterpretq_u32_f32(m), magic_bits), up);
}

/* 16 codes from x[0, 16), whose first element has index idx. */
static inline void quantize16(int kind, const float *x, uint32_t idx, const quant_params *q,
                              uint8_t *codes) {
    /* idx * golden per lane, built by adds: lane i gets i * golden more. */
    static const uint32_t lane_golden[4] = {0, AC_HASH_GOLDEN, 2u * AC_HASH_GOLDEN,
                                            3u * AC_HASH_GOLDEN};
    const uint32x4_t step = vdupq_n_u32(4u * AC_HASH_GOLDEN);
    uint32x4_t h0 = vaddq_u32(vdupq_n_u32(idx * AC_HASH_GOLDEN), vld1q_u32(lane_golden));
    uint32x4_t h1 = vaddq_u32(h0, step), h2 = vaddq_u32(h1, step), h3 = vaddq_u32(h2, step);
    /* Saturating narrows turn codes above 255 into 255; min then clamps to levels. */
    uint16x8_t lo = vqmovn_high_u32(vqmovn_u32(code4(kind, x, q, h0)), code4(kind, x + 4, q, h1));
    uint16x8_t hi = vqmovn_high_u32(vqmovn_u32(code4(kind, x + 8, q, h2)),
                                    code4(kind, x + 12, q, h3));
    uint8x16_t bytes = vqmovn_high_u16(vqmovn_u16(lo), hi);
    vst1q_u8(codes, vminq_u8(bytes, q->levels));
}

static inline __attribute__((always_inline)) void quantize_run(int kind, const float *x,
                                                               size_t n, float mn, float inv,
                                                               uint32_t levels, uint32_t key,
                                                               uint32_t idx0, uint8_t *codes) {
    const quant_params q = {vdupq_n_f32(mn), vdupq_n_f32(inv), vdupq_n_u32(key),
                            vdupq_n_u8((uint8_t)levels)};
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
AC_DEFINE_GROUP_KERNELS(static, minmax_neon, quantize_run)

/* ---- dequantize ---- */

static inline float32x4_t code_float4(int trick, uint32x4_t c) {
    if (!trick) return vcvtq_f32_u32(c);
    float32x4_t f = vreinterpretq_f32_u32(vorrq_u32(c, vdupq_n_u32(AC_MAGIC_BITS)));
    return vsubq_f32(f, vdupq_n_f32(AC_MAGIC_F));
}

static inline void dequantize16(int trick, const uint8_t *codes, float32x4_t mn,
                                float32x4_t scale, float *out) {
    uint8x16_t v = vld1q_u8(codes);
    uint16x8_t w[2] = {vmovl_u8(vget_low_u8(v)), vmovl_high_u8(v)};
    for (int j = 0; j < 4; j++) {
        uint32x4_t c = (j & 1) ? vmovl_high_u16(w[j >> 1]) : vmovl_u16(vget_low_u16(w[j >> 1]));
        vst1q_f32(out + 4 * j, vaddq_f32(mn, vmulq_f32(code_float4(trick, c), scale)));
    }
}

static inline __attribute__((always_inline)) void dequantize_run(int trick, const uint8_t *codes,
                                                                 size_t n, float mn,
                                                                 float scale, float *out) {
    const float32x4_t vmn = vdupq_n_f32(mn), vscale = vdupq_n_f32(scale);
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

/* ---- bit packing: byte j of a block holds codes j + 32 i at bit offset bits * i ----
 * Shift counts must be immediates, so each width gets its own pair of functions. */

#define DEFINE_PACK(BITS)                                                                  \
    static void pack_##BITS(const uint8_t *codes, size_t nblocks, uint8_t *out) {            \
        const int k = 8 / BITS;                                                              \
        for (size_t b = 0; b < nblocks; b++, codes += 32 * k, out += 32)                     \
            for (int half = 0; half < 32; half += 16) {                                      \
                /* Horner from the top row: shift the partial byte up, insert the next. */   \
                uint8x16_t acc = vld1q_u8(codes + 32 * (k - 1) + half);                      \
                for (int i = k - 2; i >= 0; i--)                                             \
                    acc = vsliq_n_u8(vld1q_u8(codes + 32 * i + half), acc, BITS);            \
                vst1q_u8(out + half, acc);                                                   \
            }                                                                                \
    }                                                                                        \
    static void unpack_##BITS(const uint8_t *in, size_t nblocks, uint8_t *codes) {           \
        const int k = 8 / BITS;                                                              \
        const uint8x16_t mask = vdupq_n_u8((1u << BITS) - 1u);                               \
        for (size_t b = 0; b < nblocks; b++, in += 32, codes += 32 * k)                      \
            for (int half = 0; half < 32; half += 16) {                                      \
                uint8x16_t v = vld1q_u8(in + half);                                          \
                for (int i = 0; i < k; i++, v = vshrq_n_u8(v, BITS))                         \
                    vst1q_u8(codes + 32 * i + half, vandq_u8(v, mask));                      \
            }                                                                                \
    }
DEFINE_PACK(1)
DEFINE_PACK(2)
DEFINE_PACK(4)

/* ---- dtype conversions, 8 elements per step (byte loads: src/dst may be unaligned) ---- */

/* fcvtl quiets signalling NaNs (sets mantissa bit 22); the reference carries the payload over
 * unchanged, so clear that bit again where it came from a clear half bit 9. */
static inline float32x4_t f16_fix_nan(float32x4_t f, uint16x4_t h) {
    uint32x4_t quiet = vbicq_u32(vdupq_n_u32(0x400000), vceqq_f32(f, f)); /* NaN lanes */
    uint32x4_t clear = vbicq_u32(quiet, vshll_n_u16(h, 13));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(f), clear));
}

static inline void f16_to_f32_8(const unsigned char *s, float *d) {
    uint16x8_t h = vreinterpretq_u16_u8(vld1q_u8(s));
    float32x4_t lo = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h)));
    float32x4_t hi = vcvt_high_f32_f16(vreinterpretq_f16_u16(h));
    vst1q_f32(d, f16_fix_nan(lo, vget_low_u16(h)));
    vst1q_f32(d + 4, f16_fix_nan(hi, vget_high_u16(h)));
}

static inline void f32_to_f16_8(const float *s, unsigned char *d) {
    /* fcvtn rounds by FPCR (nearest even), NaNs come out quiet with the top payload bits. */
    float16x8_t h = vcvt_high_f16_f32(vcvt_f16_f32(vld1q_f32(s)), vld1q_f32(s + 4));
    vst1q_u8(d, vreinterpretq_u8_f16(h));
}

static inline void bf16_to_f32_8(const unsigned char *s, float *d) {
    uint16x8_t h = vreinterpretq_u16_u8(vld1q_u8(s));
    vst1q_f32(d, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)));
    vst1q_f32(d + 4, vreinterpretq_f32_u32(vshll_high_n_u16(h, 16)));
}

/* 4 floats rounded to bfloat16. */
static inline uint16x4_t bf16_of4(const float *s) {
    uint32x4_t x = vreinterpretq_u32_f32(vld1q_f32(s));
    /* Round to nearest even on the dropped half; NaN: keep the top bits, forced quiet. */
    uint32x4_t odd = vandq_u32(vshrq_n_u32(x, 16), vdupq_n_u32(1));
    uint32x4_t rounded = vaddq_u32(x, vaddq_u32(odd, vdupq_n_u32(0x7FFF)));
    uint32x4_t nan = vcgtq_u32(vandq_u32(x, vdupq_n_u32(0x7FFFFFFF)), vdupq_n_u32(0x7F800000));
    uint32x4_t quiet = vorrq_u32(x, vdupq_n_u32(0x400000));
    return vshrn_n_u32(vbslq_u32(nan, quiet, rounded), 16);
}

static inline void f32_to_bf16_8(const float *s, unsigned char *d) {
    vst1q_u8(d, vreinterpretq_u8_u16(vcombine_u16(bf16_of4(s), bf16_of4(s + 4))));
}

static inline void f64_to_f32_8(const unsigned char *s, float *d) {
    /* fcvtn rounds by FPCR (nearest even), as the scalar cast does. */
    for (int j = 0; j < 8; j += 4) {
        float64x2_t a = vreinterpretq_f64_u8(vld1q_u8(s + 8 * j));
        float64x2_t b = vreinterpretq_f64_u8(vld1q_u8(s + 8 * j + 16));
        vst1q_f32(d + j, vcvt_high_f32_f64(vcvt_f32_f64(a), b));
    }
}

static inline void f32_to_f64_8(const float *s, unsigned char *d) {
    for (int j = 0; j < 8; j += 4) {
        float32x4_t v = vld1q_f32(s + j);
        vst1q_u8(d + 8 * j, vreinterpretq_u8_f64(vcvt_f64_f32(vget_low_f32(v))));
        vst1q_u8(d + 8 * j + 16, vreinterpretq_u8_f64(vcvt_high_f64_f32(v)));
    }
}

#define F16_TO_F32(i, s, d) f16_to_f32_8((s), (float *)(d))
#define BF16_TO_F32(i, s, d) bf16_to_f32_8((s), (float *)(d))
#define F64_TO_F32(i, s, d) f64_to_f32_8((s), (float *)(d))
#define F32_TO_F16(i, s, d) f32_to_f16_8((const float *)(s), (d))
#define F32_TO_BF16(i, s, d) f32_to_bf16_8((const float *)(s), (d))
#define F32_TO_F64(i, s, d) f32_to_f64_8((const float *)(s), (d))

AC_DEFINE_TO_F32(static, f16_to_f32_n, F16_TO_F32, 2)
AC_DEFINE_TO_F32(static, bf16_to_f32_n, BF16_TO_F32, 2)
AC_DEFINE_TO_F32(static, f64_to_f32_n, F64_TO_F32, 8)
AC_DEFINE_FROM_F32(static, f32_to_f16_n, F32_TO_F16, 2)
AC_DEFINE_FROM_F32(static, f32_to_bf16_n, F32_TO_BF16, 2)
AC_DEFINE_FROM_F32(static, f32_to_f64_n, F32_TO_F64, 8)

int ac_quant_kernels_neon(ac_kernels *k) {
    AC_FILL_QUANT_TABLE(k, minmax_neon, ac_pack8_copy, ac_unpack8_copy);
    AC_FILL_F16_CONVERSIONS(k);
    AC_FILL_BF16_F64_CONVERSIONS(k);
    return 1;
}

#else

int ac_quant_kernels_neon(ac_kernels *k) {
    (void)k;
    return 0;
}

#endif
