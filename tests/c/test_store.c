/* Standalone C tests for the activation store (csrc/store/store.c), no Python: blocks are page
 * aligned and never overlap (each is filled with its own pattern and checked before it goes);
 * freed pages are reused first-fit; shrink gives the tail back; a block larger than the
 * reservation gets a region of its own; a step's pages stay mapped for the next one, and a
 * step that needs less gives the rest back at its reset (and they are no longer resident);
 * plans place blocks apart and span at least their peak, a repeated step follows the plan
 * into its peak where first fit would not, and requests it does not know go above it; a bad
 * pointer is refused; the counters add up; threads allocating at once keep all of this true.
 * Prints "N passed, M failed" last; exits 1 on any failure. */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* mincore */
#endif
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "actcodec.h"

#define HARNESS_SEED 0x13198A2E03707344ull
#include "harness.h"
#include "../../csrc/store/store_plan.h"
#if defined(__linux__)
#include <sys/mman.h>
#endif

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
    ac_store *s = ac_store_new(1u << 20); /* 256 pages per region */
    report(s != NULL, "store created");
    report(ac_store_alloc(s, 0) == NULL, "alloc(0) is NULL");
    report(ac_store_release(s, NULL) == AC_EINVAL && ac_store_release(NULL, s) == AC_EINVAL,
           "release of NULL is refused");
    unsigned char *a = ac_store_alloc(s, 1), *b = ac_store_alloc(s, PAGE + 1);
    report(a && b && (uintptr_t)a % PAGE == 0 && (uintptr_t)b % PAGE == 0, "page aligned");
    report(b == a + PAGE, "first fit: the second block follows the first");
    ac_store_usage u = usage(s);
    report(u.used_bytes == 3 * PAGE && u.blocks == 2 && u.regions == 1 &&
               u.mapped_bytes == 3 * PAGE, "usage after two blocks: used %zu", u.used_bytes);
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
    /* a block larger than a region: a region of its own */
    unsigned char *big = ac_store_alloc(s, (3u << 20) + 1);
    u = usage(s);
    report(big && u.regions == 2 && u.reserved_bytes == (1u << 20) + (3u << 20) + PAGE,
           "a large block gets its own region (%zu regions, %zu reserved)", u.regions,
           u.reserved_bytes);
    memset(big, 7, (3u << 20) + 1);
    ac_store_release(s, b);
    ac_store_release(s, c);
    ac_store_release(s, d);
    ac_store_release(s, e);
    ac_store_release(s, big);
    u = usage(s);
    report(u.used_bytes == 0 && u.blocks == 0 && u.regions == 2 &&
               u.mapped_bytes == 13 * PAGE + (3u << 20) + PAGE,
           "released pages stay mapped for the next step (%zu mapped)", u.mapped_bytes);
    report(u.peak_used_bytes >= (3u << 20), "peak used remembers the large block");
    ac_store_restart_peak(s);
    u = usage(s);
    report(u.peak_used_bytes == 0 && u.mapped_bytes == 13 * PAGE + (3u << 20) + PAGE,
           "a restarted peak is the use now, and no page is given back (%zu peak, %zu mapped)",
           u.peak_used_bytes, u.mapped_bytes);
    unsigned char *again = ac_store_alloc(s, 3u << 20);
    report(again == big, "the next step's large block lands where the last one was");
    ac_store_release(s, again);
    ac_store_delete(s);
}

/* A step's pages stay resident for the next step that needs them; a step that needs less
 * gives the rest back at its reset. */
