/* The thread-count knob. Kernels are memory-bound, so threads only pay on large inputs. */
#include <stdatomic.h>
#include <stdlib.h>
#include "threads.h"
#ifdef _OPENMP
#include <omp.h>
#endif

static _Atomic int num_threads = 0; /* 0 = not read yet; set from any thread */

static int default_threads(void) {
    const char *env = getenv("ACTCODEC_NUM_THREADS");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 1 && v <= 1024) return (int)v;
    }
#ifdef _OPENMP
    return omp_get_num_procs();
#else
    return 1;
#endif
}

int ac_openmp_enabled(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

int ac_get_num_threads(void) {
    int n = atomic_load(&num_threads);
    if (n == 0) {
        int expected = 0, d = default_threads();
        n = atomic_compare_exchange_strong(&num_threads, &expected, d) ? d : expected;
    }
    return n;
}

int ac_set_num_threads(int n) {
    if (n < 1 || n > 1024) return AC_EINVAL;
    num_threads = n;
    return AC_OK;
}

int ac_threads_for(size_t nbytes, size_t nblocks) {
#ifdef _OPENMP
    size_t t = (size_t)ac_get_num_threads();
    size_t by_size = nbytes / AC_MIN_BYTES_PER_THREAD;
    if (t > by_size) t = by_size;
    if (t > nblocks) t = nblocks;
    return t < 1 ? 1 : (int)t;
#else
    (void)nbytes;
    (void)nblocks;
    return 1;
#endif
}
