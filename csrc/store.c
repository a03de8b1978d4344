/* The activation store: memory the library maps itself for what a training step keeps from
 * its forward pass to its backward (see actcodec.h). Segments are mapped `grow` bytes at a
 * time (a block larger than that gets a segment of its own); a block is a run of whole pages
 * inside one segment, placed first-fit by address so that a step's blocks pack toward the
 * start of the first segments. Each page's run is described by boundary tags: the first and
 * the last page of every run, allocated or free, hold its length and whether it is free, so a
 * released run merges with its free neighbours in constant time. A segment left empty is
 * unmapped unless it is the only empty one: the next step reuses it without page faults, and
 * a step that needs less gives the rest back. */
#if !defined(_WIN32) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS and madvise under -std=c11 */
#endif
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "actcodec.h"
#if defined(_WIN32)
#include <windows.h>
#define ac_yield() SwitchToThread()
#else
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>
#define ac_yield() sched_yield()
#endif

#define PAGE ((size_t)4096)
#define FREE_BIT 0x80000000u   /* in a boundary tag: the run is free */
#define MAX_RUN 0x7FFFFFFFu    /* pages in one run: 8 TiB */

typedef struct {
    unsigned char *base;
    size_t npages, used_pages;
    uint32_t *head, *tail; /* boundary tags: length (| FREE_BIT) at a run's first/last page */
} segment;

struct ac_store {
    atomic_flag lock;
    size_t grow_pages;
    segment *segs;
    size_t nsegs, cap;
    size_t used_pages, peak_pages, mapped_pages, blocks;
};

static void lock(ac_store *s) {
    unsigned spins = 0;
    while (atomic_flag_test_and_set_explicit(&s->lock, memory_order_acquire))
        if (++spins % 64 == 0) ac_yield();
}
static void unlock(ac_store *s) { atomic_flag_clear_explicit(&s->lock, memory_order_release); }

