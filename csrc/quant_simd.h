/* Pieces the SIMD quantization kernels (quant_sse2.c, quant_avx2.c, quant_neon.c) share.
 * Every kernel there must equal quant_scalar.c bit for bit; tests/c/test_quant.c checks it.
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

/* 8-bit codes: the unified layout is the identity. */
static void ac_pack8_copy(const uint8_t *codes, size_t nblocks, uint8_t *out) {
    if (nblocks) memcpy(out, codes, nblocks * 32);
}
static void ac_unpack8_copy(const uint8_t *in, size_t nblocks, uint8_t *codes) {
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
