/* memcpy and memset split over the configured threads: the benchmarks' yardsticks. The copy
 * is what "a copy of the array" costs (numpy's copy is single-threaded, so it would flatter a
 * threaded codec); the fill is the least a decoder can spend on writing its output, which in
 * newly mapped memory is mostly the kernel's page faults. A copy gains nothing from faulting
 * each huge page at its end first (bench/first_touch.c: 0.99-1.02), so it stays a memcpy. */
#include <string.h>
#include "threads.h"
#include "first_touch.h"

#define COPY_BLOCK (1u << 20)

/* memset, and into newly mapped memory the way the decoders write (first_touch.h): the least
 * they can spend. Into memory already mapped one long memset is faster (it stores without
 * reading the lines first: 64 MiB 1.4 ms, against 2.2 ms stretch by stretch). */
static void fill_share(unsigned char *dst, int byte, size_t nbytes) {
    if (nbytes == 0 || !ac_page_unmapped(dst)) {
        memset(dst, byte, nbytes);
        return;
    }
    unsigned char *end = dst + nbytes;
    for (unsigned char *p = dst; p < end;) {
        unsigned char *next = (unsigned char *)ac_touch_stretch_end(p, end);
        size_t len = next < end ? (size_t)(next - p) : (size_t)(end - p);
        memset(p, byte, len);
        p += len;
    }
}

/* memcpy (fill == 0) or memset of byte (fill != 0) over nbytes, each thread on its own
 * contiguous share rather than interleaved blocks: the hardware prefetcher prefers it. */
static void over_threads(void *dst, const void *src, int byte, int fill, size_t nbytes) {
    int threads = ac_threads_for(nbytes, nbytes / COPY_BLOCK + (nbytes % COPY_BLOCK != 0));
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
    for (int t = 0; t < threads; t++) {
        size_t lo = nbytes / (size_t)threads * (size_t)t;
        size_t hi = t == threads - 1 ? nbytes : nbytes / (size_t)threads * (size_t)(t + 1);
        if (fill)
            fill_share((unsigned char *)dst + lo, byte, hi - lo);
        else
            memcpy((char *)dst + lo, (const char *)src + lo, hi - lo);
    }
}

void ac_parallel_copy(void *dst, const void *src, size_t nbytes) {
    over_threads(dst, src, 0, 0, nbytes);
}

void ac_parallel_fill(void *dst, int byte, size_t nbytes) {
    over_threads(dst, NULL, byte, 1, nbytes);
}
