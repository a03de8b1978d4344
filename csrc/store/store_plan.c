/* Greedy placement of blocks with known lifetimes (see store_plan.h). For each block, in
 * order, the pages taken by the blocks it could collide with are sorted and the first gap
 * that holds it wins: O(n^2 log n) for n blocks, done once per step. */
#include <stdint.h>
#include <stdlib.h>
#include "store_plan.h"

typedef struct {
    size_t at, end;
} span;

typedef struct {
    size_t pages, life, start, index;
} rank; /* the sort key of a block, beside its index (qsort takes no context in C11) */

static int larger_first(const void *pa, const void *pb) {
    const rank *a = pa, *b = pb;
    if (a->pages != b->pages) return a->pages > b->pages ? -1 : 1;
    if (a->life != b->life) return a->life > b->life ? -1 : 1;
    return (a->start > b->start) - (a->start < b->start);
}

static int lower_first(const void *pa, const void *pb) {
    const span *a = pa, *b = pb;
    return (a->at > b->at) - (a->at < b->at);
}

/* The lowest page from which `pages` pages meet none of spans[0..n) (sorted by start). */
static size_t first_gap(const span *spans, size_t n, size_t pages) {
    size_t at = 0;
    for (size_t i = 0; i < n && spans[i].at < at + pages; i++)
        if (spans[i].end > at) at = spans[i].end;
    return at;
}

size_t plan_place(plan_block *blocks, size_t n, const plan_block *fixed, size_t nfixed) {
    size_t top = 0;
    for (size_t i = 0; i < nfixed; i++)
        if (fixed[i].at + fixed[i].pages > top) top = fixed[i].at + fixed[i].pages;
    if (n == 0) return top;
    rank *order = malloc(n * sizeof *order);
    span *spans = malloc((n + nfixed) * sizeof *spans);
    if (order == NULL || spans == NULL) {
        free(order);
        free(spans);
        return SIZE_MAX;
    }
    for (size_t i = 0; i < n; i++)
        order[i] = (rank){blocks[i].pages, blocks[i].end - blocks[i].start, blocks[i].start, i};
    qsort(order, n, sizeof *order, larger_first);
    for (size_t k = 0; k < n; k++) {
        plan_block *b = &blocks[order[k].index];
        size_t m = 0;
        for (size_t i = 0; i < nfixed; i++)
            spans[m++] = (span){fixed[i].at, fixed[i].at + fixed[i].pages};
        for (size_t j = 0; j < k; j++) { /* the blocks placed so far */
            const plan_block *o = &blocks[order[j].index];
            if (o->start < b->end && b->start < o->end) spans[m++] = (span){o->at, o->at + o->pages};
        }
        qsort(spans, m, sizeof *spans, lower_first);
        b->at = first_gap(spans, m, b->pages);
        if (b->at + b->pages > top) top = b->at + b->pages;
    }
    free(order);
    free(spans);
    return top;
}

static int lower_block_first(const void *pa, const void *pb) {
    const plan_block *a = pa, *b = pb;
    return (a->at > b->at) - (a->at < b->at);
}

size_t plan_first_gap(plan_block *blocks, size_t n, size_t pages) {
    qsort(blocks, n, sizeof *blocks, lower_block_first);
    size_t at = 0;
    for (size_t i = 0; i < n && blocks[i].at < at + pages; i++)
        if (blocks[i].at + blocks[i].pages > at) at = blocks[i].at + blocks[i].pages;
    return at;
}
