/* Sparse bitmap codec driver: splits the array into blocks, runs the call's ISA kernels over
 * its threads, and validates everything decode is given. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "../runtime/kernels.h"
#include "../runtime/threads.h"
#ifdef _OPENMP
#include <omp.h>
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

/* ---- masks ---- */

/* The 8 bytes of a bool run for bitmap byte b: byte j is bit j of b (0 or 1). Byte j of the
 * product keeps bit j of b; adding 0x7F sets a byte's top bit iff the byte was nonzero, with
 * no carry out of it. */
static inline uint64_t expand_bits(uint8_t b) {
    uint64_t r = ((uint64_t)b * 0x0101010101010101ull) & 0x8040201008040201ull;
    return ((r + 0x7F7F7F7F7F7F7F7Full) & 0x8080808080808080ull) >> 7;
}

/* Whether the n elements at p (n >= 1, aligned scratch) all equal the first; a plain loop the
 * compiler vectorizes. */
#define ALL_EQUAL(T)                                                                        \
    static int all_equal_##T(const unsigned char *p, size_t n) {                            \
        const T *v = (const T *)p;                                                          \
        T diff = 0;                                                                         \
        for (size_t i = 1; i < n; i++) diff |= v[i] ^ v[0];                                 \
        return diff == 0;                                                                   \
    }
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;
ALL_EQUAL(u16)
ALL_EQUAL(u32)
ALL_EQUAL(u64)

/* One block of a mask encode: bitmap bits, the nonzero count, the first nonzero element and
 * whether every nonzero element equals it. Elements of 2, 4 or 8 bytes go through the bitmap
 * kernel into scratch (L2-resident) and are compared there; bytes (bool) directly. */
typedef struct {
    size_t count;
    uint64_t first;
    int same;
} mask_block;

static mask_block mask_encode_block(const ac_kernels *k, const unsigned char *src, size_t len,
                                    int esize, uint8_t *bitmap, unsigned char *scratch) {
    mask_block r = {0, 0, 1};
    if (esize == 1) {
        k->bytes_bits(src, len, bitmap);
        r.count = k->popcount(bitmap, ac_bitmap_nbytes(len));
        size_t i = 0;
        while (i < len && src[i] == 0) i++;
        if (i == len) return r;
        r.first = src[i];
        unsigned char bad = 0, first = src[i];
        for (; i < len; i++) bad |= (unsigned char)((src[i] != 0) & (src[i] != first));
        r.same = bad == 0;
        return r;
    }
    size_t c = k->bm_encode[ac_esize_index(esize)](src, len, bitmap, scratch, 0);
    r.count = c;
    if (c == 0) return r;
    memcpy(&r.first, scratch, (size_t)esize);
    r.same = esize == 2 ? all_equal_u16(scratch, c) : esize == 4 ? all_equal_u32(scratch, c)
                                                                : all_equal_u64(scratch, c);
    return r;
}

int ac_mask_encode(const void *src, size_t n, int esize, uint8_t *bitmap, void *value,
                   size_t *nnz, int *one_value, const ac_options *opt) {
    if ((esize != 1 && ac_esize_index(esize) < 0) || nnz == NULL || one_value == NULL ||
        value == NULL)
        return AC_EINVAL;
    ac_call call;
    int status = ac_call_from(opt, &call);
    if (status != AC_OK) return status;
    *nnz = 0;
    *one_value = 0;
    memset(value, 0, (size_t)esize);
    if (n == 0) return AC_OK;
    if (src == NULL || bitmap == NULL || n > SIZE_MAX / 8 / (size_t)esize) return AC_EINVAL;
    size_t es = (size_t)esize, block = BLOCK_BYTES / es;
    size_t nblocks = n / block + (n % block != 0);
    int threads = ac_threads_for(call.threads, n * es, nblocks);
    size_t stride = BLOCK_BYTES + AC_BITMAP_SLACK;
    unsigned char *scratch = malloc(stride * (size_t)threads);
    mask_block *blocks = malloc(nblocks * sizeof *blocks);
    if (scratch == NULL || blocks == NULL) {
        free(scratch);
        free(blocks);
        return AC_ENOMEM;
    }
    const unsigned char *s = src;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
    for (long long b = 0; b < (long long)nblocks; b++) {
        size_t start = (size_t)b * block, len = n - start < block ? n - start : block;
#ifdef _OPENMP
        unsigned char *mine = scratch + (size_t)omp_get_thread_num() * stride;
#else
        unsigned char *mine = scratch;
#endif
        blocks[b] = mask_encode_block(call.k, s + start * es, len, esize, bitmap + start / 8,
                                      mine);
    }
    int same = 1, seen = 0;
    uint64_t first = 0;
    for (size_t b = 0; b < nblocks; b++) {
        if (blocks[b].count == 0) continue;
        *nnz += blocks[b].count;
        same &= blocks[b].same && (!seen || blocks[b].first == first);
        if (!seen) first = blocks[b].first;
        seen = 1;
    }
    free(blocks);
    free(scratch);
    *one_value = seen && same;
    if (*one_value) memcpy(value, &first, es);
    return AC_OK;
}

/* Bool masks: eight output bytes per bitmap byte, from the table. */
static void mask_bytes(const uint8_t *bitmap, size_t a, size_t b, uint8_t value,
                       unsigned char *dst) {
    for (size_t i = a; i < b; i += 8) {
        uint64_t v = expand_bits(bitmap[i / 8]) * value; /* lanes are 0 or 1: no carries */
        if (b - i >= 8) memcpy(dst + i, &v, 8);
        else memcpy(dst + i, &v, b - i);
    }
}

int ac_mask_decode(const uint8_t *bitmap, size_t n, const void *value, int esize, void *dst,
                   const ac_options *opt) {
    int idx = ac_esize_index(esize);
    if (esize != 1 && idx < 0) return AC_EINVAL;
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
    unsigned char *out = dst;
    if (esize == 1) {
        uint8_t v;
        memcpy(&v, value, 1);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
        for (long long b = 0; b < (long long)nblocks; b++) {
            size_t start = (size_t)b * block, end = n - start < block ? n : start + block;
            mask_bytes(bitmap, start, end, v, out);
        }
        return AC_OK;
    }
    /* Wider elements: the bitmap decode kernels, reading every block's values from a block
     * of copies of the value. */
    unsigned char *copies = malloc(BLOCK_BYTES);
    if (copies == NULL) return AC_ENOMEM;
    for (size_t i = 0; i < block; i++) memcpy(copies + i * es, value, es);
    const ac_kernels *k = call.k;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
    for (long long b = 0; b < (long long)nblocks; b++) {
        size_t start = (size_t)b * block, len = n - start < block ? n - start : block;
        const uint8_t *bits = bitmap + start / 8;
        k->bm_decode[idx](bits, len, copies, k->popcount(bits, ac_bitmap_nbytes(len)),
                          out + start * es);
    }
    free(copies);
    return AC_OK;
}
