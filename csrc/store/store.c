/* The activation store: memory the library maps itself for what a training step keeps from
 * its forward pass to its backward and, opted in (actcodec.torch.allocator), torch's large
 * tensors (see actcodec.h). A region of address space is reserved at once (32 GiB on 64-bit
 * systems; a block larger than that gets a region of its own) and pages become resident only
 * when a block first reaches them. A block is a run of whole pages inside one region. Each
 * page run is described by boundary tags: the first and the last page of every run, allocated
 * or free, hold its length and whether it is free, so a released run merges with its free
 * neighbours in constant time. The first region follows a plan made from the step before
 * (see struct ac_store); the other regions' requests are placed first fit. At each reset (a step boundary)
 * the pages neither the plan nor a live block needs are given back to the system (DAF 3.4.4),
 * and a step that repeats the last one never faults. */
#if !defined(_WIN32) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS and madvise under -std=c11 */
#endif
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "actcodec.h"
#include "store_plan.h"
#include "../runtime/threads.h"
#if defined(_WIN32)
#include <windows.h>
#else
#include <sys/mman.h>
#include <unistd.h>
#endif

#define PAGE ((size_t)4096)
#define FREE_BIT 0x80000000u   /* in a boundary tag: the run is free */
#define MAX_RUN 0x7FFFFFFFu    /* pages in one run: 8 TiB */
#define DEFAULT_RESERVE (sizeof(void *) >= 8 ? (size_t)1 << 35 : (size_t)1 << 28)
#define MIN_RESERVE ((size_t)64 << 20)
#define SLACK(n) (((n) + 7) / 8) /* how much a plan entry may differ from the request it serves */
#define MAX_USES 65536    /* allocations a period records; beyond, the next one has no plan */
#define MAX_PLANNED 4096  /* blocks a plan places (it costs O(n^2 log n) at the reset) */

typedef struct {
    unsigned char *base;
    size_t npages, used_pages;
    size_t touched;        /* pages [0, touched) may be resident; none above it is */
    size_t high;           /* the highest block end since the last reset */
    uint32_t *head, *tail; /* boundary tags: length (| FREE_BIT) at a run's first/last page */
    uint32_t *owner;       /* at a block's first page: 1 + its index in the period's uses */
    unsigned char *dropped; /* per page below touched: a free page given back in place
                              (ac_store_give_back_free), not resident until a block takes it */
    size_t ndropped;       /* pages marked in dropped */
} region;

/* A period runs from one reset to the next (a training step). The store records where and
 * when the first region's blocks of a period live (`uses`, in the order they came) and, at
 * the reset, plans where each of them goes the next time (store_plan.h). In the next period
 * a request takes the plan entry of its size whose time in the last period is nearest its
 * own and whose pages are free, so a step that skips, adds or reorders a few requests still
 * follows the plan; a request no entry serves goes where no entry still to come needs the
 * pages while it lives (as far as the plan can tell), so it displaces no other request. */
struct ac_store {
    atomic_flag lock;
    size_t reserve_pages;
    region *regs;
    size_t nregs, cap;
    size_t used_pages, peak_pages, touched_pages, blocks;
    plan_block *uses;       /* this period's allocations in region 0 */
    size_t nuses, ucap, clock; /* clock: allocations and releases so far this period */
    size_t now;             /* where this period is in the last one's time: the time of the last
                               entry taken, plus the releases since */
    int lost;               /* a use went unrecorded (out of memory): no plan from this period */
    plan_block *plan;       /* the last period's uses, placed: .pages and .at */
    unsigned char *taken;   /* per plan entry: a block of this period took it */
    size_t nplan, plan_top;
};

static void lock(ac_store *s) {
    unsigned spins = 0;
    while (atomic_flag_test_and_set_explicit(&s->lock, memory_order_acquire))
        if (++spins % 64 == 0) ac_yield();
}
static void unlock(ac_store *s) { atomic_flag_clear_explicit(&s->lock, memory_order_release); }

/* Address space only: nothing is resident, or counted against the system's commit limit,
 * until committed. `huge`: ask for transparent huge pages (a hint; fewer faults and TLB
 * misses on large blocks). */
