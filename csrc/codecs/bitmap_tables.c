/* Shuffle tables for the SIMD bitmap kernels (layout and conventions in bitmap_tables.h).
 * Every entry is a constant expression of its mask, so the tables are plain read-only data:
 * no generator step in the build and no run-time initialisation to race on. */
#include "bitmap_tables.h"

#define BIT(m, j) (((m) >> (j)) & 1u)
/* Popcount of x < 256 that names x once (four spaced copies of x, one bit of each kept,
 * summed by a multiply), which keeps the nested expansions below small. */
#define POP8(x) (((((x) * 0x08040201u) >> 3) & 0x11111111u) * 0x11111111u >> 28)
/* Number of set bits of m below bit j: the rank of lane j among the kept lanes. */
#define RANK(m, j) POP8((m) & ((1u << (j)) - 1u))

/* Byte h of a lane that is w bytes wide and comes from input lane j. */
#define BYTE_OF(j, w, h) ((j) * (w) + (h))

/* Pack: byte h of output lane k comes from the lane holding the k-th set bit of m; lanes
 * past popcount(m) are zero. That lane's number is how many prefixes m & (2^(j+1) - 1)
 * hold at most k set bits, since the prefix counts rise by one at each set bit. */
#define UPTO(m, j) POP8((m) & ((2u << (j)) - 1u))
#define KTH_SET(m, k)                                                                   \
    ((UPTO(m, 0) <= (k)) + (UPTO(m, 1) <= (k)) + (UPTO(m, 2) <= (k)) + (UPTO(m, 3) <= (k)) + \
     (UPTO(m, 4) <= (k)) + (UPTO(m, 5) <= (k)) + (UPTO(m, 6) <= (k)) + (UPTO(m, 7) <= (k)))
#define PACK(m, k, w, h) ((k) < POP8(m) ? BYTE_OF(KTH_SET(m, k), w, h) : 0x80u)
/* Expand: byte h of output lane j comes from packed lane rank(j) if bit j is set. */
#define EXPAND(m, j, w, h) (BIT(m, j) ? BYTE_OF(RANK(m, j), w, h) : 0x80u)

/* One table row: F(m, lane, w, h) for every byte h of every lane. */
#define LANES8(F, m, w, h)                                                              \
    F(m, 0, w, h), F(m, 1, w, h), F(m, 2, w, h), F(m, 3, w, h), F(m, 4, w, h), F(m, 5, w, h), \
        F(m, 6, w, h), F(m, 7, w, h)
#define BYTES2(F, m, k) F(m, k, 2, 0), F(m, k, 2, 1)
#define BYTES4(F, m, k) F(m, k, 4, 0), F(m, k, 4, 1), F(m, k, 4, 2), F(m, k, 4, 3)

#define ROW_8x16(F, m)                                                                 \
    {BYTES2(F, m, 0), BYTES2(F, m, 1), BYTES2(F, m, 2), BYTES2(F, m, 3),                 \
     BYTES2(F, m, 4), BYTES2(F, m, 5), BYTES2(F, m, 6), BYTES2(F, m, 7)}
#define ROW_4x32(F, m) {BYTES4(F, m, 0), BYTES4(F, m, 1), BYTES4(F, m, 2), BYTES4(F, m, 3)}
#define ROW_8x32(F, m) {LANES8(F, m, 1, 0)}
/* A 64-bit lane j is the pair of 32-bit lanes 2j, 2j+1: the 8x16 byte layout at width 2. */
#define ROW_4x64(F, m) {BYTES2(F, m, 0), BYTES2(F, m, 1), BYTES2(F, m, 2), BYTES2(F, m, 3)}

/* Masks are spelled as single hex literals (0x00..0xff, pasted from two digits) so each of
 * the many uses of m in the entry expressions expands to one token. */
#define ROWS16(R, F, hi)                                                                \
    R(F, 0x##hi##0), R(F, 0x##hi##1), R(F, 0x##hi##2), R(F, 0x##hi##3), R(F, 0x##hi##4),  \
        R(F, 0x##hi##5), R(F, 0x##hi##6), R(F, 0x##hi##7), R(F, 0x##hi##8),               \
        R(F, 0x##hi##9), R(F, 0x##hi##a), R(F, 0x##hi##b), R(F, 0x##hi##c),               \
        R(F, 0x##hi##d), R(F, 0x##hi##e), R(F, 0x##hi##f)
#define ROWS256(R, F)                                                                   \
    ROWS16(R, F, 0), ROWS16(R, F, 1), ROWS16(R, F, 2), ROWS16(R, F, 3), ROWS16(R, F, 4),  \
        ROWS16(R, F, 5), ROWS16(R, F, 6), ROWS16(R, F, 7), ROWS16(R, F, 8),               \
        ROWS16(R, F, 9), ROWS16(R, F, a), ROWS16(R, F, b), ROWS16(R, F, c),               \
        ROWS16(R, F, d), ROWS16(R, F, e), ROWS16(R, F, f)

/* 64-byte alignment keeps every 16-byte row inside one cache line. */
_Alignas(64) const uint8_t ac_pack_8x16[256][16] = {ROWS256(ROW_8x16, PACK)};
_Alignas(64) const uint8_t ac_expand_8x16[256][16] = {ROWS256(ROW_8x16, EXPAND)};
_Alignas(64) const uint8_t ac_pack_4x32[16][16] = {ROWS16(ROW_4x32, PACK, 0)};
_Alignas(64) const uint8_t ac_expand_4x32[16][16] = {ROWS16(ROW_4x32, EXPAND, 0)};
_Alignas(64) const uint8_t ac_pack_8x32[256][8] = {ROWS256(ROW_8x32, PACK)};
_Alignas(64) const uint8_t ac_expand_8x32[256][8] = {ROWS256(ROW_8x32, EXPAND)};
_Alignas(64) const uint8_t ac_pack_4x64[16][8] = {ROWS16(ROW_4x64, PACK, 0)};
_Alignas(64) const uint8_t ac_expand_4x64[16][8] = {ROWS16(ROW_4x64, EXPAND, 0)};
