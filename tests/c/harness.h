/* What the standalone C test programs share: case counting with the first failures printed,
 * checked allocation, deterministic randomness and canary bytes around written buffers.
 * Define HARNESS_SEED (each program draws its own stream) before including. */
#ifndef ACTCODEC_TEST_HARNESS_H
#define ACTCODEC_TEST_HARNESS_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CANARY 0xA5
#define GUARD 64 /* canary bytes checked around every region a kernel writes */

static unsigned long long n_passed, n_failed;

/* Records one case; prints the first few failures with their context. */
static int report(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int report(int ok, const char *fmt, ...) {
    if (ok) {
        n_passed++;
        return 1;
    }
    if (++n_failed <= 25) {
        va_list ap;
        va_start(ap, fmt);
        fputs("FAIL ", stdout);
        vprintf(fmt, ap);
        fputc('\n', stdout);
        va_end(ap);
    }
    return 0;
}

/* The closing line CI reads, and the exit status. */
static inline int finish(void) {
    printf("%llu passed, %llu failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}

static inline void *xmalloc(size_t n) {
    /* malloc(0) may return NULL, which is fine: such a buffer must never be dereferenced. */
    void *p = malloc(n);
    if (p == NULL && n != 0) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/* ---- deterministic randomness (splitmix64) ---- */
static uint64_t rng_state = HARNESS_SEED;
static inline uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline double rnd01(void) { return (double)(rnd() >> 11) * 0x1.0p-53; }
static inline size_t rnd_below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static inline int canary_ok(const unsigned char *p, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (p[i] != CANARY) return 0;
    return 1;
}

#endif
