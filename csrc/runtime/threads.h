/* Internal threading helpers. */
#ifndef ACTCODEC_THREADS_H
#define ACTCODEC_THREADS_H
#include <stddef.h>
#include "actcodec.h"
#if defined(_WIN32)
#include <windows.h>
#define ac_yield() SwitchToThread() /* a spinning waiter lets the holder run */
#else
#include <sched.h>
#define ac_yield() sched_yield()
#endif

/* Below this much data per thread, starting threads costs more than it saves. */
#define AC_MIN_BYTES_PER_THREAD (256u * 1024u)

/* Threads (>= 1) for a job of nbytes split into nblocks independent blocks, at most `most`;
 * 1 without OpenMP. */
int ac_threads_for(int most, size_t nbytes, size_t nblocks);

#endif