static void reset_tests(void) {
    ac_store *s = ac_store_new(64u << 20);
    unsigned char *p[8];
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < 8; i++) {
            p[i] = ac_store_alloc(s, 1u << 20);
            memset(p[i], step + 1, 1u << 20);
        }
        for (int i = 0; i < 8; i++) ac_store_release(s, p[i]);
        ac_store_reset_peak(s);
        ac_store_usage u = usage(s);
        report(u.mapped_bytes == (8u << 20) && u.peak_used_bytes == 0,
               "step %d: its 8 MiB stay mapped (%zu)", step, u.mapped_bytes);
    }
    unsigned char *one = ac_store_alloc(s, 1u << 20);
    report(one == p[0], "a smaller step starts where the last one did");
    ac_store_usage u = usage(s);
    report(u.mapped_bytes == (8u << 20), "nothing is given back during a step");
    ac_store_reset_peak(s);
    u = usage(s);
    report(u.mapped_bytes == (1u << 20) && u.used_bytes == (1u << 20),
           "at its end the store keeps what it needed (%zu mapped)", u.mapped_bytes);
#if defined(__linux__)
    /* The kernel may keep a transparent huge page whole while part of it is in use, so the
     * pages checked are those from the first 2 MiB boundary past the kept block. */
    unsigned char pages[2048]; /* one byte per page of the 8 MiB */
    uintptr_t kept_end = (uintptr_t)p[0] + (1u << 20), huge = 2u << 20;
    int first = (int)((((kept_end + huge - 1) & ~(uintptr_t)(huge - 1)) - (uintptr_t)p[0]) / PAGE);
    int resident = 0, first_resident = -1;
    if (mincore(p[0], 8u << 20, pages) == 0) {
        for (int i = first; i < 2048; i++) {
            if ((pages[i] & 1) && first_resident < 0) first_resident = i;
            resident += pages[i] & 1;
        }
        report(resident == 0,
               "the pages given back from page %d on are not resident (%d are, from page %d)",
               first, resident, first_resident);
    } else { /* qemu-user has no mincore */
        printf("mincore: %s, residency not checked\n", strerror(errno));
    }
#endif
    ac_store_release(s, one);
    ac_store_reset_peak(s);
    ac_store_reset_peak(s);
    u = usage(s);
    report(u.mapped_bytes == 0 && u.regions == 1 && u.blocks == 0,
           "after a step that needed nothing, nothing is mapped (%zu)", u.mapped_bytes);
    ac_store_delete(s);
}

/* plan_place: no two blocks live at a same moment share a page, none meets a fixed block,
 * and the plan spans at least the peak of simultaneous pages. */
static void plan_tests(void) {
    for (int trial = 0; trial < 300; trial++) {
        plan_block b[40], fixed[3];
        size_t n = 1 + rnd_below(40), nfixed = rnd_below(4), fixed_top = 0;
        for (size_t i = 0; i < nfixed; i++) {
            fixed[i] = (plan_block){1 + rnd_below(8), 0, 0, fixed_top + rnd_below(4)};
            fixed_top = fixed[i].at + fixed[i].pages;
        }
        for (size_t i = 0; i < n; i++) {
            size_t start = rnd_below(60);
            b[i] = (plan_block){1 + rnd_below(16), start, start + 1 + rnd_below(30), 0};
        }
        size_t top = plan_place(b, n, fixed, nfixed), peak = 0;
        int ok = top != SIZE_MAX;
        for (size_t i = 0; i < n && ok; i++) {
            ok &= b[i].at + b[i].pages <= top;
            for (size_t f = 0; f < nfixed; f++)
                ok &= b[i].at + b[i].pages <= fixed[f].at || fixed[f].at + fixed[f].pages <= b[i].at;
            for (size_t j = 0; j < i; j++)
                if (b[i].start < b[j].end && b[j].start < b[i].end)
                    ok &= b[i].at + b[i].pages <= b[j].at || b[j].at + b[j].pages <= b[i].at;
        }
        for (size_t t = 0; t < 100; t++) {
            size_t at_t = 0;
            for (size_t i = 0; i < n; i++) at_t += b[i].start <= t && t < b[i].end ? b[i].pages : 0;
            if (at_t > peak) peak = at_t;
        }
        if (!report(ok && top >= peak && top >= fixed_top, "plan %d: %zu blocks placed apart, "
                    "top %zu, peak %zu", trial, n, top, peak))
            break;
    }
    plan_block none[1];
    report(plan_place(none, 0, NULL, 0) == 0, "an empty plan spans nothing");
}

