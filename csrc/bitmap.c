/* Sparse bitmap codec driver: splits the array into blocks, runs the active ISA's block
 * kernels over the configured threads, and validates everything decode is given. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "stream.h"
#include "threads.h"
#include "first_touch.h"
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
#define ENCODE_BLOCK_MAX_BYTES ((size_t)2 << 20)
#define ENCODE_BLOCKS_MIN 32u

/* Threaded encode's block: 128 KiB of input, doubled while the input still makes 32 blocks,
 * up to 2 MiB (so 8 MiB and less keep 128 KiB). Every block of the chained scan ends in a
 * wait for the block before it and, mostly, a copy out of scratch; long blocks make those
 * rarer. `python bench/tuning_pairs.py` (float32, 2 threads, input evicted first, 41 paired
 * rounds in one process; medians of 2 MiB / 128 KiB per round): 64 MiB 0.84 at 10% zeros,
 * 0.93 at 50%, 0.91 at 90%; 16 MiB 0.88-0.93. 32 blocks keep both threads busy to the end;
 * ac_set_bitmap_block_max caps the growth. A power of two, so a whole number of elements
 * and of bitmap bytes. */
static _Atomic size_t encode_block_max = ENCODE_BLOCK_MAX_BYTES;

size_t ac_get_bitmap_block_max(void) { return atomic_load(&encode_block_max); }
int ac_set_bitmap_block_max(size_t nbytes) {
    if (nbytes < BLOCK_BYTES || nbytes > ((size_t)1 << 30) || (nbytes & (nbytes - 1)))
        return AC_EINVAL;
    atomic_store(&encode_block_max, nbytes);
    return AC_OK;
}

/* Inputs of at least this many bytes copy their compacted blocks out of scratch with
 * non-temporal stores (stream.h): the values are not read again until decode, so reading
 * each output line before writing it, as ordinary stores do, is wasted bandwidth. (Into
 * newly mapped memory too: the pre-touch has zeroed those lines long before, and they are
 * out of cache by then.)
 * `python bench/tuning_pairs.py` (float32, 50% zeros, 2 threads, 41 paired rounds, medians of
 * streamed / ordinary per round, 2026-11-23): 64 MiB 0.88-0.90, 16 MiB 0.90-0.97; from 8 MiB
 * down, 0.90-1.01, no difference this machine can resolve. Below the threshold the values
 * of a smaller input can still be in cache when the caller reads them back (a 4 MiB encode
 * repeated in a loop: 0.17 ms streamed, 0.16 ordinary), so ordinary stores keep them there. */
#define STREAM_FROM_BYTES ((size_t)8 << 20)
static _Atomic size_t stream_from = STREAM_FROM_BYTES;

size_t ac_get_bitmap_stream_from(void) { return atomic_load(&stream_from); }
void ac_set_bitmap_stream_from(size_t nbytes) { atomic_store(&stream_from, nbytes); }

static size_t encode_block_bytes(size_t nbytes) {
    size_t b = BLOCK_BYTES, most = atomic_load(&encode_block_max);
    while (b < most && nbytes / (2 * b) >= ENCODE_BLOCKS_MIN) b *= 2;
    return b;
}
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
/* Output bytes certain enough to be written that touching them early cannot commit pages the
 * encoding never uses: the sample's lower bound on the nonzero share. Lossless only: a prune
 * threshold changes what counts as zero, so then nothing is expected and nothing touched. */
static size_t expected_output(const void *src, size_t n, int esize, uint64_t prune_abs_bits) {
    if (prune_abs_bits != 0) return 0;
    return (size_t)(ac_nonzero_share_floor(src, n, esize, NULL) * (double)n) * (size_t)esize;
}

/* Where thread t's share of the first `total` bytes of values starts: at the 2 MiB boundary
 * nearest an even split, so that no two threads fault one huge page (the kernel would zero
 * it for both and keep one). */
static size_t share_start(const unsigned char *values, size_t total, size_t t, size_t team) {
    if (t == 0) return 0;
    if (t >= team) return total;
    uintptr_t even = (uintptr_t)values + total / team * t;
    uintptr_t at = (even + AC_STRETCH_BYTES / 2) / AC_STRETCH_BYTES * AC_STRETCH_BYTES;
    size_t off = at < (uintptr_t)values ? 0 : (size_t)(at - (uintptr_t)values);
    return off < total ? off : total;
}

/* Threaded encode in one pass over the input (a chained scan). Blocks go round-robin; a
 * block's output offset is the previous block's published end. When that is already known,
 * the block compacts straight into values (its store slack lands in the next block's room,
 * which the next block overwrites only after this block publishes); otherwise it compacts
 * into an L2-resident scratch block, waits for the offset, publishes, and copies out. */
