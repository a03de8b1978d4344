/* Large outputs in mappings of their own. Decoding writes every byte of a new array, and on a
 * fresh array the kernel's page faults, one per 4 KiB, cost more than the decoding: measured
 * here, 64 MiB decoded in 16-22 ms into fresh pages, 4-5 ms into touched ones. Asking for
 * transparent huge pages (one fault per 2 MiB) brings it to 6-7 ms. The advice goes on a
 * mapping of our own, so no other allocation ever shares those huge pages, and freeing it
 * returns the memory to the system at once. */
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
