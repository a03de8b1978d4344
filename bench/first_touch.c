/* Where a new huge page is first written, and what it costs (csrc/first_touch.h): 2 threads,
 * each writing its half of a newly mapped output (ac_alloc_pages: 2 MiB aligned, huge pages
 * asked for), candidates interleaved in rounds, medians. Pure C, no Python:
 *
 *     cc -O2 -fopenmp -Icsrc csrc/[a-z]*.c bench/first_touch.c -o first_touch -lm
 *     ./first_touch [MiB (64)] [rounds (31)]
 *
 * The copy rows show that a copy gains nothing from the first touch, so the yardstick (a plain
 * threaded memcpy) is also the fastest copy known here. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "actcodec.h"
#include "first_touch.h"
#ifdef _OPENMP
#include <omp.h>
#endif

enum { STORE_FIRST, STORE_LAST, MEMSET_FIRST, MEMSET_LAST, FILL, COPY, COPY_LAST,
       BITMAP_DECODE, QUANT_DECODE, NCAND };
static const char *names[NCAND] = {
    "one store per huge page, at its first byte", "one store per huge page, at its last byte",
    "memset, each huge page faulted at its first byte",
    "memset, each huge page faulted at its last byte", "ac_parallel_fill (the fill yardstick)",
    "ac_parallel_copy (the copy yardstick)", "memcpy, each huge page faulted at its last byte",
    "bitmap decode, 50% zeros (float32)", "quant decode, 2-bit (float32)"};

static size_t nbytes;
static unsigned char *src, *bitmap, *values, *packed;
static float *mins, *scales;
static size_t nnz;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Each thread's half, one 2 MiB stretch at a time: the candidate's first store in the
 * stretch, then (unless the candidate is a single store) the stretch front to back. */
static void by_stretch(int c, unsigned char *out) {
#ifdef _OPENMP
#pragma omp parallel num_threads(2)
#endif
    {
        size_t t = 0;
#ifdef _OPENMP
        t = (size_t)omp_get_thread_num();
#endif
        size_t lo = nbytes / 2 * t, hi = t ? nbytes : nbytes / 2;
        for (size_t a = lo; a < hi; a += AC_STRETCH_BYTES) {
            size_t len = hi - a < AC_STRETCH_BYTES ? hi - a : AC_STRETCH_BYTES;
            volatile unsigned char *p = out + a;
            if (c == STORE_FIRST || c == MEMSET_FIRST) p[0] = 0;
            else p[len - 1] = 0;
            if (c == MEMSET_FIRST || c == MEMSET_LAST) memset(out + a, 0, len);
            if (c == COPY_LAST) memcpy(out + a, src + a, len);
        }
    }
}

static double run(int c) {
    unsigned char *out = ac_alloc_pages(nbytes);
    if (out == NULL) { fprintf(stderr, "out of memory\n"); exit(1); }
    double t0 = now();
    switch (c) {
    case FILL: ac_parallel_fill(out, 0, nbytes); break;
    case COPY: ac_parallel_copy(out, src, nbytes); break;
    case BITMAP_DECODE: ac_bitmap_decode(bitmap, values, nnz, nbytes / 4, 4, out); break;
    case QUANT_DECODE:
        ac_quant_decode(packed, mins, scales, nbytes / 4, 2, 256, AC_F32, out);
        break;
    default: by_stretch(c, out);
    }
    double t = now() - t0;
    if ((c == COPY || c == COPY_LAST || c == BITMAP_DECODE) && memcmp(out, src, nbytes) != 0) {
        fprintf(stderr, "%s: wrong bytes\n", names[c]);
        exit(1);
    }
    ac_free_pages(out, nbytes);
    return t;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 64;
    int rounds = argc > 2 ? atoi(argv[2]) : 31;
    if (mib < 4 || rounds < 1) { fprintf(stderr, "usage: first_touch [MiB >= 4] [rounds >= 1]\n"); return 2; }
    nbytes = mib << 20;
    size_t n = nbytes / 4;
    if (ac_init() != AC_OK || ac_set_num_threads(2) != AC_OK) return 1;
    src = aligned_alloc(4096, nbytes); /* at the output's page offset, as the yardstick copies */
    bitmap = malloc(ac_bitmap_nbytes(n));
    values = malloc(nbytes);
    packed = malloc(ac_quant_packed_nbytes(n, 2));
    mins = malloc(ac_quant_ngroups(n, 256) * sizeof *mins);
    scales = malloc(ac_quant_ngroups(n, 256) * sizeof *scales);
    double *times = malloc(sizeof *times * (size_t)rounds * NCAND);
    if (!src || !bitmap || !values || !packed || !mins || !scales || !times) return 1;
    uint64_t s = 1;
    for (size_t i = 0; i < n; i++) { /* half zeros, the rest positive floats */
        s = s * 6364136223846793005u + 1442695040888963407u;
        float x = (s >> 40 & 1) ? (float)(s >> 20 & 0xFFF) + 1.0f : 0.0f;
        memcpy(src + 4 * i, &x, 4);
    }
    size_t bad;
    if (ac_bitmap_encode(src, n, 4, 0, bitmap, values, &nnz) != AC_OK ||
        ac_quant_encode(src, n, AC_F32, 2, 256, AC_ROUND_NEAREST, 0, packed, mins, scales,
                        &bad) != AC_OK)
        return 1;
    int order[NCAND];
    for (int c = 0; c < NCAND; c++) { order[c] = c; run(c); } /* warm-up */
    for (int r = 0; r < rounds; r++) {
        for (int i = NCAND - 1; i > 0; i--) { /* a fresh order each round */
            s = s * 6364136223846793005u + 1442695040888963407u;
            int j = (int)((s >> 33) % (uint64_t)(i + 1)), tmp = order[i];
            order[i] = order[j];
            order[j] = tmp;
        }
        for (int i = 0; i < NCAND; i++) times[order[i] * rounds + r] = run(order[i]);
    }
    double med[NCAND];
    for (int c = 0; c < NCAND; c++) {
        qsort(times + c * rounds, (size_t)rounds, sizeof *times, by_value);
        med[c] = times[c * rounds + rounds / 2];
    }
    printf("%zu MiB newly mapped per call, 2 threads, medians of %d interleaved rounds\n\n", mib,
           rounds);
    printf("| write | ms | / copy |\n|---|---|---|\n");
    for (int c = 0; c < NCAND; c++)
        printf("| %s | %.2f | %.2f |\n", names[c], med[c] * 1e3, med[c] / med[COPY]);
    return 0;
}
