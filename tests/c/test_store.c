/* Standalone C tests for the activation store (csrc/store.c), no Python: blocks are page
 * aligned and never overlap (each is filled with its own pattern and checked before it goes);
 * freed pages are reused first-fit; shrink gives the tail back; a block larger than the grow
 * step gets a segment of its own; empty segments beyond one are unmapped; a bad pointer is
 * refused; the counters add up; threads allocating at once keep all of this true.
 * Prints "N passed, M failed" last; exits 1 on any failure. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "actcodec.h"

#define HARNESS_SEED 0x13198A2E03707344ull
#include "harness.h"

#define PAGE 4096u

typedef struct {
    unsigned char *p;
    size_t n;            /* bytes holding the pattern */
    unsigned char tag;
    size_t held;         /* bytes the store holds for it: whole pages, at least one */
} live;

static size_t pages_of(size_t n) { return n == 0 ? PAGE : (n + PAGE - 1) / PAGE * PAGE; }

static void fill(live *b) { memset(b->p, b->tag, b->n); }
static int intact(const live *b) {
    for (size_t i = 0; i < b->n; i += 509)
        if (b->p[i] != b->tag) return 0;
    return b->n == 0 || b->p[b->n - 1] == b->tag;
}

static ac_store_usage usage(ac_store *s) {
    ac_store_usage u;
    ac_store_stats(s, &u);
    return u;
}

static void basic_tests(void) {
    ac_store *s = ac_store_new(1u << 20); /* 256 pages per segment */
    report(s != NULL, "store created");
    report(ac_store_alloc(s, 0) == NULL, "alloc(0) is NULL");
    report(ac_store_release(s, NULL) == AC_EINVAL && ac_store_release(NULL, s) == AC_EINVAL,
           "release of NULL is refused");
    unsigned char *a = ac_store_alloc(s, 1), *b = ac_store_alloc(s, PAGE + 1);
    report(a && b && (uintptr_t)a % PAGE == 0 && (uintptr_t)b % PAGE == 0, "page aligned");
    report(b == a + PAGE, "first fit: the second block follows the first");
    ac_store_usage u = usage(s);
    report(u.used_bytes == 3 * PAGE && u.blocks == 2 && u.segments == 1 &&
               u.mapped_bytes == (1u << 20), "usage after two blocks: used %zu", u.used_bytes);
    report(ac_store_release(s, b + PAGE) == AC_EINVAL, "a pointer into a block is refused");
    int stack;
    report(ac_store_release(s, &stack) == AC_EINVAL, "a foreign pointer is refused");
    report(ac_store_release(s, a) == AC_OK && ac_store_release(s, a) == AC_EINVAL,
           "a block released twice is refused the second time");
    unsigned char *c = ac_store_alloc(s, PAGE);
    report(c == a, "freed pages are reused first");
    /* shrink: the tail returns and is taken by the next block that fits */
    unsigned char *d = ac_store_alloc(s, 10 * PAGE);
    report(ac_store_shrink(s, d, 3 * PAGE - 5) == 3 * PAGE, "shrink keeps 3 pages");
    unsigned char *e = ac_store_alloc(s, 7 * PAGE);
    report(e == d + 3 * PAGE, "the shrunk tail is reused");
    report(ac_store_shrink(s, d, 0) == PAGE, "a block keeps one page");
    report(ac_store_shrink(s, d + PAGE, 1) == 0, "shrink of a non-block is refused");
    /* a block larger than a segment: a segment of its own, unmapped when released */
    unsigned char *big = ac_store_alloc(s, (3u << 20) + 1);
    u = usage(s);
    report(big && u.segments == 2 && u.mapped_bytes == (1u << 20) + (3u << 20) + PAGE,
           "a large block gets its own segment (%zu segments, %zu mapped)", u.segments,
           u.mapped_bytes);
    memset(big, 7, (3u << 20) + 1);
    ac_store_release(s, b);
    ac_store_release(s, c);
    ac_store_release(s, d);
    ac_store_release(s, e);
    u = usage(s);
    report(u.used_bytes == (3u << 20) + PAGE && u.blocks == 1 && u.segments == 2,
           "the first segment is empty and kept while the large one lives");
    ac_store_release(s, big);
    u = usage(s);
    report(u.used_bytes == 0 && u.blocks == 0 && u.segments == 1 && u.mapped_bytes == (1u << 20),
           "of two empty segments the larger is unmapped (%zu mapped)", u.mapped_bytes);
    report(u.peak_used_bytes >= (3u << 20), "peak used remembers the large block");
    ac_store_reset_peak(s);
    report(usage(s).peak_used_bytes == 0, "reset peak");
    ac_store_delete(s);
}

