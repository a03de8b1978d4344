/* Internal: copies whose destination is not read again soon (encoded payloads). */
#ifndef ACTCODEC_STREAM_H
#define ACTCODEC_STREAM_H

#include <stddef.h>

/* memcpy, except that on x86-64 the whole 64-byte lines of dst are written with
 * non-temporal stores: no read of the old line before the write, and the payload does not
 * push the caller's working set out of cache. The bytes of dst's first and last partial
 * lines are written with ordinary stores, so no line that dst shares with other data is
 * written whole. Call ac_stream_fence before another thread reads dst. */
void ac_stream_copy(void *dst, const void *src, size_t n);
/* Orders this thread's non-temporal stores before its later stores (sfence on x86-64). */
void ac_stream_fence(void);

#endif
