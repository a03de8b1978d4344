/* Sampled nonzero counts: evenly spaced runs of elements, read-only, so a caller can tell a
 * dense array from a sparse one without a full pass (the torch adapters skip the bitmap pass
 * of `auto` on dense tensors this way). Scalar on purpose: a sample is a few KiB. */
#include <string.h>
#include "actcodec.h"

static uint64_t element(const unsigned char *p, int esize) {
    uint64_t v = 0;
    if (esize == 2) { uint16_t h; memcpy(&h, p, 2); v = h; }
    else if (esize == 4) { uint32_t w; memcpy(&w, p, 4); v = w; }
    else memcpy(&v, p, 8);
    return v;
}

int ac_sample_nonzero(const void *src, size_t n, int esize, size_t runs, size_t run_len,
                      uint64_t *nnz, uint64_t *sumsq, int *one_value) {
    if ((esize != 2 && esize != 4 && esize != 8) || runs == 0 || run_len == 0 ||
        nnz == NULL || sumsq == NULL || one_value == NULL || src == NULL ||
        runs > n / run_len)
        return AC_EINVAL;
    const unsigned char *s = src;
    size_t stride = n / runs, es = (size_t)esize;
    uint64_t total = 0, squares = 0, first = 0;
    int same = 1;
    for (size_t r = 0; r < runs; r++) {
        const unsigned char *p = s + r * stride * es;
        uint64_t count = 0;
        for (size_t i = 0; i < run_len; i++) {
            uint64_t v = element(p + i * es, esize);
            if (v == 0) continue;
            if (total + count == 0) first = v;
            else same &= v == first;
            count++;
        }
        total += count;
        squares += count * count;
    }
    *nnz = total;
    *sumsq = squares;
    *one_value = total > 0 && same;
    return AC_OK;
}
