/* Placement of a training step's blocks from their sizes and lifetimes: the plan the store
 * (store.c) follows in the next step, which repeats the last one's requests. */
#ifndef AC_STORE_PLAN_H
#define AC_STORE_PLAN_H

#include <stddef.h>

typedef struct {
    size_t pages;      /* its size */
    size_t start, end; /* live from the start-th to the end-th event of the step */
    size_t at;         /* its first page: set by plan_place (given, for fixed blocks) */
} plan_block;

/* Places blocks[0..n): each at the lowest page where it overlaps no fixed block (those hold
 * their pages for the whole step) and no block placed before it that is live at some same
 * moment, largest first (ties: the longer-lived, then the earlier). Largest first packs the
 * blocks of a training step to their peak of simultaneous use, where first fit, which places
 * blocks in the order they come, leaves holes the large ones do not fit (measured on the
 * steps of transformer and ResNet models, see docs/MEMORY.md). Returns the pages the plan
 * spans (the highest block end, fixed ones included), or (size_t)-1 if out of memory. */
size_t plan_place(plan_block *blocks, size_t n, const plan_block *fixed, size_t nfixed);

/* The lowest page from which `pages` pages meet none of blocks[0..n) (their times are not
 * looked at; the array is sorted by `at` in place). */
size_t plan_first_gap(plan_block *blocks, size_t n, size_t pages);

#endif
