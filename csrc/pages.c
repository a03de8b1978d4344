/* Large outputs in mappings of their own. Decoding writes every byte of a new array; on fresh
 * 4 KiB pages the page faults cost more than the decoding (64 MiB: 16-22 ms into a fresh
 * mapping, 4-5 ms into touched memory, measured in C here). Asking for transparent huge pages,
 * one fault per 2 MiB, brings it to 6-7 ms. The advice goes on a mapping of our own, so no
 * other allocation ever shares those huge pages, and freeing it returns the memory to the
 * system at once. */
#if defined(__linux__)
#define _GNU_SOURCE
#include <sys/mman.h>
#endif
#include <stdlib.h>
#include "actcodec.h"

void *ac_alloc_pages(size_t nbytes) {
    if (nbytes == 0) return NULL;
#if defined(__linux__)
    void *p = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, nbytes, MADV_HUGEPAGE); /* advice only: without THP, small pages */
#endif
    return p;
#else
    return calloc(1, nbytes);
#endif
}

void ac_free_pages(void *p, size_t nbytes) {
    if (p == NULL) return;
#if defined(__linux__)
    munmap(p, nbytes);
#else
    (void)nbytes;
    free(p);
#endif
}
