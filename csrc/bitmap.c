/* Sparse bitmap codec driver: splits the array into blocks, runs the call's ISA kernels over
 * its threads, and validates everything decode is given. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "threads.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(_WIN32)
#include <windows.h>
#define ac_yield() SwitchToThread()
#else
#include <sched.h>
#define ac_yield() sched_yield()
#endif

/* 128 KiB of input per block: a block and its compacted copy stay in L2. */
#define BLOCK_BYTES (128u * 1024u)
#define NOT_READY SIZE_MAX

size_t ac_bitmap_nbytes(size_t n) { return n / 8 + (n % 8 != 0); }

static int padding_ok(const uint8_t *bitmap, size_t n) {
    return n % 8 == 0 || (bitmap[n / 8] >> (n % 8)) == 0;
}

/* Serial encode: compact straight into values while a whole block (plus the kernels' store
 * slack) still fits in the room left, else through a scratch block. */
static size_t encode_serial(const ac_kernels *k, int idx, const unsigned char *src, size_t n,
                            size_t esize, uint64_t thr, uint8_t *bitmap, unsigned char *values,
                            unsigned char *scratch) {
    size_t block = BLOCK_BYTES / esize, count = 0;
    for (size_t start = 0; start < n; start += block) {
        size_t len = n - start < block ? n - start : block;
        int direct = (n - count) * esize >= len * esize + AC_BITMAP_SLACK;
        unsigned char *out = direct ? values + count * esize : scratch;
        size_t c = k->bm_encode[idx](src + start * esize, len, bitmap + start / 8, out, thr);
        if (!direct) memcpy(values + count * esize, scratch, c * esize);
        count += c;
    }
    return count;
}

#ifdef _OPENMP
/* Threaded encode in one pass over the input (a chained scan). Blocks go round-robin; a
 * block's output offset is the previous block's published end. When that is already known,
 * the block compacts straight into values (its store slack lands in the next block's room,
 * which the next block overwrites only after this block publishes); otherwise it compacts
 * into an L2-resident scratch block, waits for the offset, publishes, and copies out. */
static void encode_parallel(const ac_kernels *k, int idx, const unsigned char *src, size_t n,
                            size_t esize, uint64_t thr, uint8_t *bitmap, unsigned char *values,
                            unsigned char *scratch, size_t scratch_stride,
                            _Atomic size_t *ends, size_t nblocks, int threads) {
    size_t block = BLOCK_BYTES / esize;
#pragma omp parallel num_threads(threads)
    {
        size_t team = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
        unsigned char *mine = scratch + t * scratch_stride;
        for (size_t b = t; b < nblocks; b += team) {
            size_t start = b * block, len = n - start < block ? n - start : block;
            const unsigned char *in = src + start * esize;
            size_t off = b == 0 ? 0 : atomic_load_explicit(&ends[b - 1], memory_order_acquire);
            if (off != NOT_READY && (n - off) * esize >= len * esize + AC_BITMAP_SLACK) {
                size_t c = k->bm_encode[idx](in, len, bitmap + start / 8, values + off * esize, thr);
                atomic_store_explicit(&ends[b], off + c, memory_order_release);
                continue;
            }
            size_t c = k->bm_encode[idx](in, len, bitmap + start / 8, mine, thr);
            unsigned spins = 0;
            while (b > 0 &&
                   (off = atomic_load_explicit(&ends[b - 1], memory_order_acquire)) == NOT_READY)
                if (++spins % 256 == 0) ac_yield();
            atomic_store_explicit(&ends[b], off + c, memory_order_release);
            memcpy(values + off * esize, mine, c * esize);
        }
    }
}
#endif

int ac_bitmap_encode(const void *src, size_t n, int esize, uint64_t prune_abs_bits,
                     uint8_t *bitmap, void *values, size_t *nnz, const ac_options *opt) {
    int idx = ac_esize_index(esize);
    if (idx < 0 || nnz == NULL) return AC_EINVAL;
    ac_call call;
    int status = ac_call_from(opt, &call);
    if (status != AC_OK) return status;
    *nnz = 0;
    if (n == 0) return AC_OK;
    if (src == NULL || bitmap == NULL || values == NULL || n > SIZE_MAX / 8 / (size_t)esize)
        return AC_EINVAL;
    size_t es = (size_t)esize, block = BLOCK_BYTES / es;
    size_t nblocks = n / block + (n % block != 0);
    int threads = ac_threads_for(call.threads, n * es, nblocks);
#ifdef _OPENMP
    if (threads > 1) {
        size_t stride = BLOCK_BYTES + AC_BITMAP_SLACK;
        unsigned char *scratch = malloc(stride * (size_t)threads);
        _Atomic size_t *ends = malloc(nblocks * sizeof *ends);
        if (scratch == NULL || ends == NULL) {
            free(scratch);
            free((void *)ends);
            return AC_ENOMEM;
        }
        for (size_t b = 0; b < nblocks; b++) atomic_init(&ends[b], NOT_READY);
        encode_parallel(call.k, idx, src, n, es, prune_abs_bits, bitmap, values, scratch, stride,
                        ends, nblocks, threads);
        *nnz = atomic_load(&ends[nblocks - 1]);
        free((void *)ends);
        free(scratch);
        return AC_OK;
    }
#endif
    unsigned char *scratch = malloc(BLOCK_BYTES + AC_BITMAP_SLACK);
    if (scratch == NULL) return AC_ENOMEM;
    *nnz = encode_serial(call.k, idx, src, n, es, prune_abs_bits, bitmap, values, scratch);
    free(scratch);
    return AC_OK;
}