static void *reserve(size_t bytes, int huge) {
#if defined(_WIN32)
    (void)huge;
    return VirtualAlloc(NULL, bytes, MEM_RESERVE, PAGE_NOACCESS);
#else
    void *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
#if defined(MADV_HUGEPAGE)
    if (huge) madvise(p, bytes, MADV_HUGEPAGE);
#else
    (void)huge;
#endif
    return p;
#endif
}

static void unreserve(void *p, size_t bytes) {
#if defined(_WIN32)
    (void)bytes;
    VirtualFree(p, 0, MEM_RELEASE);
#else
    munmap(p, bytes);
#endif
}

/* Makes reserved [p, p + bytes) usable (pages become resident when first written); 0 on
 * success. */
static int commit(void *p, size_t bytes) {
#if defined(_WIN32)
    return VirtualAlloc(p, bytes, MEM_COMMIT, PAGE_READWRITE) == NULL;
#else
    return mprotect(p, bytes, PROT_READ | PROT_WRITE) != 0;
#endif
}

/* Gives the pages of committed [p, p + bytes) back to the system; the range stays reserved. */
static void decommit(void *p, size_t bytes) {
#if defined(_WIN32)
    VirtualFree(p, bytes, MEM_DECOMMIT);
#else
    madvise(p, bytes, MADV_DONTNEED);
    mprotect(p, bytes, PROT_NONE);
#endif
}

/* Marks pages [a, a + n) of g as one run. */
static void set_run(region *g, size_t a, size_t n, int is_free) {
    uint32_t tag = (uint32_t)n | (is_free ? FREE_BIT : 0u);
    g->head[a] = tag;
    g->tail[a + n - 1] = tag;
}

static int is_free_run(uint32_t tag) { return (tag & FREE_BIT) != 0; }
static size_t run_len(uint32_t tag) { return tag & ~FREE_BIT; }

ac_store *ac_store_new(size_t reserve_bytes) {
    if (reserve_bytes == 0) reserve_bytes = DEFAULT_RESERVE;
    size_t pages = reserve_bytes / PAGE + (reserve_bytes % PAGE != 0);
    if (pages > MAX_RUN) return NULL;
    ac_store *s = calloc(1, sizeof *s);
    if (s == NULL) return NULL;
    atomic_flag_clear(&s->lock);
    s->reserve_pages = pages;
    return s;
}

/* Bytes of a region's bookkeeping: three tags and a dropped mark per page. */
static size_t tag_bytes(size_t npages) { return 3 * npages * sizeof(uint32_t) + npages; }

static void drop_region(ac_store *s, size_t i) {
    region *g = &s->regs[i];
    unreserve(g->base, g->npages * PAGE);
    unreserve(g->head, tag_bytes(g->npages));
    s->touched_pages -= g->touched;
    memmove(g, g + 1, (s->nregs - i - 1) * sizeof *g); /* keep the order: first fit by age */
    s->nregs--;
}

void ac_store_delete(ac_store *s) {
    if (s == NULL) return;
    while (s->nregs) drop_region(s, s->nregs - 1);
    free(s->regs);
    free(s->uses);
    free(s->plan);
    free(s->taken);
    free(s);
}

/* A new region of at least `pages` pages (the reservation, or halves of it down to `pages`
 * where the system refuses that much address space); its index, or -1. */
static long add_region(ac_store *s, size_t pages) {
    if (s->nregs == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 4;
        region *grown = realloc(s->regs, cap * sizeof *grown);
        if (grown == NULL) return -1;
        s->regs = grown;
        s->cap = cap;
    }
    size_t n = pages > s->reserve_pages ? pages : s->reserve_pages;
    for (;;) {
        region g = {reserve(n * PAGE, 1), n, 0, 0, 0, NULL, NULL, NULL, NULL, 0};
        /* The tags are reserved too: only the pages holding tags in use become resident. */
        uint32_t *tags = g.base ? reserve(tag_bytes(n), 0) : NULL;
        if (tags != NULL && commit(tags, tag_bytes(n)) == 0) {
            g.head = tags;
            g.tail = tags + n;
            g.owner = tags + 2 * n;
            g.dropped = (unsigned char *)(tags + 3 * n);
            set_run(&g, 0, n, 1);
            s->regs[s->nregs] = g;
            return (long)s->nregs++;
        }
        if (tags) unreserve(tags, tag_bytes(n));
        if (g.base) unreserve(g.base, n * PAGE);
        if (n / 2 < pages || n / 2 < MIN_RESERVE / PAGE) return -1;
        n /= 2;
    }
}

