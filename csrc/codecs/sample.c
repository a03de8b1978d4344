/* Sampled nonzero counts: runs of elements at pseudo-random offsets, one run per equal stretch
 * of the array, read-only, so a caller can tell a dense array from a sparse one without a
 * full pass (the torch adapters skip the bitmap pass of `auto` on dense tensors this way).
 * The offsets are hashed, not evenly spaced: an even spacing of n/runs lines up with a batch
 * of 64 or 128 and reads the same position of every sample. Scalar on purpose: a sample is
 * a few KiB. */
#include <math.h>
#include <string.h>
#include "actcodec.h"

static uint64_t element(const unsigned char *p, int esize) {
    uint64_t v = 0;
    if (esize == 2) { uint16_t h; memcpy(&h, p, 2); v = h; }
    else if (esize == 4) { uint32_t w; memcpy(&w, p, 4); v = w; }
    else memcpy(&v, p, 8);
    return v;
}

uint64_t ac_sample_mix(uint64_t x) { /* splitmix64's finalizer, on x + its increment */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

int ac_sample_nonzero(const void *src, size_t n, int esize, size_t runs, size_t run_len,
                      uint64_t *nnz, uint64_t *sumsq, int *one_value) {
    if ((esize != 2 && esize != 4 && esize != 8) || runs == 0 || run_len == 0 ||
        nnz == NULL || sumsq == NULL || one_value == NULL || src == NULL ||
        runs > n / run_len)
        return AC_EINVAL;
    const unsigned char *s = src;
    size_t stride = n / runs, es = (size_t)esize, slack = stride - run_len + 1;
    uint64_t total = 0, squares = 0, first = 0;
    int same = 1;
    for (size_t r = 0; r < runs; r++) {
        size_t start = r * stride + (size_t)(ac_sample_mix(r) % slack);
        const unsigned char *p = s + start * es;
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

double ac_nonzero_share_floor(const void *src, size_t n, int esize, int *one_value) {
    enum { RUNS = 64, LEN = 64 };
    uint64_t nnz, sumsq;
    int one = 0;
    double low = 0.0;
    if (ac_sample_nonzero(src, n, esize, RUNS, LEN, &nnz, &sumsq, &one) == AC_OK) {
        double mean = (double)nnz / (RUNS * LEN);
        double var = (double)sumsq / ((double)RUNS * LEN * LEN) - mean * mean;
        low = mean - 5.0 * sqrt(var > 0 ? var / RUNS : 0.0) - 1.0 / RUNS;
    }
    if (one_value != NULL) *one_value = one;
    return low > 0 ? low : 0.0;
}
