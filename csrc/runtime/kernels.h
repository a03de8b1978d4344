/* Internal: the per-ISA kernel table filled once by dispatch.c. */
#ifndef ACTCODEC_KERNELS_H
#define ACTCODEC_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include "actcodec.h"

/* Extra bytes every encode kernel may write past the last packed value (full-vector stores);
 * the driver gives kernels a scratch buffer with this much slack. */
#define AC_BITMAP_SLACK 64

/* Encode one block of n elements (the block starts on a bitmap byte boundary).
 * Writes ceil(n/8) bitmap bytes (padding bits zero) and the nonzero elements to out,
 * possibly writing up to AC_BITMAP_SLACK bytes past them. Returns the number written.
 * thr == 0: nonzero iff bits != 0. thr != 0: nonzero iff (bits & ~signbit) >= thr. */
typedef size_t (*ac_bm_encode_fn)(const void *src, size_t n, uint8_t *bitmap, void *out,
                                  uint64_t thr);
/* Decode one block: n elements into dst from the nvals values at vals, where nvals is the
 * popcount of the block's bitmap (the driver has checked it). Kernels never read past
 * vals[nvals). Padding bits of the last bitmap byte are ignored. */
typedef void (*ac_bm_decode_fn)(const uint8_t *bitmap, size_t n, const void *vals, size_t nvals,
                                void *dst);
/* Number of set bits in nbytes bytes. */
typedef size_t (*ac_popcount_fn)(const uint8_t *p, size_t nbytes);
/* The bitmap of n bytes (bools): bit i set iff src[i] != 0; writes ceil(n/8) bytes, padding
 * bits zero. */
typedef void (*ac_bytes_bits_fn)(const uint8_t *src, size_t n, uint8_t *bitmap);

/* Quantization kernels work on float32 runs (float pointers 4-byte aligned); the driver
 * converts other dtypes tile by tile. See actcodec.h for the math they must match exactly.
 * minmax: n >= 1; returns 1 if any element is NaN/inf (the results are then unspecified);
 * a zero extreme may come back with either sign (the driver makes it +0.0). */
typedef int (*ac_minmax_fn)(const float *x, size_t n, float *mn, float *mx);
/* codes[i] = the code of x[i] (one byte each); levels = 2^bits - 1. For stochastic rounding
 * element i draws ac_uniform_bits(key, idx0 + i) (idx0 + n never wraps: the driver splits). */
typedef void (*ac_quantize_fn)(const float *x, size_t n, float mn, float inv, uint32_t levels,
                               uint32_t key, uint32_t idx0, uint8_t *codes);
/* The same two kernels over consecutive groups of G elements (the last may be short): one
 * call per tile instead of one per group, so the groups' min/max reductions, and then their
 * quantize loops, overlap in the pipeline. minmax_groups returns 1 if any group held NaN/inf;
 * quantize_groups gives group g's elements mn[g] and inv[g] (element i of the run draws
 * ac_uniform_bits(key, idx0 + i), as above). */
typedef int (*ac_minmax_groups_fn)(const float *x, size_t n, size_t G, float *mn, float *mx);
typedef void (*ac_quantize_groups_fn)(const float *x, size_t n, size_t G, const float *mn,
                                      const float *inv, uint32_t levels, uint32_t key,
                                      uint32_t idx0, uint8_t *codes);
/* out[i] = mn + (float)codes[i] * scale. */
typedef void (*ac_dequantize_fn)(const uint8_t *codes, size_t n, float mn, float scale,
                                 float *out);
/* dequantize over consecutive groups of G elements (the last may be short), group g with
 * mn[g] and scale[g]: one call per tile. */
typedef void (*ac_dequantize_groups_fn)(const uint8_t *codes, size_t n, size_t G,
                                        const float *mn, const float *scale, float *out);
/* nblocks whole blocks of the unified layout: P = 256 / bits codes <-> 32 bytes each. */
typedef void (*ac_pack_fn)(const uint8_t *codes, size_t nblocks, uint8_t *out);
typedef void (*ac_unpack_fn)(const uint8_t *in, size_t nblocks, uint8_t *codes);
/* dtype <-> float32 (float16 and bfloat16 round to nearest even; float64 -> float32 too). */
typedef void (*ac_to_f32_fn)(const void *src, size_t n, float *dst);
typedef void (*ac_from_f32_fn)(const float *src, size_t n, void *dst);

typedef struct {
    ac_bm_encode_fn bm_encode[4];  /* index: 1 = 2-byte, 2 = 4-byte, 3 = 8-byte elements */
    ac_bm_decode_fn bm_decode[4];
    ac_popcount_fn popcount;
    ac_bytes_bits_fn bytes_bits;
    ac_minmax_fn minmax;
    ac_quantize_fn quantize[2][2];   /* [bit trick?][rounding] */
    ac_minmax_groups_fn minmax_groups;
    ac_quantize_groups_fn quantize_groups[2][2];
    ac_dequantize_fn dequantize[2];  /* [bit trick?] */
    ac_dequantize_groups_fn dequantize_groups[2];
    ac_pack_fn pack[4];              /* [log2(bits)]: 1, 2, 4, 8 bits */
    ac_unpack_fn unpack[4];
    ac_to_f32_fn to_f32[5];          /* [ac_dtype]; the AC_F32 entry is unused */
    ac_from_f32_fn from_f32[5];
} ac_kernels;