/* First fit in g at or above page `lo`: where n pages go (npages if nowhere), and the start
 * of the free run they come from in *run. The lowest address wins, so blocks pack toward the
 * region's start. */
static size_t find_run(const region *g, size_t n, size_t lo, size_t *run) {
    for (size_t a = 0; a < g->npages; a += run_len(g->head[a])) {
        size_t len = run_len(g->head[a]), at = a > lo ? a : lo;
        if (is_free_run(g->head[a]) && at < a + len && a + len - at >= n) {
            *run = a;
            return at;
        }
    }
    return g->npages;
}

/* Whether pages [at, at + n) of g are free; the free run holding them in *run. */
static int is_free(const region *g, size_t at, size_t n, size_t *run) {
    for (size_t a = 0; a < g->npages; a += run_len(g->head[a])) {
        size_t len = run_len(g->head[a]);
        if (at < a + len) {
            *run = a;
            return is_free_run(g->head[a]) && at + n <= a + len;
        }
    }
    return 0;
}

/* Pages [a, b) of g are no longer given back in place (a block takes them, or they leave the
 * pages below touched). */
static void undrop(region *g, size_t a, size_t b) {
    for (size_t p = a; g->ndropped && p < b; p++)
        if (g->dropped[p]) {
            g->dropped[p] = 0;
            g->ndropped--;
        }
}

/* Takes pages [at, at + n) from the free run starting at `run`; 0 on success. */
static int take(ac_store *s, region *g, size_t run, size_t at, size_t n) {
    undrop(g, at, at + n < g->touched ? at + n : g->touched);
    if (at + n > g->touched) {
        if (commit(g->base + g->touched * PAGE, (at + n - g->touched) * PAGE) != 0) return -1;
        s->touched_pages += at + n - g->touched;
        g->touched = at + n;
    }
    size_t have = run_len(g->head[run]);
    if (at > run) { /* the run's head stays free */
        g->tail[run + have - 1] = 0;
        set_run(g, run, at - run, 1);
    }
    set_run(g, at, n, 0);
    if (run + have > at + n) set_run(g, at + n, run + have - at - n, 1);
    if (at + n > g->high) g->high = at + n;
    g->used_pages += n;
    s->used_pages += n;
    if (s->used_pages > s->peak_pages) s->peak_pages = s->used_pages;
    s->blocks++;
    return 0;
}

/* Whether a plan entry other than `skip`, not yet taken, needs any of pages [at, at + n) at
 * some moment of [from, to). */
static int claimed(const ac_store *s, size_t at, size_t n, size_t from, size_t to, size_t skip) {
    for (size_t k = 0; k < s->nplan; k++) {
        const plan_block *e = &s->plan[k];
        if (k != skip && !s->taken[k] && e->at < at + n && at < e->at + e->pages &&
            e->start < to && from < e->end)
            return 1;
    }
    return 0;
}

static size_t distance(size_t a, size_t b) { return a > b ? a - b : b - a; }

/* A plan entry a request of n pages may take: up to SLACK(n) larger or smaller (payloads that
 * hold a data-dependent number of nonzeros change size from step to step). */
static int similar(size_t pages, size_t n) { return pages + SLACK(n) >= n && pages <= n + SLACK(n); }

/* A larger plan entry a request of n pages may take where no similar one is free: up to twice
 * its size. A smaller request in its place wastes the rest for the period but displaces no
 * other (the micro-batches of a batch that does not divide evenly: each request of a smaller
 * one is a fixed fraction smaller than the larger one's, which the plan was made from). */
static int roomy(size_t pages, size_t n) { return pages > n + SLACK(n) && pages <= 2 * n; }

#define TRIES 8 /* plan entries a request looks at, nearest in time first */

/* The plan entry of a size similar to n (with larger: roomy for n) nearest the period's `now`,
 * among those not taken (all, with any_taken) and not in skip[0..nskip); nplan if none. */
