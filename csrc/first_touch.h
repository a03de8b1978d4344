/* Internal: where a large output is first written.
 *
 * In newly mapped memory the kernel zeroes a whole 2 MiB huge page at its first write, and
 * the address of that write sets the order: it zeroes the 4 KiB pieces far from the write
 * first and those around it last. Faulted at its first byte, a huge page is zeroed back to
 * front, and that is much slower here than front to back, which is what a fault at its last
 * byte gets. So a writer going front to back first stores one byte at the end of each 2 MiB
 * stretch it enters (a byte it writes again later), then writes the stretch as usual.
 *
 * Measured with bench/first_touch.c (Linux 6.18, 2 threads, 64 MiB newly mapped, 31
 * interleaved rounds, five runs): one store per huge page at its first byte 3.1-4.1 ms, at its
 * last byte 1.9-2.3 ms; a memset of each huge page 3.5-4.9 ms faulted at the first byte,
 * 2.3-2.9 ms at the last. Old and new code side by side: bitmap decode 1.16-1.26 -> 0.78-0.85
 * of the copy, 2-bit quant decode 1.07-1.18 -> 0.71-0.81. In memory already mapped the extra
 * store is one cache line per 2 MiB and the decode times are the same. */
#ifndef ACTCODEC_FIRST_TOUCH_H
#define ACTCODEC_FIRST_TOUCH_H

#include <stddef.h>
#include <stdint.h>

#define AC_STRETCH_BYTES ((size_t)2 << 20)

/* Before a writer that owns [p, end) writes on from p, front to back: stores a zero at the
 * last byte of p's 2 MiB stretch that lies before end, and returns the address where the
 * next stretch starts (call again once the writer gets there). */
static inline uintptr_t ac_touch_stretch_end(unsigned char *p, unsigned char *end) {
    uintptr_t next = ((uintptr_t)p / AC_STRETCH_BYTES + 1) * AC_STRETCH_BYTES;
    unsigned char *last = next < (uintptr_t)end ? (unsigned char *)next - 1 : end - 1;
    if (last >= p) *(volatile unsigned char *)last = 0;
    return next;
}

/* A front-to-back writer of [.., end) calls this before writing at p, with *next 0 at its
 * start: it touches the end of each stretch the first time the writer enters it. */
static inline void ac_first_touch(unsigned char *p, unsigned char *end, uintptr_t *next) {
    if ((uintptr_t)p >= *next) *next = ac_touch_stretch_end(p, end);
}

/* 1 if the page holding p has never been written (Linux: not resident), else 0; 0 where the
 * system cannot tell. pages.c. */
int ac_page_unmapped(const void *p);

#endif