/* The step a plan exists for: X and Y (4 pages each), X freed, Z (1 page) and W (8 pages)
 * while Y lives. First fit puts Z in X's hole and W above Y: 16 pages for a peak of 13. */
static void fragmenting_step(ac_store *s, unsigned char *where[4]) {
    unsigned char *x = ac_store_alloc(s, 4 * PAGE), *y = ac_store_alloc(s, 4 * PAGE);
    ac_store_release(s, x);
    unsigned char *z = ac_store_alloc(s, PAGE), *w = ac_store_alloc(s, 8 * PAGE);
    memset(w, 1, 8 * PAGE);
    where[0] = x, where[1] = y, where[2] = z, where[3] = w;
    ac_store_release(s, y);
    ac_store_release(s, z);
    ac_store_release(s, w);
}

/* A store that has run the fragmenting step twice (first fit, then to its plan), with the
 * second step's blocks in where[4], at the start of a third. */
static ac_store *planned_store(unsigned char *first[4], unsigned char *where[4]) {
    ac_store *s = ac_store_new(1u << 20);
    fragmenting_step(s, first);
    ac_store_reset_peak(s);
    fragmenting_step(s, where);
    ac_store_reset_peak(s);
    return s;
}

static void planned_step_tests(void) {
    ac_store *s = ac_store_new(1u << 20);
    unsigned char *first[4], *second[4], *third[4];
    fragmenting_step(s, first);
    ac_store_usage u = usage(s);
    report(u.mapped_bytes == 16 * PAGE && u.peak_used_bytes == 13 * PAGE,
           "first fit: %zu pages for a peak of %zu", u.mapped_bytes / PAGE,
           u.peak_used_bytes / PAGE);
    ac_store_reset_peak(s);
    fragmenting_step(s, second);
    unsigned char *base = first[0];
    int apart = second[3] < second[1] ? second[3] + 8 * PAGE <= second[1]
                                      : second[1] + 4 * PAGE <= second[3];
    report(apart && second[2] + PAGE <= base + 13 * PAGE && second[3] + 8 * PAGE <= base + 13 * PAGE,
           "the planned step fits in its peak of 13 pages");
    ac_store_reset_peak(s);
    u = usage(s);
    report(u.mapped_bytes == 13 * PAGE, "and the store keeps 13 pages (%zu)", u.mapped_bytes / PAGE);
    fragmenting_step(s, third);
    report(memcmp(second, third, sizeof second) == 0, "a repeated step lands where the last did");
    u = usage(s);
    report(u.mapped_bytes == 13 * PAGE, "without a new page (%zu)", u.mapped_bytes / PAGE);
    /* after the step's last release no entry is still to come: a request the plan does not
     * know reuses its pages */
    unsigned char *a = ac_store_alloc(s, 3 * PAGE), *b = ac_store_alloc(s, 20 * PAGE);
    report(a && b && (a + 3 * PAGE <= b || b + 20 * PAGE <= a) && a < base + 13 * PAGE,
           "requests after the plan's last entry reuse its pages");
    ac_store_release(s, a);
    ac_store_release(s, b);
    ac_store_delete(s);

    /* a request the plan does not know, while the planned step runs, takes no page the plan
     * needs: the step lands where it did */
    s = planned_store(first, second);
    unsigned char *unknown = ac_store_alloc(s, 20 * PAGE);
    fragmenting_step(s, third);
    ac_store_release(s, unknown);
    report(memcmp(second, third, sizeof second) == 0 && unknown >= second[0] + 13 * PAGE,
           "an unknown request displaces no planned one");
    ac_store_delete(s);

    /* a step that skips z and whose w shrank by a page still follows the plan */
    s = planned_store(first, second);
    unsigned char *x = ac_store_alloc(s, 4 * PAGE), *y = ac_store_alloc(s, 4 * PAGE);
    ac_store_release(s, x);
    unsigned char *w = ac_store_alloc(s, 7 * PAGE);
    report(x == second[0] && y == second[1] && w == second[3], "a step that varies a little");
    ac_store_release(s, y);
    ac_store_release(s, w);
    ac_store_delete(s);

    /* a request a page larger than its entry takes it when no entry still to come needs the
     * page it adds (a payload with a few more nonzeros than the step before) */
    s = ac_store_new(1u << 20);
    for (int step = 0; step < 3; step++) {
        unsigned char *p = ac_store_alloc(s, 8 * PAGE);
        ac_store_release(s, p);
        unsigned char *q = ac_store_alloc(s, (step < 2 ? 4 : 5) * PAGE);
        memset(q, 1, (step < 2 ? 4 : 5) * PAGE);
        ac_store_release(s, q);
        if (step == 2)
            report(q == p && usage(s).mapped_bytes == 8 * PAGE,
                   "a grown request keeps to its entry (%zu pages mapped)",
                   usage(s).mapped_bytes / PAGE);
        ac_store_reset_peak(s);
    }
    ac_store_delete(s);

    /* a step whose every request is a fifth smaller (the smaller micro-batch of a batch that
     * does not divide evenly) lands in the entries of the larger one: no page beyond them */
    s = ac_store_new(1u << 20);
    unsigned char *large[3];
    for (int step = 0; step < 3; step++) {
        size_t n = step < 2 ? 10 : 8;
        unsigned char *p = ac_store_alloc(s, n * PAGE), *q = ac_store_alloc(s, 2 * n * PAGE);
        ac_store_release(s, p);
        unsigned char *r = ac_store_alloc(s, n * PAGE);
        memset(q, 1, 2 * n * PAGE);
        memset(r, 2, n * PAGE);
        int same = step < 2 || (p == large[0] && q == large[1] && r == large[2]);
        large[0] = p, large[1] = q, large[2] = r;
        ac_store_release(s, q);
        ac_store_release(s, r);
        if (step == 2)
            report(same && usage(s).mapped_bytes <= 30 * PAGE,
                   "a smaller step keeps to the larger one's entries (%zu pages mapped)",
                   usage(s).mapped_bytes / PAGE);
        ac_store_reset_peak(s);
    }
    ac_store_delete(s);
}