static size_t nearest(const ac_store *s, size_t n, int any_taken, const size_t *skip,
                      size_t nskip, int larger) {
    size_t best = s->nplan, best_gap = SIZE_MAX;
    for (size_t j = 0; j < s->nplan; j++) {
        size_t gap = distance(s->plan[j].start, s->now);
        int fits = larger ? roomy(s->plan[j].pages, n) : similar(s->plan[j].pages, n);
        if ((s->taken[j] && !any_taken) || !fits || gap >= best_gap)
            continue;
        int skipped = 0;
        for (size_t i = 0; i < nskip; i++) skipped |= skip[i] == j;
        if (!skipped) {
            best = j;
            best_gap = gap;
        }
    }
    return best;
}

/* Where the plan puts a request of n pages now: the entry of a similar size nearest the
 * period's `now` whose pages are free now, else such a roomy one. An entry smaller than n
 * serves only if the pages it lacks are free and no entry still to come needs them during its
 * time. npages if none. */
static size_t planned(ac_store *s, size_t n, size_t *run) {
    const region *g = &s->regs[0];
    for (int larger = 0; larger < 2; larger++) {
        size_t tried[TRIES];
        for (size_t t = 0; t < TRIES; t++) {
            size_t best = nearest(s, n, 0, tried, t, larger);
            if (best == s->nplan) break;
            tried[t] = best;
            const plan_block *e = &s->plan[best];
            if (!is_free(g, e->at, n, run)) continue;
            size_t from = e->start < s->now ? e->start : s->now;
            if (e->pages < n && claimed(s, e->at + e->pages, n - e->pages, from,
                                        from + (e->end - e->start) + distance(e->start, s->now),
                                        best))
                continue;
            s->taken[best] = 1;
            s->now = e->start + 1;
            return e->at;
        }
    }
    return g->npages;
}

/* Where a request the plan does not serve goes in region 0: the lowest pages free now that no
 * entry still to come needs while the request is expected to live (as long as the entry
 * nearest in time among those of a similar size; without one, to the period's end), so it
 * displaces no later request. npages if nowhere. */
static size_t unplanned(ac_store *s, size_t n, size_t *run) {
    region *g = &s->regs[0];
    if (!s->nplan) return find_run(g, n, 0, run);
    size_t like = nearest(s, n, 1, NULL, 0, 0), nruns = 0;
    size_t to = like == s->nplan ? SIZE_MAX : s->now + (s->plan[like].end - s->plan[like].start);
    for (size_t a = 0; a < g->npages; a += run_len(g->head[a])) nruns++;
    plan_block *busy = malloc((nruns + s->nplan) * sizeof *busy);
    if (busy == NULL) return find_run(g, n, s->plan_top, run); /* above the plan: displaces none */
    size_t m = 0;
    for (size_t a = 0; a < g->npages; a += run_len(g->head[a]))
        if (!is_free_run(g->head[a])) busy[m++] = (plan_block){run_len(g->head[a]), 0, 0, a};
    for (size_t j = 0; j < s->nplan; j++) {
        const plan_block *e = &s->plan[j];
        if (!s->taken[j] && e->start < to && s->now < e->end) busy[m++] = *e;
    }
    size_t at = plan_first_gap(busy, m, n);
    free(busy);
    return n <= g->npages && at <= g->npages - n && is_free(g, at, n, run) ? at : g->npages;
}

/* Records a block of region 0 among the period's uses. */
static void record(ac_store *s, size_t at, size_t n) {
    if (s->nuses == s->ucap) {
        size_t cap = s->ucap ? 2 * s->ucap : 256;
        plan_block *grown = cap <= MAX_USES ? realloc(s->uses, cap * sizeof *grown) : NULL;
        if (grown == NULL) {
            s->lost = 1;
            return;
        }
        s->uses = grown;
        s->ucap = cap;
    }
    s->uses[s->nuses] = (plan_block){n, s->clock, SIZE_MAX, at};
    s->regs[0].owner[at] = (uint32_t)++s->nuses;
}

