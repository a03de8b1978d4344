/* Portable scalar quantization kernels: the statement of the math (actcodec.h) that every
 * SIMD path must reproduce bit for bit. */
#include <math.h>
#include "../runtime/kernels.h"
#include "quant_common.h"
#include "quant_simd.h"

static int minmax_scalar(const float *x, size_t n, float *mn, float *mx) {
    float lo = x[0], hi = x[0];
    uint32_t nonfinite = 0;
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        /* Exponent all ones: inf or NaN. Checked on the bits, so NaN cannot slip through. */
        nonfinite |= (ac_f32_to_bits(v) & 0x7F800000u) == 0x7F800000u;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    *mn = lo;
    *mx = hi;
    return nonfinite != 0;
}

/* float -> code, round to nearest even, for 0 <= t < 2^23. */
static inline uint32_t round_trick(float t) { return ac_f32_to_bits(t + AC_MAGIC_F) - AC_MAGIC_BITS; }
static inline uint32_t round_cast(float t) { return (uint32_t)lrintf(t); }
/* code -> float. */
static inline float code_trick(uint32_t c) { return ac_bits_to_f32(c | AC_MAGIC_BITS) - AC_MAGIC_F; }
static inline float code_cast(uint32_t c) { return (float)c; }

/* floor(y) for 0 <= y < 2^23: rint, then step down where rint rounded up. */
static inline uint32_t floor_trick(float y) {
    uint32_t r = round_trick(y);
    return r - (code_trick(r) > y);
}
static inline uint32_t floor_cast(float y) { return (uint32_t)y; /* truncation; y >= 0 */ }

#define DEFINE_QUANTIZE(NAME, NEAREST, FLOOR)                                               \
    static void NAME##_nearest(const float *x, size_t n, float mn, float inv,               \
                               uint32_t levels, uint32_t key, uint32_t idx0, uint8_t *c) {  \
        (void)key;                                                                          \
        (void)idx0;                                                                         \
        for (size_t i = 0; i < n; i++) {                                                    \
            uint32_t q = NEAREST((x[i] - mn) * inv);                                        \
            c[i] = (uint8_t)(q < levels ? q : levels);                                      \
        }                                                                                   \
    }                                                                                       \
    static void NAME##_stochastic(const float *x, size_t n, float mn, float inv,            \
                                  uint32_t levels, uint32_t key, uint32_t idx0,             \
                                  uint8_t *c) {                                             \
        for (size_t i = 0; i < n; i++) {                                                    \
            float u = (float)ac_uniform_bits(key, idx0 + (uint32_t)i) * AC_U24_SCALE;       \
            uint32_t q = FLOOR((x[i] - mn) * inv + u);                                      \
            c[i] = (uint8_t)(q < levels ? q : levels);                                      \
        }                                                                                   \
    }

DEFINE_QUANTIZE(quantize_trick, round_trick, floor_trick)
DEFINE_QUANTIZE(quantize_cast, round_cast, floor_cast)

/* The four kernels by kind, for the group kernels. */
static inline void quantize_run(int kind, const float *x, size_t n, float mn, float inv,
                                uint32_t levels, uint32_t key, uint32_t idx0, uint8_t *c) {
    if (kind == AC_Q_NEAREST_TRICK) quantize_trick_nearest(x, n, mn, inv, levels, key, idx0, c);
    else if (kind == AC_Q_NEAREST_CAST) quantize_cast_nearest(x, n, mn, inv, levels, key, idx0, c);
    else if (kind == AC_Q_FLOOR_TRICK) quantize_trick_stochastic(x, n, mn, inv, levels, key, idx0, c);
    else quantize_cast_stochastic(x, n, mn, inv, levels, key, idx0, c);
}
AC_DEFINE_GROUP_KERNELS(static, minmax_scalar, quantize_run)

static void dequantize_trick(const uint8_t *c, size_t n, float mn, float scale, float *out) {
    for (size_t i = 0; i < n; i++) out[i] = mn + code_trick(c[i]) * scale;
}
static void dequantize_cast(const uint8_t *c, size_t n, float mn, float scale, float *out) {
    for (size_t i = 0; i < n; i++) out[i] = mn + code_cast(c[i]) * scale;
}
static inline void dequantize_run(int trick, const uint8_t *c, size_t n, float mn, float scale,
                                  float *out) {
    if (trick) dequantize_trick(c, n, mn, scale, out);
    else dequantize_cast(c, n, mn, scale, out);
}
AC_DEFINE_DEQUANTIZE_GROUPS(static, dequantize_run)