/* A larger period after a smaller one: with the plan forgotten it goes first fit over the
 * pages held, none given back, and only what it adds is mapped anew. */
static void forget_plan_tests(void) {
    ac_store *s = ac_store_new(1u << 20);
    unsigned char *small[3];
    for (int step = 0; step < 2; step++) { /* two small periods: the second to its plan */
        small[0] = ac_store_alloc(s, 8 * PAGE), small[1] = ac_store_alloc(s, 16 * PAGE);
        ac_store_release(s, small[0]);
        small[2] = ac_store_alloc(s, 8 * PAGE);
        ac_store_release(s, small[1]);
        ac_store_release(s, small[2]);
        ac_store_reset_peak(s);
    }
    size_t before = usage(s).mapped_bytes;
    ac_store_forget_plan(s);
    report(usage(s).mapped_bytes == before, "forgetting the plan keeps the pages (%zu)",
           usage(s).mapped_bytes / PAGE);
    unsigned char *p = ac_store_alloc(s, 10 * PAGE), *q = ac_store_alloc(s, 20 * PAGE);
    memset(p, 1, 10 * PAGE);
    memset(q, 2, 20 * PAGE);
    ac_store_release(s, p);
    unsigned char *r = ac_store_alloc(s, 10 * PAGE);
    memset(r, 3, 10 * PAGE);
    report(usage(s).mapped_bytes <= 30 * PAGE,
           "the larger period goes first fit over them (%zu pages mapped for a peak of 30)",
           usage(s).mapped_bytes / PAGE);
    ac_store_release(s, q);
    ac_store_release(s, r);
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
        if (op % 997 == 0) ac_store_reset_peak(s); /* a step ends: a plan, blocks still live */
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
    report(u.mapped_bytes <= u.reserved_bytes && u.used_bytes == 0,
           "mapped within reserved (%zu of %zu)", u.mapped_bytes, u.reserved_bytes);
    ac_store_reset_peak(s);
    ac_store_reset_peak(s);
    u = usage(s);
    report(u.used_bytes == 0 && u.blocks == 0 && u.regions <= 1 && u.mapped_bytes == 0,
           "all released and given back: used %zu, %zu regions, %zu mapped", u.used_bytes,
           u.regions, u.mapped_bytes);
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
    ac_store_reset_peak(s);
    ac_store_reset_peak(s);
    ac_store_usage u = usage(s);
    report(u.used_bytes == 0 && u.blocks == 0 && u.regions <= 1 && u.mapped_bytes == 0,
           "threads: all released (%zu used, %zu regions)", u.used_bytes, u.regions);
    ac_store_delete(s);
}