void *ac_store_alloc(ac_store *s, size_t nbytes) {
    if (s == NULL || nbytes == 0 || nbytes > (size_t)MAX_RUN * PAGE) return NULL;
    size_t n = (nbytes + PAGE - 1) / PAGE;
    lock(s);
    void *p = NULL;
    if (s->nregs) { /* region 0: the plan, else where the plan needs no pages meanwhile */
        region *g = &s->regs[0];
        size_t run = 0, at = planned(s, n, &run);
        if (at == g->npages) at = unplanned(s, n, &run);
        if (at < g->npages && take(s, g, run, at, n) == 0) {
            p = g->base + at * PAGE;
            record(s, at, n);
        }
    }
    for (size_t i = 1; i < s->nregs && p == NULL; i++) {
        size_t run, at = find_run(&s->regs[i], n, 0, &run);
        if (at < s->regs[i].npages && take(s, &s->regs[i], run, at, n) == 0)
            p = s->regs[i].base + at * PAGE;
    }
    if (p == NULL) {
        long i = add_region(s, n);
        if (i >= 0 && take(s, &s->regs[i], 0, 0, n) == 0) {
            p = s->regs[i].base;
            if (i == 0) record(s, 0, n);
        }
    }
    s->clock++;
    unlock(s);
    return p;
}

/* The region holding p, and p's page in it; -1 if p is no block's start. */
static long locate(const ac_store *s, const void *p, size_t *page) {
    const unsigned char *q = p;
    for (size_t i = 0; i < s->nregs; i++) {
        const region *g = &s->regs[i];
        if (q < g->base || q >= g->base + g->npages * PAGE) continue;
        size_t off = (size_t)(q - g->base);
        if (off % PAGE) return -1;
        *page = off / PAGE;
        uint32_t tag = g->head[*page];
        return tag != 0 && !is_free_run(tag) ? (long)i : -1;
    }
    return -1;
}

/* Frees the allocated run [a, a + n) of region g, merging it with free neighbours. */
static void give_back(ac_store *s, region *g, size_t a, size_t n) {
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
}

int ac_store_release(ac_store *s, void *p) {
    if (s == NULL || p == NULL) return AC_EINVAL;
    lock(s);
    size_t a;
    long i = locate(s, p, &a);
    if (i >= 0) {
        region *g = &s->regs[i];
        if (i == 0 && g->owner[a]) { /* a use of this period: it ends now */
            s->uses[g->owner[a] - 1].end = s->clock;
            g->owner[a] = 0;
        }
        give_back(s, g, a, run_len(g->head[a]));
        s->blocks--;
        s->clock++;
        s->now += i == 0;
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
        region *g = &s->regs[i];
        size_t have = run_len(g->head[a]);
        size_t want = nbytes == 0 ? 1 : (nbytes + PAGE - 1) / PAGE; /* a block keeps a page */
        if (want < have) {
            if (i == 0 && g->owner[a]) s->uses[g->owner[a] - 1].pages = want;
            g->tail[a + have - 1] = 0;
            set_run(g, a, want, 0);
            set_run(g, a + want, have - want, 0);
            give_back(s, g, a + want, have - want);
            have = want;
        }
        kept = have * PAGE;
    }
    unlock(s);
    return kept;
}

void ac_store_restart_peak(ac_store *s) {
    if (s == NULL) return;
    lock(s);
    s->peak_pages = s->used_pages;
    unlock(s);
}

void ac_store_stats(ac_store *s, ac_store_usage *st) {
    if (s == NULL || st == NULL) return;
    lock(s);
    size_t reserved = 0;
    for (size_t i = 0; i < s->nregs; i++) reserved += s->regs[i].npages;
    st->reserved_bytes = reserved * PAGE;
    size_t dropped = 0;
    for (size_t i = 0; i < s->nregs; i++) dropped += s->regs[i].ndropped;
    st->mapped_bytes = (s->touched_pages - dropped) * PAGE;
    st->used_bytes = s->used_pages * PAGE;
    st->peak_used_bytes = s->peak_pages * PAGE;
    st->blocks = s->blocks;
    st->regions = s->nregs;
    unlock(s);
}

/* Plans the next period from this one's uses in region 0: the blocks it freed are placed
 * around the blocks still live (store_plan.h). No plan where it freed none, or where it
 * cannot be planned. */