static void encode_parallel(const ac_kernels *k, int idx, const unsigned char *src, size_t n,
                            size_t esize, uint64_t thr, uint8_t *bitmap, unsigned char *values,
                            unsigned char *scratch, size_t scratch_stride, size_t block,
                            _Atomic size_t *ends, size_t nblocks, int threads,
                            size_t expect_bytes, int stream) {
#pragma omp parallel num_threads(threads)
    {
        size_t team = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
        unsigned char *mine = scratch + t * scratch_stride;
        /* First touch: the scan writes the output in an order that alternates threads block
         * by block, and two threads faulting in the same fresh (huge) page wait on each
         * other. Touching one byte per page of the expected output, each thread its own
         * contiguous share, faults the pages in the way a threaded copy does, each 2 MiB
         * stretch at its end first (first_touch.h: 64 MiB, 6.4-6.5 -> 5.2-5.6 ms). Pages
         * already mapped cost one cache miss each; bytes written here are overwritten or cut
         * off. Faulting each stretch instead when a copy-out first reaches it (claimed in
         * order, so no huge page is faulted twice, and written with plain stores while its
         * zeroed lines are in cache) measured 0.97 of this time in interleaved rounds but
         * 1.5-1.7x it in back-to-back calls, where the copy-outs queue on each other's
         * faults (user time 9-10 against 5-6 ms a call): dropped. */
        size_t first = share_start(values, expect_bytes, t, team);
        size_t last = share_start(values, expect_bytes, t + 1, team);
        uintptr_t next = 0;
        for (size_t p = first; p < last; p += 4096) {
            ac_first_touch(values + p, values + last, &next);
            ((volatile unsigned char *)values)[p] = 0;
        }
#pragma omp barrier
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
            if (stream)
                ac_stream_copy(values + off * esize, mine, c * esize);
            else
                memcpy(values + off * esize, mine, c * esize);
        }
        if (stream) ac_stream_fence(); /* before the join, after which the caller reads */
    }
}
#endif

int ac_bitmap_encode(const void *src, size_t n, int esize, uint64_t prune_abs_bits,
                     uint8_t *bitmap, void *values, size_t *nnz) {
    int idx = ac_esize_index(esize);
    if (idx < 0 || nnz == NULL) return AC_EINVAL;
    *nnz = 0;
    if (n == 0) return AC_OK;
    if (src == NULL || bitmap == NULL || values == NULL || n > SIZE_MAX / 8 / (size_t)esize)
        return AC_EINVAL;
    const ac_kernels *k = ac_active_kernels();
    size_t es = (size_t)esize, block = BLOCK_BYTES / es;
    size_t nblocks = n / block + (n % block != 0);
    int threads = ac_threads_for(n * es, nblocks);
#ifdef _OPENMP
    if (threads > 1) {
        size_t eblock = encode_block_bytes(n * es) / es, nb = n / eblock + (n % eblock != 0);
        if ((size_t)threads > nb) threads = (int)nb; /* no scratch for threads without a block */
        size_t stride = eblock * es + AC_BITMAP_SLACK;
        unsigned char *scratch = malloc(stride * (size_t)threads);
        _Atomic size_t *ends = malloc(nb * sizeof *ends);
        if (scratch == NULL || ends == NULL) {
            free(scratch);
            free((void *)ends);
            return AC_ENOMEM;
        }
        for (size_t b = 0; b < nb; b++) atomic_init(&ends[b], NOT_READY);
        encode_parallel(k, idx, src, n, es, prune_abs_bits, bitmap, values, scratch, stride,
                        eblock, ends, nb, threads,
                        expected_output(src, n, esize, prune_abs_bits),
                        n * es >= atomic_load(&stream_from));
        *nnz = atomic_load(&ends[nb - 1]);
        free((void *)ends);
        free(scratch);
        return AC_OK;
    }
#endif
    unsigned char *scratch = malloc(BLOCK_BYTES + AC_BITMAP_SLACK);
    if (scratch == NULL) return AC_ENOMEM;
    *nnz = encode_serial(k, idx, src, n, es, prune_abs_bits, bitmap, values, scratch);
    free(scratch);
    return AC_OK;
}

int ac_bitmap_count(const uint8_t *bitmap, size_t n, size_t *nnz) {
    if (nnz == NULL || (n > 0 && bitmap == NULL)) return AC_EINVAL;
    *nnz = 0;
    if (n == 0) return AC_OK;
    if (!padding_ok(bitmap, n)) return AC_ECORRUPT;
    *nnz = ac_active_kernels()->popcount(bitmap, ac_bitmap_nbytes(n));
    return AC_OK;
}

int ac_bitmap_decode(const uint8_t *bitmap, const void *values, size_t nnz, size_t n,
                     int esize, void *dst) {
    int idx = ac_esize_index(esize);
    if (idx < 0) return AC_EINVAL;
    if (nnz > n) return AC_ECORRUPT;
    if (n == 0) return AC_OK;
    if (bitmap == NULL || dst == NULL || (nnz > 0 && values == NULL) ||
        n > SIZE_MAX / 8 / (size_t)esize)
        return AC_EINVAL;
    if (!padding_ok(bitmap, n)) return AC_ECORRUPT;
    const ac_kernels *k = ac_active_kernels();
    size_t es = (size_t)esize, block = BLOCK_BYTES / es;
    size_t nblocks = n / block + (n % block != 0);
    int threads = ac_threads_for(n * es, nblocks);
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
    /* Each thread its contiguous share of blocks, front to back (first_touch.h). */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
    for (int t = 0; t < threads; t++) {
        size_t lo = nblocks * (size_t)t / (size_t)threads;
        size_t hi = nblocks * (size_t)(t + 1) / (size_t)threads;
        unsigned char *end = out + (hi * block < n ? hi * block : n) * es;
        uintptr_t next = 0;
        for (size_t b = lo; b < hi; b++) {
            size_t start = b * block, len = n - start < block ? n - start : block;
            ac_first_touch(out + start * es, end, &next);
            k->bm_decode[idx](bitmap + start / 8, len, vals + first[b] * es,
                              first[b + 1] - first[b], out + start * es);
        }
    }
    free(first);
    return AC_OK;
}
