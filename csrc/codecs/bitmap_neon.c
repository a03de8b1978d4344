/* NEON bitmap kernels (baseline on AArch64), one bitmap byte (8 elements) per step: the
 * compare results, ANDed with per-lane bit weights and summed across, give the bitmap byte;
 * tbl with a byte-shuffle row indexed by it left-packs (encode) or scatters (decode) each
 * 16-byte vector. Little-endian AArch64 only. */
#include "../runtime/kernels.h"

/* The lane reinterprets assume little-endian element order. */
#if defined(__aarch64__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#include <arm_neon.h>
#include <string.h>
#include "bitmap_tables.h"
#include "bitmap_loops.h"

static const uint16_t lane_weights[8] = {1, 2, 4, 8, 16, 32, 64, 128};

/* Bitmap byte from 8 all-ones/all-zero 16-bit lanes. */
static inline unsigned to_byte(uint16x8_t c) {
    return vaddvq_u16(vandq_u16(c, vld1q_u16(lane_weights)));
}

/* NEON compares unsigned directly: kept iff (bits & absmask) >= thr, with thr clamped to
 * absmask + 1 (nothing kept) so it fits the lane. Unused when use_thr is 0. */
typedef struct {
    uint64_t absmask, thr;
} lane_consts;

static inline lane_consts make_consts(size_t es, uint64_t thr) {
    uint64_t absmask = (1ull << (8 * es - 1)) - 1;
    lane_consts c = {absmask, thr > absmask ? absmask + 1 : thr};
    return c;
}

/* use_thr is a constant after inlining. */
static inline uint16x8_t keep_8x16(uint8x16_t b, const lane_consts *k, int use_thr) {
    uint16x8_t v = vreinterpretq_u16_u8(b);
    return use_thr ? vcgeq_u16(vandq_u16(v, vdupq_n_u16((uint16_t)k->absmask)),
                               vdupq_n_u16((uint16_t)k->thr))
                   : vtstq_u16(v, v);
}

static inline uint32x4_t keep_4x32(uint8x16_t b, const lane_consts *k, int use_thr) {
    uint32x4_t v = vreinterpretq_u32_u8(b);
    return use_thr ? vcgeq_u32(vandq_u32(v, vdupq_n_u32((uint32_t)k->absmask)),
                               vdupq_n_u32((uint32_t)k->thr))
                   : vtstq_u32(v, v);
}

static inline uint64x2_t keep_2x64(uint8x16_t b, const lane_consts *k, int use_thr) {
    uint64x2_t v = vreinterpretq_u64_u8(b);
    return use_thr ? vcgeq_u64(vandq_u64(v, vdupq_n_u64(k->absmask)), vdupq_n_u64(k->thr))
                   : vtstq_u64(v, v);
}

/* Row of the 4x32 tables for two 64-bit lanes with mask bits t: each bit doubled. */
static inline unsigned doubled(unsigned t) { return ((t & 1u) | (t & 2u) << 1) * 3u; }

static inline uint8x16_t shuffle(uint8x16_t v, const uint8_t *row) {
    return vqtbl1q_u8(v, vld1q_u8(row));
}

/* Encodes the 8 elements at s: left-packs the kept ones to out with 16-byte stores (at most
 * 16 bytes past the last kept one) and returns the bitmap byte. */
static inline unsigned encode8(size_t es, const unsigned char *s, unsigned char *out,
                               const lane_consts *k, int use_thr) {
    if (es == 2) {
        uint8x16_t v = vld1q_u8(s);
        unsigned m = to_byte(keep_8x16(v, k, use_thr));
        vst1q_u8(out, shuffle(v, ac_pack_8x16[m]));
        return m;
    }
    if (es == 4) {
        uint8x16_t lo = vld1q_u8(s), hi = vld1q_u8(s + 16);
        uint16x8_t c = vcombine_u16(vmovn_u32(keep_4x32(lo, k, use_thr)),
                                    vmovn_u32(keep_4x32(hi, k, use_thr)));
        unsigned m = to_byte(c);
        vst1q_u8(out, shuffle(lo, ac_pack_4x32[m & 0xFu]));
        vst1q_u8(out + 4 * ac_pop8(m & 0xFu), shuffle(hi, ac_pack_4x32[m >> 4]));
        return m;
    }
    uint8x16_t v[4];
    uint32x4_t c[2];
    for (int j = 0; j < 4; j++) v[j] = vld1q_u8(s + 16 * j);
    for (int j = 0; j < 2; j++)
        c[j] = vcombine_u32(vmovn_u64(keep_2x64(v[2 * j], k, use_thr)),
                            vmovn_u64(keep_2x64(v[2 * j + 1], k, use_thr)));
    unsigned m = to_byte(vcombine_u16(vmovn_u32(c[0]), vmovn_u32(c[1])));
    for (int j = 0; j < 4; j++) {
        unsigned t = (m >> 2 * j) & 3u;
        vst1q_u8(out, shuffle(v[j], ac_pack_4x32[doubled(t)]));
        out += 8 * ac_pop8(t);
    }
    return m;
}

