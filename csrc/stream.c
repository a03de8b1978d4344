/* Non-temporal copies (see stream.h). SSE2 is part of x86-64 itself, so no dispatch is
 * needed; elsewhere this is memcpy. */
#include "stream.h"

#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define AC_STREAM_X86 1
#endif

void ac_stream_copy(void *dst, const void *src, size_t n) {
#ifdef AC_STREAM_X86
    unsigned char *d = dst;
    const unsigned char *s = src;
    size_t head = (64 - ((uintptr_t)d & 63)) & 63;
    if (n < head + 64) {
        memcpy(d, s, n);
        return;
    }
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    size_t body = n & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    memcpy(d + body, s + body, n - body);
#else
    memcpy(dst, src, n);
#endif
}

void ac_stream_fence(void) {
#ifdef AC_STREAM_X86
    _mm_sfence();
#endif
}