/* Index into bm_encode/bm_decode for an element width; -1 if unsupported. */
static inline int ac_esize_index(int esize) {
    return esize == 2 ? 1 : esize == 4 ? 2 : esize == 8 ? 3 : -1;
}

/* The quantization entries every ISA file fills under the same kernel names: minmax by
 * argument, quantize_{trick,cast}_{nearest,stochastic}, dequantize_{trick,cast},
 * pack_/unpack_{1,2,4} and the 8-bit pair by argument, and the group kernels above. */
#define AC_FILL_QUANT_TABLE(k, MINMAX, PACK8, UNPACK8)                                      \
    do {                                                                                    \
        (k)->minmax = MINMAX;                                                               \
        (k)->quantize[1][AC_ROUND_NEAREST] = quantize_trick_nearest;                        \
        (k)->quantize[1][AC_ROUND_STOCHASTIC] = quantize_trick_stochastic;                  \
        (k)->quantize[0][AC_ROUND_NEAREST] = quantize_cast_nearest;                         \
        (k)->quantize[0][AC_ROUND_STOCHASTIC] = quantize_cast_stochastic;                   \
        (k)->minmax_groups = minmax_groups;                                                 \
        (k)->quantize_groups[1][AC_ROUND_NEAREST] = quantize_groups_trick_nearest;          \
        (k)->quantize_groups[1][AC_ROUND_STOCHASTIC] = quantize_groups_trick_stochastic;    \
        (k)->quantize_groups[0][AC_ROUND_NEAREST] = quantize_groups_cast_nearest;           \
        (k)->quantize_groups[0][AC_ROUND_STOCHASTIC] = quantize_groups_cast_stochastic;     \
        (k)->dequantize[1] = dequantize_trick;                                              \
        (k)->dequantize[0] = dequantize_cast;                                               \
        (k)->dequantize_groups[1] = dequantize_groups_trick;                                \
        (k)->dequantize_groups[0] = dequantize_groups_cast;                                 \
        (k)->pack[0] = pack_1;                                                              \
        (k)->pack[1] = pack_2;                                                              \
        (k)->pack[2] = pack_4;                                                              \
        (k)->pack[3] = PACK8;                                                               \
        (k)->unpack[0] = unpack_1;                                                          \
        (k)->unpack[1] = unpack_2;                                                          \
        (k)->unpack[2] = unpack_4;                                                          \
        (k)->unpack[3] = UNPACK8;                                                           \
    } while (0)
/* The dtype conversions, named {f16,bf16,f64}_to_f32_n and f32_to_{f16,bf16,f64}_n. */
#define AC_FILL_F16_CONVERSIONS(k)                                                          \
    do {                                                                                    \
        (k)->to_f32[AC_F16] = f16_to_f32_n;                                                 \
        (k)->from_f32[AC_F16] = f32_to_f16_n;                                               \
    } while (0)
#define AC_FILL_BF16_F64_CONVERSIONS(k)                                                     \
    do {                                                                                    \
        (k)->to_f32[AC_BF16] = bf16_to_f32_n;                                               \
        (k)->to_f32[AC_F64] = f64_to_f32_n;                                                 \
        (k)->from_f32[AC_BF16] = f32_to_bf16_n;                                             \
        (k)->from_f32[AC_F64] = f32_to_f64_n;                                               \
    } while (0)

/* Fills the quantization entries with the scalar kernels; each ISA then overrides what it
 * accelerates, so a table is never left with a hole. */
void ac_quant_kernels_scalar(ac_kernels *k);
int ac_quant_kernels_sse2(ac_kernels *k);
int ac_quant_kernels_avx2(ac_kernels *k);
int ac_quant_kernels_neon(ac_kernels *k);

/* Each ISA file fills a table; returns 0 if that ISA is not compiled for this target. */
int ac_kernels_scalar(ac_kernels *k);
int ac_kernels_sse2(ac_kernels *k);
int ac_kernels_avx2(ac_kernels *k);
int ac_kernels_neon(ac_kernels *k);

/* One call's options made concrete (dispatch.c): the kernel table of its path, the thread
 * count it may use and the conversion. AC_EINVAL for options out of range, AC_EUNSUPPORTED
 * for a path this CPU lacks. */
#define AC_MAX_THREADS 1024
typedef struct {
    const ac_kernels *k;
    int isa;
    int threads;
    int trick;
} ac_call;
int ac_call_from(const ac_options *opt, ac_call *call);

#endif