/* Decodes 8 elements with bitmap byte m into dst (exactly 8 * es bytes) from the packed
 * values at v, of which 8 must be readable whatever m is. */
static inline void decode8(size_t es, unsigned m, const unsigned char *v, unsigned char *dst) {
    if (es == 2) {
        vst1q_u8(dst, shuffle(vld1q_u8(v), ac_expand_8x16[m]));
    } else if (es == 4) {
        vst1q_u8(dst, shuffle(vld1q_u8(v), ac_expand_4x32[m & 0xFu]));
        vst1q_u8(dst + 16, shuffle(vld1q_u8(v + 4 * ac_pop8(m & 0xFu)), ac_expand_4x32[m >> 4]));
    } else {
        for (int j = 0; j < 4; j++) {
            unsigned t = (m >> 2 * j) & 3u;
            vst1q_u8(dst + 16 * j, shuffle(vld1q_u8(v), ac_expand_4x32[doubled(t)]));
            v += 8 * ac_pop8(t);
        }
    }
}

#define STEP8_ENCODE encode8
#define POP8 ac_pop8
AC_DEFINE_ENCODE_LOOP(static inline __attribute__((always_inline)))

static size_t popcount_neon(const uint8_t *p, size_t nbytes) {
    size_t total = 0, i = 0;
    while (i + 16 <= nbytes) {
        /* Each 16-bit lane gains at most 16 per step: flush long before it could wrap. */
        size_t stop = nbytes - i > 16 * 1024 ? i + 16 * 1024 : nbytes;
        uint16x8_t acc = vdupq_n_u16(0);
        for (; i + 16 <= stop; i += 16) acc = vpadalq_u8(acc, vcntq_u8(vld1q_u8(p + i)));
        total += vaddlvq_u16(acc);
    }
    if (i < nbytes) {
        uint8_t tail[16] = {0};
        memcpy(tail, p + i, nbytes - i);
        total += vaddlvq_u8(vcntq_u8(vld1q_u8(tail)));
    }
    return total;
}

#define STEP8_DECODE decode8
AC_DEFINE_DECODE_LOOP(static inline __attribute__((always_inline)))

AC_DEFINE_BITMAP_ENTRY_POINTS(static, 16, 2)
AC_DEFINE_BITMAP_ENTRY_POINTS(static, 32, 4)
AC_DEFINE_BITMAP_ENTRY_POINTS(static, 64, 8)

/* Sixteen bytes: each nonzero lane keeps its bit weight (1, 2, ..., 128 in each half), and
 * the halves' sums are the two bitmap bytes. */
static void bytes_bits_neon(const uint8_t *src, size_t n, uint8_t *bitmap) {
    static const uint8_t weights[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t w = vld1q_u8(weights);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        uint8x16_t v = vld1q_u8(src + i);
        uint8x16_t m = vandq_u8(vtstq_u8(v, v), w);
        bitmap[i / 8] = (uint8_t)vaddv_u8(vget_low_u8(m));
        bitmap[i / 8 + 1] = (uint8_t)vaddv_u8(vget_high_u8(m));
    }
    ac_bytes_bits_tail(src, i, n, bitmap);
}

int ac_kernels_neon(ac_kernels *k) {
    AC_FILL_BITMAP_TABLE(k, popcount_neon, bytes_bits_neon);
    return 1;
}

#else

int ac_kernels_neon(ac_kernels *k) {
    (void)k;
    return 0;
}

#endif
