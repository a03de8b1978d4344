/* A fast 64-bit checksum for the container format: four independent multiply-rotate lanes
 * over 32-byte stripes (several GB/s, so it never dominates encode), then a length fold and a
 * final avalanche. Words are read little-endian so the value is the same on every platform.
 * It detects accidental corruption; it is not a cryptographic MAC. */
#include <string.h>
#include "actcodec.h"

#define K1 0x9E3779B97F4A7C15ull /* 2^64 / golden ratio, odd */
#define K2 0xD6E8FEB86659FD93ull /* odd mixing constant */

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t load_le64(const unsigned char *p) {
    uint64_t w;
    memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

static inline uint64_t mix_lane(uint64_t acc, uint64_t w) {
    return rotl64(acc + w * K2, 29) * K1;
}

static inline uint64_t avalanche(uint64_t x) {
    x ^= x >> 32;
    x *= K2;
    x ^= x >> 29;
    x *= K1;
    x ^= x >> 32;
    return x;
}

uint64_t ac_checksum64(const void *data, size_t nbytes, uint64_t seed) {
    const unsigned char *p = data;
    uint64_t a = seed + K1, b = seed ^ K2, c = seed + 1, d = seed - K1;
    size_t i = 0;
    for (; i + 32 <= nbytes; i += 32) {
        a = mix_lane(a, load_le64(p + i));
        b = mix_lane(b, load_le64(p + i + 8));
        c = mix_lane(c, load_le64(p + i + 16));
        d = mix_lane(d, load_le64(p + i + 24));
    }
    uint64_t h = rotl64(a, 1) + rotl64(b, 7) + rotl64(c, 12) + rotl64(d, 18);
    h ^= (uint64_t)nbytes * K1;
    for (; i + 8 <= nbytes; i += 8) h = mix_lane(h, load_le64(p + i));
    for (; i < nbytes; i++) h = mix_lane(h, (uint64_t)p[i] + 1);
    return avalanche(h);
}
