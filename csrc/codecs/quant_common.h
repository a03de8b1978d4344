/* Definitions every quantization path shares, so scalar, SIMD, threads, Numba and CUDA
 * produce identical codes: the stochastic-rounding hash and the bit-trick constants. */
#ifndef ACTCODEC_QUANT_COMMON_H
#define ACTCODEC_QUANT_COMMON_H

#include <stdint.h>
#include <string.h>

/* 2^23 as a float and its bit pattern: for 0 <= t < 2^23, t + 2^23 has an ulp of exactly 1,
 * so its low mantissa bits are rint(t) (DAF 3.3.1); OR-ing a code into 0x4B000000 and
 * subtracting 2^23 turns it back into a float. */
#define AC_MAGIC_F 8388608.0f
#define AC_MAGIC_BITS 0x4B000000u
#define AC_U24_SCALE (1.0f / 16777216.0f) /* 2^-24: 24 random bits -> [0, 1) exactly */

/* The hash constants, named for the vector forms in the SIMD kernels. */
#define AC_HASH_GOLDEN 0x9E3779B1u
#define AC_HASH_MUL1 0x7FEB352Du
#define AC_HASH_MUL2 0x846CA68Bu

/* A bijective 32-bit mixer (xorshift-multiply rounds); vectorizes with 32-bit multiplies. */
static inline uint32_t ac_mix32(uint32_t x) {
    x ^= x >> 16;
    x *= AC_HASH_MUL1;
    x ^= x >> 15;
    x *= AC_HASH_MUL2;
    x ^= x >> 16;
    return x;
}

/* Per-call key from the 64-bit seed and the high half of the element index. */
static inline uint32_t ac_round_key(uint64_t seed, uint32_t index_hi) {
    return ac_mix32((uint32_t)seed ^
                    ac_mix32((uint32_t)(seed >> 32) ^ ac_mix32(index_hi + 0x9E3779B9u)));
}

/* 24 uniform bits for the element whose index has low half index_lo. */
static inline uint32_t ac_uniform_bits(uint32_t key, uint32_t index_lo) {
    return ac_mix32((index_lo * AC_HASH_GOLDEN) ^ key) >> 8;
}

static inline float ac_bits_to_f32(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static inline uint32_t ac_f32_to_bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

#endif