/* Free pages below a live block: a reset keeps them (it gives back only what lies above the
 * highest live block), ac_store_give_back_free gives them back in place; they stay usable. */
static void give_back_free_tests(void) {
    ac_store *s = ac_store_new(64u << 20);
    unsigned char *low = ac_store_alloc(s, 8u << 20), *high = ac_store_alloc(s, 1u << 20);
    memset(low, 1, 8u << 20);
    memset(high, 2, 1u << 20);
    ac_store_release(s, low);
    ac_store_reset_peak(s);
    ac_store_reset_peak(s);
    ac_store_usage u = usage(s);
    report(u.mapped_bytes == (9u << 20) && u.used_bytes == (1u << 20),
           "resets keep the free pages below a live block (%zu mapped)", u.mapped_bytes);
    size_t gone = ac_store_give_back_free(s);
    u = usage(s);
#if defined(_WIN32)
    report(gone == 0 && u.mapped_bytes == (9u << 20), "nothing given back in place on Windows");
#else
    report(gone == (8u << 20) && u.mapped_bytes == (1u << 20) && u.used_bytes == (1u << 20),
           "they are given back (%zu bytes; %zu mapped)", gone, u.mapped_bytes);
    report(ac_store_give_back_free(s) == 0, "a second give back finds none");
    int kept = 1;
    for (size_t i = 0; i < (1u << 20); i += 997) kept &= high[i] == 2;
    report(kept, "the live block above them is intact");
#if defined(__linux__)
    unsigned char pages[2048];
    if (mincore(low, 8u << 20, pages) == 0) {
        /* a transparent huge page may stay whole: count the pages of the 2 MiB below high */
        int resident = 0;
        for (int i = 0; i < 1536; i++) resident += pages[i] & 1;
        report(resident == 0, "they are not resident (%d pages are)", resident);
    } else {
        printf("mincore: %s, residency not checked\n", strerror(errno));
    }
#endif
#endif
    /* taken again: usable, counted again, and the marks leave with the pages */
    unsigned char *again = ac_store_alloc(s, 3u << 20);
    report(again == low, "first fit takes them again");
    memset(again, 3, 3u << 20);
    u = usage(s);
    report(u.mapped_bytes == (9u << 20) - (5u << 20) * (gone != 0) && u.used_bytes == (4u << 20),
           "taken pages count as mapped again (%zu mapped)", u.mapped_bytes);
    ac_store_release(s, again);
    ac_store_release(s, high);
    ac_store_reset_peak(s);
    ac_store_reset_peak(s);
    u = usage(s);
    report(u.mapped_bytes == 0 && u.used_bytes == 0,
           "a reset that gives back everything clears the marks too (%zu mapped)",
           u.mapped_bytes);
    unsigned char *fresh = ac_store_alloc(s, 9u << 20);
    memset(fresh, 4, 9u << 20);
    u = usage(s);
    report(u.mapped_bytes == (9u << 20), "and the pages count once they are reached (%zu)",
           u.mapped_bytes);
    ac_store_release(s, fresh);
    ac_store_delete(s);
}

int main(void) {
    basic_tests();
    reset_tests();
    give_back_free_tests();
    plan_tests();
    planned_step_tests();
    forget_plan_tests();
    random_tests(1u << 20, 20000);
    random_tests(16u << 20, 5000);
    thread_tests();
    return finish();
}