/* Unified layout: byte j of a 32-byte block holds codes j, j+32, j+64, ... at bit offsets
 * 0, bits, 2*bits, ... */
#define DEFINE_PACK(BITS)                                                                   \
    static void pack_##BITS(const uint8_t *codes, size_t nblocks, uint8_t *out) {           \
        for (size_t b = 0; b < nblocks; b++, codes += 256 / BITS, out += 32)                \
            for (unsigned j = 0; j < 32; j++) {                                             \
                unsigned byte = 0;                                                          \
                for (unsigned i = 0; i < 8 / BITS; i++) byte |= (unsigned)codes[j + 32 * i] << (BITS * i); \
                out[j] = (uint8_t)byte;                                                     \
            }                                                                               \
    }                                                                                       \
    static void unpack_##BITS(const uint8_t *in, size_t nblocks, uint8_t *codes) {          \
        for (size_t b = 0; b < nblocks; b++, codes += 256 / BITS, in += 32)                 \
            for (unsigned j = 0; j < 32; j++)                                               \
                for (unsigned i = 0; i < 8 / BITS; i++)                                     \
                    codes[j + 32 * i] = (uint8_t)((in[j] >> (BITS * i)) & ((1u << BITS) - 1u)); \
    }

DEFINE_PACK(1)
DEFINE_PACK(2)
DEFINE_PACK(4)
DEFINE_PACK(8)

/* float16 <-> float32, exact in one direction and round-to-nearest-even in the other. */
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    if (exp == 0x1F) return ac_bits_to_f32(sign | 0x7F800000u | man << 13);
    if (exp == 0) { /* zero or subnormal: man * 2^-24 is exact in float32 */
        float f = (float)man * (1.0f / 16777216.0f);
        return ac_bits_to_f32(ac_f32_to_bits(f) | sign);
    }
    return ac_bits_to_f32(sign | (exp + 112) << 23 | man << 13);
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t x = ac_f32_to_bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) /* inf stays inf; NaN stays a quiet NaN with its top payload */
        return (uint16_t)(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u | ((ax >> 13) & 0x3FFu) : 0));
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) { /* below 2^-14: the FPU rounds |f| + 0.5 at the subnormal ulp */
        float a = ac_bits_to_f32(ax) + 0.5f;
        return (uint16_t)(sign | (ac_f32_to_bits(a) - 0x3F000000u));
    }
    /* Normal: rebias the exponent and round the 13 dropped bits to nearest even. */
    uint32_t odd = (ax >> 13) & 1u;
    return (uint16_t)(sign | ((ax + 0xC8000FFFu + odd) >> 13));
}

static inline float bf16_to_f32(uint16_t h) { return ac_bits_to_f32((uint32_t)h << 16); }
static inline uint16_t f32_to_bf16(float f) {
    uint32_t x = ac_f32_to_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

static void f16_to_f32_n(const void *src, size_t n, float *dst) {
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, s + 2 * i, 2); dst[i] = f16_to_f32(h); }
}
static void bf16_to_f32_n(const void *src, size_t n, float *dst) {
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, s + 2 * i, 2); dst[i] = bf16_to_f32(h); }
}
static void f64_to_f32_n(const void *src, size_t n, float *dst) {
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++) { double d; memcpy(&d, s + 8 * i, 8); dst[i] = (float)d; }
}
static void f32_to_f16_n(const float *src, size_t n, void *dst) {
    unsigned char *d = dst;
    for (size_t i = 0; i < n; i++) { uint16_t h = f32_to_f16(src[i]); memcpy(d + 2 * i, &h, 2); }
}
static void f32_to_bf16_n(const float *src, size_t n, void *dst) {
    unsigned char *d = dst;
    for (size_t i = 0; i < n; i++) { uint16_t h = f32_to_bf16(src[i]); memcpy(d + 2 * i, &h, 2); }
}
static void f32_to_f64_n(const float *src, size_t n, void *dst) {
    unsigned char *d = dst;
    for (size_t i = 0; i < n; i++) { double v = src[i]; memcpy(d + 8 * i, &v, 8); }
}

void ac_quant_kernels_scalar(ac_kernels *k) {
    AC_FILL_QUANT_TABLE(k, minmax_scalar, pack_8, unpack_8);
    AC_FILL_F16_CONVERSIONS(k);
    AC_FILL_BF16_F64_CONVERSIONS(k);
}