int ac_bitmap_count(const uint8_t *bitmap, size_t n, size_t *nnz, const ac_options *opt) {
    if (nnz == NULL || (n > 0 && bitmap == NULL)) return AC_EINVAL;
    ac_call call;
    int status = ac_call_from(opt, &call);
    if (status != AC_OK) return status;
    *nnz = 0;
    if (n == 0) return AC_OK;
    if (!padding_ok(bitmap, n)) return AC_ECORRUPT;
    *nnz = call.k->popcount(bitmap, ac_bitmap_nbytes(n));
    return AC_OK;
}

int ac_bitmap_decode(const uint8_t *bitmap, const void *values, size_t nnz, size_t n,
                     int esize, void *dst, const ac_options *opt) {
    int idx = ac_esize_index(esize);
    if (idx < 0) return AC_EINVAL;
    ac_call call;
    int status = ac_call_from(opt, &call);
    if (status != AC_OK) return status;
    if (nnz > n) return AC_ECORRUPT;
    if (n == 0) return AC_OK;
    if (bitmap == NULL || dst == NULL || (nnz > 0 && values == NULL) ||
        n > SIZE_MAX / 8 / (size_t)esize)
        return AC_EINVAL;
    if (!padding_ok(bitmap, n)) return AC_ECORRUPT;
    const ac_kernels *k = call.k;
    size_t es = (size_t)esize, block = BLOCK_BYTES / es;
    size_t nblocks = n / block + (n % block != 0);
    int threads = ac_threads_for(call.threads, n * es, nblocks);
    (void)threads;
    /* Each block's first value index, from the bitmap's popcounts; checking the total here
     * is what guarantees the kernels never read past values[nnz). */
    size_t *first = malloc((nblocks + 1) * sizeof *first);
    if (first == NULL) return AC_ENOMEM;
    first[0] = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
    for (long long b = 0; b < (long long)nblocks; b++) {
        size_t start = (size_t)b * block, len = n - start < block ? n - start : block;
        first[b + 1] = k->popcount(bitmap + start / 8, ac_bitmap_nbytes(len));
    }
    for (size_t b = 0; b < nblocks; b++) first[b + 1] += first[b];
    if (first[nblocks] != nnz) { free(first); return AC_ECORRUPT; }
    const unsigned char *vals = values;
    unsigned char *out = dst;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
    for (long long b = 0; b < (long long)nblocks; b++) {
        size_t start = (size_t)b * block, len = n - start < block ? n - start : block;
        k->bm_decode[idx](bitmap + start / 8, len, vals + first[b] * es,
                          first[b + 1] - first[b], out + start * es);
    }
    free(first);
    return AC_OK;
}

/* Elements [a, b) of a mask (a on a bitmap byte): `value` where the bit is set, else zero.
 * Stores go through memcpy of a fixed width, so dst needs no alignment. */
#define MASK_RANGE(T)                                                                       \
    static void mask_range_##T(const uint8_t *bitmap, size_t a, size_t b, const void *value, \
                               unsigned char *dst) {                                        \
        T v, zero = 0;                                                                      \
        memcpy(&v, value, sizeof v);                                                        \
        for (size_t i = a; i < b; i++) {                                                    \
            T x = (bitmap[i / 8] >> (i % 8)) & 1u ? v : zero;                               \
            memcpy(dst + i * sizeof(T), &x, sizeof x);                                      \
        }                                                                                   \
    }
MASK_RANGE(uint8_t)
MASK_RANGE(uint16_t)
MASK_RANGE(uint32_t)
MASK_RANGE(uint64_t)

static void mask_range(const uint8_t *bitmap, size_t a, size_t b, const void *value, int esize,
                       unsigned char *dst) {
    if (esize == 1) mask_range_uint8_t(bitmap, a, b, value, dst);
    else if (esize == 2) mask_range_uint16_t(bitmap, a, b, value, dst);
    else if (esize == 4) mask_range_uint32_t(bitmap, a, b, value, dst);
    else mask_range_uint64_t(bitmap, a, b, value, dst);
}

int ac_mask_decode(const uint8_t *bitmap, size_t n, const void *value, int esize, void *dst,
                   const ac_options *opt) {
    if (esize != 1 && ac_esize_index(esize) < 0) return AC_EINVAL;
    ac_call call;
    int status = ac_call_from(opt, &call);
    if (status != AC_OK) return status;
    if (n == 0) return AC_OK;
    if (bitmap == NULL || value == NULL || dst == NULL || n > SIZE_MAX / 8 / (size_t)esize)
        return AC_EINVAL;
    if (!padding_ok(bitmap, n)) return AC_ECORRUPT;
    size_t es = (size_t)esize, block = BLOCK_BYTES / es;
    size_t nblocks = n / block + (n % block != 0);
    int threads = ac_threads_for(call.threads, n * es, nblocks);
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
    for (long long b = 0; b < (long long)nblocks; b++) {
        size_t start = (size_t)b * block, end = n - start < block ? n : start + block;
        mask_range(bitmap, start, end, value, esize, dst);
    }
    return AC_OK;
}