/* Random alloc / shrink / release against a list of live blocks, each holding its pattern. */
static void random_tests(size_t grow, int ops) {
    ac_store *s = ac_store_new(grow);
    live blocks[256];
    size_t nlive = 0, used = 0;
    for (int op = 0; op < ops; op++) {
        unsigned r = (unsigned)rnd() % 10;
        if (r < 5 && nlive < 256) {
            size_t n = rnd() % 4 == 0 ? 1 + rnd_below(grow * 2) : 1 + rnd_below(64 * PAGE);
            live b = {ac_store_alloc(s, n), n, (unsigned char)(1 + nlive % 250), pages_of(n)};
            if (!report(b.p != NULL && (uintptr_t)b.p % PAGE == 0, "alloc %zu", n)) continue;
            fill(&b);
            blocks[nlive++] = b;
            used += b.held;
        } else if (r < 7 && nlive) {
            live *b = &blocks[rnd_below(nlive)];
            size_t keep = rnd_below(b->n + 1), want = pages_of(keep);
            size_t held = ac_store_shrink(s, b->p, keep);
            report(held == (want < b->held ? want : b->held), "shrink %zu -> %zu", b->n, keep);
            used -= b->held - held;
            b->held = held;
            b->n = keep;
        } else if (nlive) {
            size_t i = rnd_below(nlive);
            report(intact(&blocks[i]), "block %zu intact before release", i);
            used -= blocks[i].held;
            report(ac_store_release(s, blocks[i].p) == AC_OK, "release");
            blocks[i] = blocks[--nlive];
        }
        if (op % 97 == 0) {
            int ok = 1;
            for (size_t i = 0; i < nlive; i++) ok &= intact(&blocks[i]);
            ac_store_usage u = usage(s);
            report(ok && u.used_bytes == used && u.blocks == nlive && u.used_bytes <= u.mapped_bytes,
                   "op %d: every live block intact, used %zu (counted %zu)", op, u.used_bytes, used);
        }
    }
    for (size_t i = 0; i < nlive; i++) {
        report(intact(&blocks[i]), "intact at the end");
        ac_store_release(s, blocks[i].p);
    }
    ac_store_usage u = usage(s);
    report(u.used_bytes == 0 && u.blocks == 0 && u.segments <= 1,
           "all released: used %zu, %zu segments", u.used_bytes, u.segments);
    ac_store_delete(s);
}

typedef struct {
    ac_store *s;
    unsigned seed;
    int ok;
} worker;

static void *hammer(void *arg) {
    worker *w = arg;
    unsigned x = w->seed;
    live mine[32];
    size_t n = 0;
    for (int op = 0; op < 3000; op++) {
        x = x * 1103515245u + 12345u;
        if ((x >> 16) % 3 != 0 && n < 32) {
            size_t bytes = 1 + (x >> 8) % (40 * PAGE);
            live b = {ac_store_alloc(w->s, bytes), bytes, (unsigned char)(w->seed * 7 + n + 1),
                      pages_of(bytes)};
            if (b.p == NULL) { w->ok = 0; break; }
            fill(&b);
            mine[n++] = b;
        } else if (n) {
            size_t i = (x >> 4) % n;
            w->ok &= intact(&mine[i]);
            w->ok &= ac_store_release(w->s, mine[i].p) == AC_OK;
            mine[i] = mine[--n];
        }
    }
    for (size_t i = 0; i < n; i++) {
        w->ok &= intact(&mine[i]);
        ac_store_release(w->s, mine[i].p);
    }
    return NULL;
}

static void thread_tests(void) {
    ac_store *s = ac_store_new(2u << 20);
    pthread_t t[4];
    worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker){s, 17u + (unsigned)i, 1};
        pthread_create(&t[i], NULL, hammer, &w[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        report(w[i].ok, "thread %d: its blocks stayed its own", i);
    }
    ac_store_usage u = usage(s);
    report(u.used_bytes == 0 && u.blocks == 0 && u.segments <= 1,
           "threads: all released (%zu used, %zu segments)", u.used_bytes, u.segments);
    ac_store_delete(s);
}

int main(void) {
    basic_tests();
    random_tests(1u << 20, 20000);
    random_tests(16u << 20, 5000);
    thread_tests();
    return finish();
}
