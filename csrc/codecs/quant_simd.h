/* Pieces the quantization kernel files share (the SIMD ones, quant_sse2.c, quant_avx2.c and
 * quant_neon.c, and for the group kernels quant_scalar.c too). Every SIMD kernel must equal
 * quant_scalar.c bit for bit; tests/c/test_quant.c checks it.
 *
 * Domain, as in the reference: minmax sees finite floats (or reports that it did not);
 * quantize sees 0 <= t = (x - mn) * inv < 2^23 (the driver's t stays within ~levels + 1), so
 * codes can be narrowed with saturation and clamped to levels afterwards; pack sees codes
 * below 2^bits (shifts of whole 16-bit lanes then never carry into the next byte). */
#ifndef ACTCODEC_QUANT_SIMD_H
#define ACTCODEC_QUANT_SIMD_H

#include <stdint.h>
#include <string.h>
#include "quant_common.h"

/* The four quantize kernels: rounding x code<->float conversion. Entry points pass one as a
 * constant, so each inlined copy keeps only its own arithmetic. */
enum { AC_Q_NEAREST_TRICK, AC_Q_NEAREST_CAST, AC_Q_FLOOR_TRICK, AC_Q_FLOOR_CAST };

/* Loop skeleton of the element-wise kernels. STEP(i, s, d) handles the W elements starting at
 * element i, reading src bytes at s (SES bytes each) and writing dst bytes at d (DES each).
 * n >= W: whole steps, then one last step ending at n that overlaps the previous one; it
 * rewrites identical values, which is sound because src and dst never overlap. n < W: one
 * step through zero-padded copies, so no access leaves the caller's buffers. */
#define AC_ELEMENTWISE(W, n, src, SES, dst, DES, STEP)                                      \
    do {                                                                                    \
        const unsigned char *s_ = (const unsigned char *)(src);                             \
        unsigned char *d_ = (unsigned char *)(dst);                                         \
        size_t n_ = (n), i_ = 0;                                                            \
        if (n_ >= (W)) {                                                                    \
            for (; i_ + (W) <= n_; i_ += (W)) STEP(i_, s_ + i_ * (SES), d_ + i_ * (DES));   \
            if (i_ < n_) {                                                                  \
                i_ = n_ - (W);                                                              \
                STEP(i_, s_ + i_ * (SES), d_ + i_ * (DES));                                 \
            }                                                                               \
        } else if (n_ > 0) {                                                                \
            _Alignas(32) unsigned char sp_[(W) * (SES)] = {0};                              \
            _Alignas(32) unsigned char dp_[(W) * (DES)];                                    \
            memcpy(sp_, s_, n_ * (SES));                                                    \
            STEP(0, sp_, dp_);                                                              \
            memcpy(d_, dp_, n_ * (DES));                                                    \
        }                                                                                   \
    } while (0)

/* The group kernels of one ISA file, from its minmax function MINMAX and its quantize loop
 * QUANTIZE_RUN(kind, x, n, mn, inv, levels, key, idx0, codes), kind one of AC_Q_* (a
 * constant, so each copy keeps only its own arithmetic). Both are inlined per group. */
#define AC_DEFINE_GROUP_KERNELS(QUALIFIERS, MINMAX, QUANTIZE_RUN)                           \
    QUALIFIERS int minmax_groups(const float *x, size_t n, size_t G, float *mn, float *mx) {  \
        int bad = 0;                                                                        \
        for (size_t g = 0, s = 0; s < n; g++, s += G)                                       \
            bad |= MINMAX(x + s, n - s < G ? n - s : G, &mn[g], &mx[g]);                    \
        return bad;                                                                         \
    }                                                                                       \
    AC_DEFINE_QUANTIZE_GROUPS(QUALIFIERS, quantize_groups_trick_nearest, AC_Q_NEAREST_TRICK, \
                              QUANTIZE_RUN)                                                 \
    AC_DEFINE_QUANTIZE_GROUPS(QUALIFIERS, quantize_groups_cast_nearest, AC_Q_NEAREST_CAST,  \
                              QUANTIZE_RUN)                                                 \
    AC_DEFINE_QUANTIZE_GROUPS(QUALIFIERS, quantize_groups_trick_stochastic, AC_Q_FLOOR_TRICK, \
                              QUANTIZE_RUN)                                                 \
    AC_DEFINE_QUANTIZE_GROUPS(QUALIFIERS, quantize_groups_cast_stochastic, AC_Q_FLOOR_CAST, \
                              QUANTIZE_RUN)
#define AC_DEFINE_QUANTIZE_GROUPS(QUALIFIERS, NAME, KIND, QUANTIZE_RUN)                     \
    QUALIFIERS void NAME(const float *x, size_t n, size_t G, const float *mn,               \
                         const float *inv, uint32_t levels, uint32_t key, uint32_t idx0,    \
                         uint8_t *codes) {                                                  \
        for (size_t g = 0, s = 0; s < n; g++, s += G)                                       \
            QUANTIZE_RUN(KIND, x + s, n - s < G ? n - s : G, mn[g], inv[g], levels, key,    \
                         idx0 + (uint32_t)s, codes + s);                                    \
    }

/* The dequantize group kernels of one ISA file, from its loop
 * DEQUANTIZE_RUN(trick, codes, n, mn, scale, out), inlined per group. */
#define AC_DEFINE_DEQUANTIZE_GROUPS(QUALIFIERS, DEQUANTIZE_RUN)                             \
    QUALIFIERS void dequantize_groups_trick(const uint8_t *c, size_t n, size_t G,             \
                                            const float *mn, const float *scale, float *out) { \
        for (size_t g = 0, s = 0; s < n; g++, s += G)                                       \
            DEQUANTIZE_RUN(1, c + s, n - s < G ? n - s : G, mn[g], scale[g], out + s);      \
    }                                                                                       \
    QUALIFIERS void dequantize_groups_cast(const uint8_t *c, size_t n, size_t G,              \
                                           const float *mn, const float *scale, float *out) {  \
        for (size_t g = 0, s = 0; s < n; g++, s += G)                                       \
            DEQUANTIZE_RUN(0, c + s, n - s < G ? n - s : G, mn[g], scale[g], out + s);      \
    }

/* 8-bit codes: the unified layout is the identity. */
static inline void ac_pack8_copy(const uint8_t *codes, size_t nblocks, uint8_t *out) {
    if (nblocks) memcpy(out, codes, nblocks * 32);
}
static inline void ac_unpack8_copy(const uint8_t *in, size_t nblocks, uint8_t *codes) {
    if (nblocks) memcpy(codes, in, nblocks * 32);
}

/* Whole-array dtype conversions from an 8-element step HELPER(src bytes, dst bytes). */
#define AC_DEFINE_TO_F32(QUALIFIERS, NAME, HELPER, SES)                                     \
    QUALIFIERS void NAME(const void *src, size_t n, float *dst) {                           \
        AC_ELEMENTWISE(8, n, src, SES, dst, 4, HELPER);                                     \
    }
#define AC_DEFINE_FROM_F32(QUALIFIERS, NAME, HELPER, DES)                                   \
    QUALIFIERS void NAME(const float *src, size_t n, void *dst) {                           \
        AC_ELEMENTWISE(8, n, src, 4, dst, DES, HELPER);                                     \
    }

#endif
