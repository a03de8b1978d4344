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

typedef struct {
    ac_bm_encode_fn bm_encode[4];  /* index: 1 = 2-byte, 2 = 4-byte, 3 = 8-byte elements */
    ac_bm_decode_fn bm_decode[4];
    ac_popcount_fn popcount;
} ac_kernels;

/* Index into bm_encode/bm_decode for an element width; -1 if unsupported. */
static inline int ac_esize_index(int esize) {
    return esize == 2 ? 1 : esize == 4 ? 2 : esize == 8 ? 3 : -1;
}

/* Each ISA file fills a table; returns 0 if that ISA is not compiled for this target. */
int ac_kernels_scalar(ac_kernels *k);
int ac_kernels_sse2(ac_kernels *k);
int ac_kernels_avx2(ac_kernels *k);
int ac_kernels_neon(ac_kernels *k);

/* The active table (dispatch.c). */
const ac_kernels *ac_active_kernels(void);

#endif
