/* Large outputs in mappings of their own. Decoding writes every byte of a new array; on fresh
 * 4 KiB pages the page faults cost more than the decoding (64 MiB: 16-22 ms into a fresh
 * mapping, 4-5 ms into touched memory, measured in C here). Asking for transparent huge pages,
 * one fault per 2 MiB, brings it to 6-7 ms. The advice goes on a mapping of our own, so no
 * other allocation ever shares those huge pages, and freeing it returns the memory to the
 * system at once. The mapping starts on a 2 MiB boundary: the kernel backs only whole aligned
 * 2 MiB stretches with huge pages, and an unaligned start left up to 2 MiB of small pages
 * (about 400 extra faults per 64 MiB output, seen with strace and getrusage). */
#if defined(__linux__)
#define _GNU_SOURCE
#include <sys/mman.h>
#include <stdint.h>
#include <unistd.h>
#endif
#include <stdlib.h>
#include "actcodec.h"
#include "first_touch.h"

#define HUGE_BYTES ((size_t)2 << 20)

static size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

#if defined(__linux__)
/* The kernel's page size: 4 KiB on x86-64, but 16 or 64 KiB on some aarch64 kernels, and
 * munmap only takes whole pages. */
static size_t page_bytes(void) {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}
#endif

void *ac_alloc_pages(size_t nbytes) {
    if (nbytes == 0) return NULL;
#if defined(__linux__)
    size_t page = page_bytes();
    if (nbytes > SIZE_MAX - HUGE_BYTES - page) return NULL;
    size_t len = round_up(nbytes, page);
    size_t pad = len >= HUGE_BYTES && page < HUGE_BYTES ? HUGE_BYTES - page : 0;
    unsigned char *raw = mmap(NULL, len + pad, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    /* Over-map by 2 MiB less a page, then unmap what lies before the first 2 MiB boundary and
     * after the aligned stretch (mmap returns page-aligned addresses). */
    unsigned char *p = raw;
    if (pad) {
        p = (unsigned char *)round_up((uintptr_t)raw, HUGE_BYTES);
        size_t head = (size_t)(p - raw), tail = pad - head;
        if (head) munmap(raw, head);
        if (tail) munmap(p + len, tail);
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(p, len, MADV_HUGEPAGE); /* advice only: without THP, small pages */
#endif
    return p;
#else
    return calloc(1, nbytes);
#endif
}

size_t ac_shrink_pages(void *p, size_t nbytes, size_t keep) {
    if (p == NULL || keep >= nbytes) return nbytes;
#if defined(__linux__)
    /* Keep at least one page (a mapping cannot be empty). Pages never touched were never
     * backed, so this gives back address space; touched ones go back to the system. If the
     * kernel refuses, the whole mapping stays and is freed whole. */
    size_t page = page_bytes();
    size_t old_len = round_up(nbytes, page), new_len = round_up(keep ? keep : 1, page);
    if (new_len >= old_len) return nbytes;
    return munmap((unsigned char *)p + new_len, old_len - new_len) == 0 ? new_len : nbytes;
#else
    return nbytes; /* calloc'd memory keeps its size */
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

int ac_page_unmapped(const void *p) {
#if defined(__linux__)
    /* mincore reports whether the page is resident; anonymous memory never written is not. */
    size_t page = page_bytes();
    unsigned char resident = 1;
    void *start = (void *)((uintptr_t)p / page * page);
    return mincore(start, page, &resident) == 0 && (resident & 1) == 0;
#else
    (void)p;
    return 0;
#endif
}
