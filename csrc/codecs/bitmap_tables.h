/* Internal: lookup tables shared by the SIMD bitmap kernels. The shuffle tables are indexed
 * by a lane mask (bit j set = lane j holds a kept element).
 *
 * Convention for every table: an index of 0x80 means "this output lane is zero". pshufb
 * zeroes a byte whose index has bit 7 set and NEON tbl zeroes a byte whose index is >= 16,
 * so the byte tables zero the unused lanes by themselves; the 8x32 expand table is read with
 * a sign-extending load, so 0x80 becomes a negative lane that selects zero in a blend.
 *
 * pack:   output lane k = input lane of the k-th set bit (left-pack / compaction).
 * expand: output lane j = k if bit j is the k-th set bit, else zero (the inverse). */
#ifndef ACTCODEC_BITMAP_TABLES_H
#define ACTCODEC_BITMAP_TABLES_H

#include <stdint.h>

/* 8 lanes of 16 bits, as 16 byte indices (pshufb / vqtbl1q_u8). */
extern const uint8_t ac_pack_8x16[256][16];
extern const uint8_t ac_expand_8x16[256][16];
/* 4 lanes of 32 bits, as 16 byte indices (NEON; also 2 lanes of 64 bits with the mask bits
 * doubled). */
extern const uint8_t ac_pack_4x32[16][16];
extern const uint8_t ac_expand_4x32[16][16];
/* 8 lanes of 32 bits, as lane numbers to widen to 32 bits (AVX2 vpermd). */
extern const uint8_t ac_pack_8x32[256][8];
extern const uint8_t ac_expand_8x32[256][8];
/* 4 lanes of 64 bits, as 32-bit lane numbers for vpermd (pairs 2j, 2j+1). */
extern const uint8_t ac_pack_4x64[16][8];
extern const uint8_t ac_expand_4x64[16][8];

/* Popcount of a bitmap byte from a 64-bit constant holding the 16 nibble popcounts: for
 * paths where no popcount instruction is assumed (SSE2) or where it would mean a round trip
 * through the vector unit (NEON). */
static inline unsigned ac_pop8(unsigned m) {
    const uint64_t nibble_counts = 0x4332322132212110ull;
    return (unsigned)((nibble_counts >> 4 * (m & 0xFu)) & 0xFu) +
           (unsigned)((nibble_counts >> 4 * (m >> 4 & 0xFu)) & 0xFu);
}

#endif