static void make_plan(ac_store *s) {
    region *g = &s->regs[0];
    size_t ended = 0, nlive = 0;
    for (size_t k = 0; k < s->nuses; k++) ended += s->uses[k].end != SIZE_MAX;
    for (size_t a = 0; a < g->npages; a += run_len(g->head[a])) nlive += !is_free_run(g->head[a]);
    plan_block *plan = ended && ended <= MAX_PLANNED && !s->lost
                           ? malloc((s->nuses + nlive) * sizeof *plan) : NULL;
    free(s->plan);
    free(s->taken);
    s->plan = NULL;
    s->taken = NULL;
    s->nplan = s->plan_top = 0;
    if (plan == NULL) return;
    plan_block *live = plan + s->nuses;
    size_t m = 0;
    for (size_t a = 0; a < g->npages; a += run_len(g->head[a]))
        if (!is_free_run(g->head[a])) live[m++] = (plan_block){run_len(g->head[a]), 0, 0, a};
    size_t n = 0;
    for (size_t k = 0; k < s->nuses; k++)
        if (s->uses[k].end != SIZE_MAX) plan[n++] = s->uses[k]; /* in the order they came */
    size_t top = plan_place(plan, n, live, nlive);
    unsigned char *taken = calloc(n, 1);
    if (top == SIZE_MAX || top > g->npages || taken == NULL) {
        free(plan);
        free(taken);
        return;
    }
    s->plan = plan;
    s->taken = taken;
    s->nplan = n;
    s->plan_top = top;
}

/* Gives back each region's pages above what the next period needs: the plan's span (and the
 * blocks still live) in region 0 when there is a plan, else the highest block end of the
 * period just ended; drops the regions after the first that hold nothing. */
static void trim(ac_store *s) {
    for (size_t i = 0; i < s->nregs; i++) {
        region *g = &s->regs[i];
        uint32_t last = g->tail[g->npages - 1];
        size_t live_end = is_free_run(last) ? g->npages - run_len(last) : g->npages;
        size_t need = i == 0 && s->nplan ? s->plan_top : g->high;
        size_t keep = need > live_end ? need : live_end;
        if (keep < g->touched) {
            undrop(g, keep, g->touched);
            decommit(g->base + keep * PAGE, (g->touched - keep) * PAGE);
            s->touched_pages -= g->touched - keep;
            g->touched = keep;
        }
        g->high = live_end;
    }
    for (size_t i = s->nregs; i-- > 1;)
        if (s->regs[i].used_pages == 0 && s->regs[i].touched == 0) drop_region(s, i);
}

/* Starts a period: the blocks still live become part of the past (no use of this one). */
static void new_period(ac_store *s) {
    region *g = &s->regs[0];
    for (size_t k = 0; k < s->nuses; k++)
        if (s->uses[k].end == SIZE_MAX) g->owner[s->uses[k].at] = 0;
    s->nuses = s->clock = s->now = 0;
    s->lost = 0;
}

void ac_store_forget_plan(ac_store *s) {
    if (s == NULL) return;
    lock(s);
    free(s->plan);
    free(s->taken);
    s->plan = NULL;
    s->taken = NULL;
    s->nplan = s->plan_top = 0;
    if (s->nregs) new_period(s);
    s->peak_pages = s->used_pages;
    unlock(s);
}

size_t ac_store_give_back_free(ac_store *s) {
    if (s == NULL) return 0;
    size_t gone = 0;
    lock(s);
#if !defined(_WIN32)
    for (size_t i = 0; i < s->nregs; i++) {
        region *g = &s->regs[i];
        for (size_t a = 0; a < g->touched; a += run_len(g->head[a])) {
            size_t end = a + run_len(g->head[a]);
            if (!is_free_run(g->head[a])) continue;
            if (end > g->touched) end = g->touched;
            /* the pages stay usable: a block that takes them gets zero pages, faulted in */
            madvise(g->base + a * PAGE, (end - a) * PAGE, MADV_DONTNEED);
            for (size_t p = a; p < end; p++)
                if (!g->dropped[p]) {
                    g->dropped[p] = 1;
                    g->ndropped++;
                    gone++;
                }
        }
    }
#endif
    unlock(s);
    return gone * PAGE;
}

void ac_store_reset_peak(ac_store *s) {
    if (s == NULL) return;
    lock(s);
    if (s->nregs) {
        make_plan(s);
        trim(s);
        new_period(s);
    }
    s->peak_pages = s->used_pages;
    unlock(s);
}