static void *map_pages(size_t bytes) {
#if defined(_WIN32)
    return VirtualAlloc(NULL, bytes, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
#else
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#if defined(MADV_HUGEPAGE)
    if (bytes >= ((size_t)2 << 20)) madvise(p, bytes, MADV_HUGEPAGE); /* a hint; may be off */
#endif
    return p;
#endif
}

static void unmap_pages(void *p, size_t bytes) {
#if defined(_WIN32)
    (void)bytes;
    VirtualFree(p, 0, MEM_RELEASE);
#else
    munmap(p, bytes);
#endif
}

/* Marks pages [a, a + n) of g as one run. */
static void set_run(segment *g, size_t a, size_t n, int is_free) {
    uint32_t tag = (uint32_t)n | (is_free ? FREE_BIT : 0u);
    g->head[a] = tag;
    g->tail[a + n - 1] = tag;
}

static int is_free_run(uint32_t tag) { return (tag & FREE_BIT) != 0; }
static size_t run_len(uint32_t tag) { return tag & ~FREE_BIT; }

ac_store *ac_store_new(size_t grow_bytes) {
    if (grow_bytes == 0) grow_bytes = (size_t)64 << 20;
    size_t pages = (grow_bytes + PAGE - 1) / PAGE;
    if (pages > MAX_RUN) return NULL;
    ac_store *s = calloc(1, sizeof *s);
    if (s == NULL) return NULL;
    atomic_flag_clear(&s->lock);
    s->grow_pages = pages;
    return s;
}

static void drop_segment(ac_store *s, size_t i) {
    segment *g = &s->segs[i];
    unmap_pages(g->base, g->npages * PAGE);
    s->mapped_pages -= g->npages;
    free(g->head);
    free(g->tail);
    s->segs[i] = s->segs[--s->nsegs];
}

void ac_store_delete(ac_store *s) {
    if (s == NULL) return;
    while (s->nsegs) drop_segment(s, s->nsegs - 1);
    free(s->segs);
    free(s);
}

/* A new segment of at least `pages` pages (the grow step, or more); its index, or -1. */
static long add_segment(ac_store *s, size_t pages) {
    size_t n = pages > s->grow_pages ? pages : s->grow_pages;
    if (n > MAX_RUN) return -1;
    if (s->nsegs == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 8;
        segment *grown = realloc(s->segs, cap * sizeof *grown);
        if (grown == NULL) return -1;
        s->segs = grown;
        s->cap = cap;
    }
    segment g = {map_pages(n * PAGE), n, 0, calloc(n, sizeof(uint32_t)),
                 calloc(n, sizeof(uint32_t))};
    if (g.base == NULL || g.head == NULL || g.tail == NULL) {
        if (g.base) unmap_pages(g.base, n * PAGE);
        free(g.head);
        free(g.tail);
        return -1;
    }
    set_run(&g, 0, n, 1);
    s->segs[s->nsegs] = g;
    s->mapped_pages += n;
    return (long)s->nsegs++;
}

/* First fit in g: the start of a free run of at least n pages, or npages. */
static size_t find_run(const segment *g, size_t n) {
    for (size_t a = 0; a < g->npages; a += run_len(g->head[a]))
        if (is_free_run(g->head[a]) && run_len(g->head[a]) >= n) return a;
    return g->npages;
}

/* Takes pages [a, a + n) from the free run starting at a. */
static void take(ac_store *s, segment *g, size_t a, size_t n) {
    size_t have = run_len(g->head[a]);
    set_run(g, a, n, 0);
    if (have > n) set_run(g, a + n, have - n, 1);
    g->used_pages += n;
    s->used_pages += n;
    if (s->used_pages > s->peak_pages) s->peak_pages = s->used_pages;
}

void *ac_store_alloc(ac_store *s, size_t nbytes) {
    if (s == NULL || nbytes == 0 || nbytes > (size_t)MAX_RUN * PAGE) return NULL;
    size_t n = (nbytes + PAGE - 1) / PAGE;
    lock(s);
    void *p = NULL;
    /* Segments in the order they were mapped: the oldest fill first. */
    for (size_t i = 0; i < s->nsegs && p == NULL; i++) {
        size_t a = find_run(&s->segs[i], n);
        if (a < s->segs[i].npages) {
            take(s, &s->segs[i], a, n);
            p = s->segs[i].base + a * PAGE;
        }
    }
    if (p == NULL) {
        long i = add_segment(s, n);
        if (i >= 0) {
            take(s, &s->segs[i], 0, n);
            p = s->segs[i].base;
        }
    }
    if (p != NULL) s->blocks++;
    unlock(s);
    return p;
}

/* The segment holding p, and p's page in it; -1 if p is no block's start. */
static long locate(const ac_store *s, const void *p, size_t *page) {
    const unsigned char *q = p;
    for (size_t i = 0; i < s->nsegs; i++) {
        const segment *g = &s->segs[i];
        if (q < g->base || q >= g->base + g->npages * PAGE) continue;
        size_t off = (size_t)(q - g->base);
        if (off % PAGE) return -1;
        *page = off / PAGE;
        uint32_t tag = g->head[*page];
        return tag != 0 && !is_free_run(tag) ? (long)i : -1;
    }
    return -1;
}

/* Frees the allocated run [a, a + n) of segment i, merging it with free neighbours; unmaps
 * the segment if it is now empty and another empty one is kept already. */
static void give_back(ac_store *s, size_t i, size_t a, size_t n) {
    segment *g = &s->segs[i];
    g->used_pages -= n;
    s->used_pages -= n;
    size_t start = a, len = n;
    if (a + n < g->npages && is_free_run(g->head[a + n])) {
        size_t next = run_len(g->head[a + n]);
        g->head[a + n] = 0;
        len += next;
    }
    if (a > 0 && is_free_run(g->tail[a - 1])) {
        size_t prev = run_len(g->tail[a - 1]);
        g->tail[a - 1] = 0;
        g->head[a] = 0;
        start = a - prev;
        len += prev;
    }
    if (start != a) g->head[a] = 0;
    if (start + len - 1 != a + n - 1) g->tail[a + n - 1] = 0;
    set_run(g, start, len, 1);
    if (g->used_pages) return;
    for (size_t j = 0; j < s->nsegs; j++)
        if (j != i && s->segs[j].used_pages == 0) { /* one empty segment is enough */
            drop_segment(s, s->segs[i].npages > s->segs[j].npages ? i : j);
            return;
        }
}

int ac_store_release(ac_store *s, void *p) {
    if (s == NULL || p == NULL) return AC_EINVAL;
    lock(s);
    size_t a;
    long i = locate(s, p, &a);
    if (i >= 0) {
        give_back(s, (size_t)i, a, run_len(s->segs[i].head[a]));
        s->blocks--;
    }
    unlock(s);
    return i >= 0 ? AC_OK : AC_EINVAL;
}

size_t ac_store_shrink(ac_store *s, void *p, size_t nbytes) {
    if (s == NULL || p == NULL) return 0;
    lock(s);
    size_t a, kept = 0;
    long i = locate(s, p, &a);
    if (i >= 0) {
        segment *g = &s->segs[i];
        size_t have = run_len(g->head[a]);
        size_t want = nbytes == 0 ? 1 : (nbytes + PAGE - 1) / PAGE; /* a block keeps a page */
        if (want < have) {
            g->tail[a + have - 1] = 0;
            set_run(g, a, want, 0);
            set_run(g, a + want, have - want, 0);
            give_back(s, (size_t)i, a + want, have - want);
            have = want;
        }
        kept = have * PAGE;
    }
    unlock(s);
    return kept;
}

void ac_store_stats(ac_store *s, ac_store_usage *st) {
    if (s == NULL || st == NULL) return;
    lock(s);
    st->mapped_bytes = s->mapped_pages * PAGE;
    st->used_bytes = s->used_pages * PAGE;
    st->peak_used_bytes = s->peak_pages * PAGE;
    st->blocks = s->blocks;
    st->segments = s->nsegs;
    unlock(s);
}

void ac_store_reset_peak(ac_store *s) {
    if (s == NULL) return;
    lock(s);
    s->peak_pages = s->used_pages;
    unlock(s);
}
