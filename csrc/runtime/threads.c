/* The default thread count, and how many threads a job gets. Kernels are memory-bound, so
 * threads only pay on large inputs. */
#include <stdatomic.h>
#include <stdlib.h>
#include "kernels.h"
#include "threads.h"
#ifdef _OPENMP
#include <omp.h>
#endif

static _Atomic int default_threads = 0; /* 0 = not read yet; set from any thread */

static int initial_threads(void) {
    const char *env = getenv("ACTCODEC_NUM_THREADS");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 1 && v <= AC_MAX_THREADS) return (int)v;
    }
#ifdef _OPENMP
    int procs = omp_get_num_procs();
    return procs < 1 ? 1 : procs > AC_MAX_THREADS ? AC_MAX_THREADS : procs;
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

int ac_default_threads(void) {
    int n = atomic_load(&default_threads);
    if (n == 0) {
        int expected = 0, d = initial_threads();
        n = atomic_compare_exchange_strong(&default_threads, &expected, d) ? d : expected;
    }
    return n;
}

int ac_set_default_threads(int n) {
    if (n < 1 || n > AC_MAX_THREADS) return AC_EINVAL;
    atomic_store(&default_threads, n);
    return AC_OK;
}

int ac_threads_for(int most, size_t nbytes, size_t nblocks) {
#ifdef _OPENMP
    size_t t = most < 1 ? 1 : (size_t)most;
    size_t by_size = nbytes / AC_MIN_BYTES_PER_THREAD;
    if (t > by_size) t = by_size;
    if (t > nblocks) t = nblocks;
    return t < 1 ? 1 : (int)t;
#else
    (void)most;
    (void)nbytes;
    (void)nblocks;
    return 1;
#endif
}
