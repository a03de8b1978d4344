/* A memcpy split over the configured threads: the bandwidth yardstick for the benchmarks
 * (numpy's copy is single-threaded, so it would flatter a threaded codec). */
#include <string.h>
#include "threads.h"

#define COPY_BLOCK (1u << 20)

void ac_parallel_copy(void *dst, const void *src, size_t nbytes) {
    size_t nblocks = nbytes / COPY_BLOCK + (nbytes % COPY_BLOCK != 0);
    int threads = ac_threads_for(nbytes, nblocks);
    (void)threads;
    /* Contiguous halves rather than interleaved blocks: the hardware prefetcher prefers it. */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
    for (int t = 0; t < threads; t++) {
        size_t lo = nbytes / (size_t)threads * (size_t)t;
        size_t hi = t == threads - 1 ? nbytes : nbytes / (size_t)threads * (size_t)(t + 1);
        memcpy((char *)dst + lo, (const char *)src + lo, hi - lo);
    }
}
