/* Standalone C tests for the sparse-bitmap codec (no Python).
 *
 * Part 1: every kernel table that is compiled in and usable on this CPU, scalar included,
 *   must match an independent model of the format byte for byte (bitmap, count, packed
 *   values, decoded output, popcount), hence SIMD must match scalar. Buffers a kernel only
 *   reads (src, bitmap, vals) are allocated at their exact size so ASan catches over-reads;
 *   buffers it writes are surrounded by canary bytes (out may take AC_BITMAP_SLACK bytes past
 *   the packed values, the bitmap and dst nothing past their end).
 * Part 2: the public driver API (per-call options, defaults, ac_bitmap_*, ac_mask_decode) on
 *   large arrays for every available ISA and thread count, including its rejection of
 *   corrupt input and of bad options.
 *
 * Prints "N passed, M failed" (test cases) last; exits 1 on any failure. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "actcodec.h"
#include "../../csrc/runtime/kernels.h"

#define HARNESS_SEED 0x243F6A8885A308D3ull
#include "harness.h"

/* ---- element access by width (endian-neutral: values go through the native type) ---- */
static uint64_t width_mask(int es) { return es == 8 ? ~0ull : (1ull << (8 * es)) - 1; }
static uint64_t abs_mask(int es) { return width_mask(es) >> 1; }

static uint64_t get_elem(const unsigned char *p, int es) {
    if (es == 2) { uint16_t v; memcpy(&v, p, 2); return v; }
    if (es == 4) { uint32_t v; memcpy(&v, p, 4); return v; }
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static void put_elem(unsigned char *p, int es, uint64_t x) {
    if (es == 2) { uint16_t v = (uint16_t)x; memcpy(p, &v, 2); }
    else if (es == 4) { uint32_t v = (uint32_t)x; memcpy(p, &v, 4); }
    else memcpy(p, &x, 8);
}

/* The format, restated independently of any kernel. */
static int model_keep(uint64_t bits, int es, uint64_t thr) {
    return thr ? (bits & abs_mask(es)) >= thr : bits != 0;
}

/* ---- input patterns ---- */
enum { P_ZERO, P_DENSE, P_RANDOM, P_ZERO10, P_ZERO50, P_ZERO90, P_SPECIAL, P_NEAR_THR, P_COUNT };
static const char *const pattern_names[P_COUNT] = {
    "all-zero", "no-zeros", "random-bits", "p0=0.1", "p0=0.5", "p0=0.9", "fp-specials", "near-thr"};

static uint64_t rnd_nonzero(int es) {
    uint64_t x;
    do x = rnd() & width_mask(es);
    while (x == 0);
    return x;
}

/* IEEE special encodings of the element's float format (binary16 or bfloat16 for 2 bytes). */
static uint64_t rnd_special(int es) {
    int mant = es == 8 ? 52 : es == 4 ? 23 : (rnd() & 1) ? 10 : 7;
    int bits = 8 * es;
    uint64_t sign = 1ull << (bits - 1), mmask = (1ull << mant) - 1;
    uint64_t emask = (width_mask(es) >> 1) & ~mmask;
    uint64_t s = (rnd() & 1) ? sign : 0;
    switch (rnd() % 10) {
    case 0: return 0;                                    /* +0.0 */
    case 1: return sign;                                 /* -0.0 */
    case 2: return s | emask;                            /* +-inf */
    case 3: {                                            /* NaN with a random payload */
        uint64_t payload = rnd() & mmask;
        return s | emask | (payload ? payload : 1);
    }
    case 4: return s | emask | (1ull << (mant - 1));     /* quiet NaN, no payload */
    case 5: return s | ((rnd() & mmask) | 1);            /* subnormal */
    case 6: return s | 1;                                /* smallest subnormal */
    case 7: return s | (emask - (1ull << mant)) | mmask; /* largest finite */
    case 8: return s | ((emask >> 1) & emask);           /* +-1.0: the bias, bias << mant */
    default: return rnd() & width_mask(es);              /* anything */
    }
}

static uint64_t gen_elem(int pattern, int es, uint64_t thr) {
    switch (pattern) {
    case P_ZERO: return 0;
    case P_DENSE: return rnd_nonzero(es);
    case P_RANDOM: return rnd() & width_mask(es);
    case P_ZERO10: return rnd01() < 0.1 ? 0 : rnd_nonzero(es);
    case P_ZERO50: return rnd01() < 0.5 ? 0 : rnd_nonzero(es);
    case P_ZERO90: return rnd01() < 0.9 ? 0 : rnd_nonzero(es);
    case P_SPECIAL: return rnd_special(es);
    default: {
        /* |x| at thr - 1, thr, thr + 1 (wrapped into the magnitude bits), either sign. */
        uint64_t sign = (rnd() & 1) ? abs_mask(es) + 1 : 0;
        uint64_t mag = (thr + (rnd() % 3) - 1) & abs_mask(es);
        return rnd() % 8 == 0 ? 0 : sign | mag;
    }
    }
}

/* ---- ISAs under test ---- */
typedef struct {
    int isa;
    ac_kernels k;
} isa_kernels;

static isa_kernels isas[AC_ISA_COUNT];
static int n_isas;

static void collect_isas(void) {
    int (*const fill[AC_ISA_COUNT])(ac_kernels *) = {ac_kernels_scalar, ac_kernels_sse2,
                                                      ac_kernels_avx2, ac_kernels_neon};
    for (int isa = 0; isa < AC_ISA_COUNT; isa++) {
        ac_kernels k;
        memset(&k, 0, sizeof k);
        /* Compiled in (fill returns 1) and runnable here (the dispatcher's CPU check). */
        if (fill[isa](&k) && ac_isa_available(isa)) {
            isas[n_isas].isa = isa;
            isas[n_isas].k = k;
            n_isas++;
        } else {
            printf("isa %-6s not tested (%s)\n", ac_isa_name(isa),
                   fill[isa](&k) ? "not supported by this CPU" : "not compiled for this target");
        }
    }
}

/* The expected encoding of one input, computed by the model. */
typedef struct {
    size_t count;
    unsigned char *bitmap; /* exactly (n + 7) / 8 bytes, so over-reads are caught */
    unsigned char *vals;   /* count * es bytes */
    unsigned char *dec;    /* expected decode: pruned elements zeroed */
} encoded;

#define CTX "isa=%s es=%d n=%zu %s thr=0x%" PRIx64 " off=%zu/%zu/%zu/%zu"
#define CTX_ARGS(isa) \
    ac_isa_name(isa), es, n, pattern_names[pattern], thr, o_src, o_out, o_val, o_dst

static void kernel_case(int es, size_t n, int pattern, uint64_t thr) {
    const int idx = ac_esize_index(es);
    const size_t bytes = n * (size_t)es, nb = (n + 7) / 8;
    /* Odd offsets misalign every buffer from its element size. */
    const size_t o_src = rnd() % 8, o_out = rnd() % 8, o_val = rnd() % 8, o_dst = rnd() % 8;

    unsigned char *src_block = xmalloc(o_src + bytes), *src = src_block + o_src;
    for (size_t i = 0; i < n; i++) put_elem(src + i * es, es, gen_elem(pattern, es, thr));

    /* The model's bitmap, values and decode. */
    encoded want;
    want.count = 0;
    want.bitmap = xmalloc(nb);
    want.vals = xmalloc(bytes);
    want.dec = xmalloc(bytes);
    memset(want.bitmap, 0, nb);
    for (size_t i = 0; i < n; i++) {
        uint64_t x = get_elem(src + i * es, es);
        int keep = model_keep(x, es, thr);
        if (keep) {
            want.bitmap[i / 8] |= (unsigned char)(1u << (i % 8));
            put_elem(want.vals + want.count++ * es, es, x);
        }
        put_elem(want.dec + i * es, es, keep ? x : 0);
    }

    unsigned char *out_block = xmalloc(o_out + bytes + AC_BITMAP_SLACK + GUARD);
    unsigned char *bm_block = xmalloc(nb + GUARD);
    unsigned char *dst_block = xmalloc(o_dst + bytes + GUARD);
    unsigned char *out = out_block + o_out, *dst = dst_block + o_dst;

    for (int t = 0; t < n_isas; t++) {
        const ac_kernels *k = &isas[t].k;
        const int isa = isas[t].isa;
        /* Every table, scalar included, must equal the model byte for byte; so each SIMD
         * table equals scalar wherever scalar passes, and a scalar bug is reported too. */

        /* Encode: count, bitmap and values equal; writes stay within the slack. */
        memset(out_block, CANARY, o_out + bytes + AC_BITMAP_SLACK + GUARD);
        memset(bm_block, CANARY, nb + GUARD);
        size_t count = k->bm_encode[idx](src, n, bm_block, out, thr);
        const char *why = NULL;
        if (count != want.count) why = "count";
        else if (memcmp(bm_block, want.bitmap, nb) != 0) why = "bitmap bytes";
        else if (memcmp(out, want.vals, count * es) != 0) why = "packed values";
        else if (!canary_ok(bm_block + nb, GUARD)) why = "write past the bitmap";
        else if (!canary_ok(out_block, o_out)) why = "write before out";
        else if (!canary_ok(out + count * es + AC_BITMAP_SLACK,
                            bytes - count * es + GUARD)) why = "write past the slack";
        if (!report(why == NULL, "encode " CTX ": %s (count %zu, want %zu)", CTX_ARGS(isa),
                    why, count, want.count))
            continue;

        /* Decode from values sized exactly count * es and an exact-size bitmap. */
        unsigned char *val_block = xmalloc(o_val + want.count * es);
        memcpy(val_block + o_val, want.vals, want.count * es);
        memset(dst_block, CANARY, o_dst + bytes + GUARD);
        k->bm_decode[idx](want.bitmap, n, val_block + o_val, want.count, dst);
        why = NULL;
        if (memcmp(dst, want.dec, bytes) != 0) why = "decoded elements";
        else if (!canary_ok(dst_block, o_dst)) why = "write before dst";
        else if (!canary_ok(dst + bytes, GUARD)) why = "write past dst";
        report(why == NULL, "decode " CTX ": %s", CTX_ARGS(isa), why);
        free(val_block);

        report(k->popcount(want.bitmap, nb) == want.count, "popcount " CTX, CTX_ARGS(isa));
    }
    free(dst_block);
    free(bm_block);
    free(out_block);
    free(want.dec);
    free(want.vals);
    free(want.bitmap);
    free(src_block);
}

/* Thresholds worth testing for a width: lossless, tiny, a few real magnitudes, and the
 * edges around the magnitude range (absmask + 1 and beyond keep nothing). */
static size_t thresholds(int es, uint64_t *t) {
    const uint64_t a = abs_mask(es);
    /* Bit patterns of 1e-3 and 0.5 in the width's float format. */
    const uint64_t milli = es == 2 ? 0x1419 : es == 4 ? 0x3A83126F : 0x3F50624DD2F1A9FCull;
    const uint64_t half = es == 2 ? 0x3800 : es == 4 ? 0x3F000000 : 0x3FE0000000000000ull;
    size_t k = 0;
    t[k++] = 0;
    t[k++] = 1;
    t[k++] = 2;
    t[k++] = milli;
    t[k++] = half;
    t[k++] = a / 2 + 1;
    t[k++] = a;
    t[k++] = a + 1;
    if (es < 8) t[k++] = width_mask(es) + 1;
    t[k++] = ~0ull;
    return k;
}

static void kernel_tests(void) {
    static const int widths[3] = {2, 4, 8};
    static const size_t large[] = {100003, 131072 + 5};
    uint64_t thr[16];
    for (int w = 0; w < 3; w++) {
        const int es = widths[w];
        const size_t nthr = thresholds(es, thr);
        for (int p = 0; p < P_COUNT; p++)
            for (size_t t = 0; t < nthr; t++) {
                for (size_t n = 0; n <= 300; n++) kernel_case(es, n, p, thr[t]);
                for (size_t i = 0; i < sizeof large / sizeof large[0]; i++)
                    kernel_case(es, large[i], p, thr[t]);
            }
    }
}

/* Popcount of arbitrary bytes at every length and alignment, against scalar. */
static void popcount_tests(void) {
    ac_kernels ref;
    ac_kernels_scalar(&ref);
    for (size_t len = 0; len <= 300 + 200000; len += len < 300 ? 1 : 99991) {
        for (size_t off = 0; off < 16; off += 5) {
            unsigned char *block = xmalloc(off + len);
            for (size_t i = 0; i < len; i++) block[off + i] = (unsigned char)rnd();
            size_t want = ref.popcount(block + off, len);
            for (int t = 0; t < n_isas; t++)
                report(isas[t].k.popcount(block + off, len) == want,
                       "popcount isa=%s len=%zu off=%zu", ac_isa_name(isas[t].isa), len, off);
            free(block);
        }
    }
}

/* bytes_bits (bool masks) of every table against the model: bit i set iff byte i is not zero,
 * padding bits zero, nothing written past the bitmap; bytes of every value, odd lengths and
 * offsets. */
static void bytes_bits_tests(void) {
    for (size_t n = 0; n <= 600 + 70000; n += n < 600 ? 1 : 9973) {
        const size_t off = rnd() % 16, nb = (n + 7) / 8;
        unsigned char *block = xmalloc(off + n), *src = block + off;
        int kind = (int)(rnd() % 4);
        for (size_t i = 0; i < n; i++)
            src[i] = kind == 0 ? (unsigned char)(rnd() & 1)                  /* numpy bools */
                   : kind == 1 ? (unsigned char)rnd()                        /* any byte */
                   : kind == 2 ? (unsigned char)(rnd() % 8 ? 0 : 0x80)      /* sparse, top bit */
                               : (unsigned char)(rnd() % 8 ? 0xFF : 0);
        uint8_t *want = xmalloc(nb), *got = xmalloc(nb + GUARD);
        memset(want, 0, nb);
        for (size_t i = 0; i < n; i++) want[i / 8] |= (uint8_t)((src[i] != 0) << (i % 8));
        for (int t = 0; t < n_isas; t++) {
            memset(got, CANARY, nb + GUARD);
            isas[t].k.bytes_bits(src, n, got);
            report(memcmp(got, want, nb) == 0 && canary_ok(got + nb, GUARD),
                   "bytes_bits isa=%s n=%zu off=%zu kind=%d", ac_isa_name(isas[t].isa), n, off,
                   kind);
        }
        free(got);
        free(want);
        free(block);
    }
}

/* ---- sampled nonzero counts ---- */

static void sample_tests(void) {
    uint64_t nnz, sq;
    int one;
    uint32_t x[64] = {0};
    report(ac_sample_nonzero(x, 64, 4, 9, 8, &nnz, &sq, &one) == AC_EINVAL,
           "sample: runs * run_len > n -> EINVAL");
    report(ac_sample_nonzero(x, 64, 3, 1, 1, &nnz, &sq, &one) == AC_EINVAL, "sample: esize 3");
    report(ac_sample_nonzero(x, 64, 4, 0, 1, &nnz, &sq, &one) == AC_EINVAL, "sample: 0 runs");
    report(ac_sample_nonzero(x, 64, 4, 8, 8, &nnz, &sq, &one) == AC_OK && nnz == 0 && sq == 0 &&
               one == 0, "sample: all zero");
    /* splitmix64's first output for seed 0 */
    report(ac_sample_mix(0) == 0xE220A8397B1DCDAFull, "ac_sample_mix(0)");
    for (int trial = 0; trial < 2000; trial++) {
        int es = trial % 3 == 0 ? 2 : trial % 3 == 1 ? 4 : 8;
        size_t n = 1 + rnd_below(500), runs = 1 + rnd_below(20), len = 1 + rnd_below(20);
        if (runs * len > n) continue;
        unsigned char *buf = xmalloc(n * (size_t)es);
        uint64_t v1 = rnd_nonzero(es), v2 = rnd_nonzero(es);
        int kinds = trial % 4;  /* 0: zeros only, 1: one value, 2: two values, 3: random */
        for (size_t i = 0; i < n; i++) {
            uint64_t v = rnd01() < 0.3 ? 0 : kinds == 0 ? 0 : kinds == 1 ? v1
                         : kinds == 2 ? (rnd() & 1 ? v1 : v2) : rnd_nonzero(es);
            put_elem(buf + i * es, es, v);
        }
        uint64_t want = 0, want_sq = 0, first = 0;
        int same = 1;
        for (size_t r = 0; r < runs; r++) {
            uint64_t c = 0;
            for (size_t i = 0; i < len; i++) {
                size_t start = r * (n / runs) + (size_t)(ac_sample_mix(r) % (n / runs - len + 1));
                uint64_t v = get_elem(buf + (start + i) * es, es);
                if (!v) continue;
                if (want + c == 0) first = v;
                else if (v != first) same = 0;
                c++;
            }
            want += c;
            want_sq += c * c;
        }
        int rc = ac_sample_nonzero(buf, n, es, runs, len, &nnz, &sq, &one);
        report(rc == AC_OK && nnz == want && sq == want_sq && one == (want > 0 && same),
               "sample es=%d n=%zu runs=%zu len=%zu", es, n, runs, len);
        free(buf);
    }
}

/* ---- public driver API ---- */

static ac_options opts(int isa, int threads) {
    ac_options o = AC_OPTIONS_DEFAULT;
    o.isa = isa;
    o.threads = threads;
    return o;
}

static void api_argument_tests(void) {
    size_t nnz = 7;
    uint8_t bm[1] = {0};
    uint16_t x[1] = {0}, v[1] = {0};
    report(ac_bitmap_encode(x, 1, 3, 0, bm, v, &nnz, NULL) == AC_EINVAL, "encode esize 3 -> EINVAL");
    report(ac_bitmap_decode(bm, v, 0, 1, 16, x, NULL) == AC_EINVAL, "decode esize 16 -> EINVAL");
    report(ac_bitmap_encode(x, 0, 2, 0, bm, v, &nnz, NULL) == AC_OK && nnz == 0, "encode n=0");
    report(ac_bitmap_decode(bm, v, 0, 0, 2, x, NULL) == AC_OK, "decode n=0");
    report(ac_bitmap_decode(bm, v, 1, 0, 2, x, NULL) == AC_ECORRUPT, "decode n=0 nnz=1 -> ECORRUPT");
    report(ac_bitmap_decode(bm, v, 2, 1, 2, x, NULL) == AC_ECORRUPT, "decode nnz > n -> ECORRUPT");
    report(ac_mask_decode(bm, 1, v, 3, x, NULL) == AC_EINVAL, "mask decode esize 3 -> EINVAL");
    report(ac_mask_decode(bm, 0, NULL, 2, NULL, NULL) == AC_OK, "mask decode n=0");
    int one = 5;
    unsigned char value[8];
    report(ac_mask_encode(x, 1, 3, bm, value, &nnz, &one, NULL) == AC_EINVAL,
           "mask encode esize 3 -> EINVAL");
    report(ac_mask_encode(x, 0, 2, bm, value, &nnz, &one, NULL) == AC_OK && nnz == 0 && one == 0,
           "mask encode n=0");
    report(ac_bitmap_nbytes(0) == 0 && ac_bitmap_nbytes(1) == 1 && ac_bitmap_nbytes(8) == 1 &&
               ac_bitmap_nbytes(9) == 2, "ac_bitmap_nbytes");
    /* Options out of range are refused by every entry point before anything is written. */
    ac_options bad[5] = {opts(AC_ISA_DEFAULT, -1), opts(AC_ISA_DEFAULT, 1025),
                         opts(AC_ISA_COUNT, 0), opts(-2, 0), opts(AC_ISA_DEFAULT, 0)};
    bad[4].bittrick = 2;
    for (int i = 0; i < 5; i++) {
        nnz = 7;
        report(ac_bitmap_encode(x, 1, 2, 0, bm, v, &nnz, &bad[i]) == AC_EINVAL && nnz == 7,
               "encode with bad options %d -> EINVAL", i);
        report(ac_bitmap_decode(bm, v, 0, 1, 2, x, &bad[i]) == AC_EINVAL,
               "decode with bad options %d -> EINVAL", i);
        report(ac_bitmap_count(bm, 1, &nnz, &bad[i]) == AC_EINVAL, "count with bad options %d", i);
        report(ac_mask_decode(bm, 1, v, 2, x, &bad[i]) == AC_EINVAL, "mask with bad options %d", i);
        report(ac_mask_encode(x, 1, 2, bm, value, &nnz, &one, &bad[i]) == AC_EINVAL,
               "mask encode with bad options %d", i);
    }
    for (int isa = 0; isa < AC_ISA_COUNT; isa++) {
        if (ac_isa_available(isa)) continue;
        ac_options o = opts(isa, 0);
        report(ac_bitmap_encode(x, 1, 2, 0, bm, v, &nnz, &o) == AC_EUNSUPPORTED,
               "encode on unavailable %s -> EUNSUPPORTED", ac_isa_name(isa));
        report(ac_set_default_isa(isa) == AC_EUNSUPPORTED, "default %s -> EUNSUPPORTED",
               ac_isa_name(isa));
    }
    report(ac_set_default_threads(0) == AC_EINVAL && ac_set_default_threads(1025) == AC_EINVAL,
           "default threads out of range -> EINVAL");
    report(ac_set_default_isa(AC_ISA_COUNT) == AC_EUNSUPPORTED, "default isa out of range");
}

/* Decode must refuse a bitmap/count mismatch without touching dst. */
static void expect_corrupt(const uint8_t *bm, const unsigned char *vals, size_t nnz, size_t n,
                           int es, unsigned char *dst, const ac_options *o, const char *what,
                           const char *ctx) {
    memset(dst, CANARY, n * es);
    int rc = ac_bitmap_decode(bm, vals, nnz, n, es, dst, o);
    report(rc == AC_ECORRUPT && canary_ok(dst, n * es), "api %s: %s -> %d, want ECORRUPT",
           ctx, what, rc);
}

static void api_roundtrip(int es, size_t n, uint64_t thr) {
    const int idx = ac_esize_index(es);
    const size_t bytes = n * (size_t)es, nb = ac_bitmap_nbytes(n);
    unsigned char *src = xmalloc(bytes);
    for (size_t i = 0; i < n; i++) {
        /* ReLU-like activations: half zeros, some fp specials, the rest random. */
        double u = rnd01();
        uint64_t x = u < 0.5 ? 0 : u < 0.55 ? rnd_special(es) : rnd() & width_mask(es);
        put_elem(src + i * es, es, x);
    }
    /* Reference: the scalar kernel over the whole array. */
    ac_kernels ref;
    ac_kernels_scalar(&ref);
    unsigned char *want_bm = xmalloc(nb), *want_vals = xmalloc(bytes + AC_BITMAP_SLACK);
    size_t want_nnz = ref.bm_encode[idx](src, n, want_bm, want_vals, thr);
    unsigned char *want_dec = xmalloc(bytes);
    ref.bm_decode[idx](want_bm, n, want_vals, want_nnz, want_dec);

    uint8_t *bm = xmalloc(nb);
    unsigned char *vals = xmalloc(bytes), *dst = xmalloc(bytes);
    for (int t = 0; t < n_isas; t++) {
        const int isa = isas[t].isa;
        for (int threads = 1; threads <= 2; threads++) {
            char ctx[96];
            snprintf(ctx, sizeof ctx, "isa=%s threads=%d es=%d n=%zu thr=0x%" PRIx64,
                     ac_isa_name(isa), threads, es, n, thr);
            const ac_options o = opts(isa, threads);

            size_t nnz = 0;
            int rc = ac_bitmap_encode(src, n, es, thr, bm, vals, &nnz, &o);
            report(rc == AC_OK && nnz == want_nnz && memcmp(bm, want_bm, nb) == 0 &&
                       memcmp(vals, want_vals, nnz * es) == 0,
                   "api %s: encode rc=%d nnz=%zu want %zu", ctx, rc, nnz, want_nnz);

            size_t counted = 0;
            rc = ac_bitmap_count(bm, n, &counted, &o);
            report(rc == AC_OK && counted == want_nnz, "api %s: count rc=%d", ctx, rc);

            /* Values in a buffer of exactly nnz elements. */
            unsigned char *exact = xmalloc(want_nnz * es);
            memcpy(exact, want_vals, want_nnz * es);
            memset(dst, CANARY, bytes);
            rc = ac_bitmap_decode(want_bm, exact, want_nnz, n, es, dst, &o);
            report(rc == AC_OK && memcmp(dst, want_dec, bytes) == 0, "api %s: decode rc=%d",
                   ctx, rc);

            /* Corruption: a flipped bit anywhere, a wrong count, a set padding bit. */
            uint8_t *bad = xmalloc(nb);
            memcpy(bad, want_bm, nb);
            size_t bit = rnd() % n;
            bad[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            expect_corrupt(bad, exact, want_nnz, n, es, dst, &o, "flipped bitmap bit", ctx);
            memcpy(bad, want_bm, nb);
            expect_corrupt(bad, exact, want_nnz + 1, n, es, dst, &o, "nnz + 1", ctx);
            if (want_nnz > 0)
                expect_corrupt(bad, exact, want_nnz - 1, n, es, dst, &o, "nnz - 1", ctx);
            if (n % 8) {
                bad[nb - 1] |= 0x80;
                expect_corrupt(bad, exact, want_nnz + 1, n, es, dst, &o, "padding bit set", ctx);
                rc = ac_bitmap_count(bad, n, &counted, &o);
                report(rc == AC_ECORRUPT, "api %s: count with padding bit -> %d", ctx, rc);
            }
            free(bad);
            free(exact);
        }
    }
    free(dst);
    free(vals);
    free(bm);
    free(want_dec);
    free(want_vals);
    free(want_bm);
    free(src);
}

/* ac_mask_encode of `src` (n elements of es bytes, whose bitmap is bm): the bitmap, count and
 * value, nothing written past the bitmap; with `differ`, one element changed to another
 * nonzero pattern, which must turn one_value off and leave the bitmap right. */
static void mask_encode_case(const unsigned char *src, size_t n, int es, const uint8_t *bm,
                             size_t want_nnz, const unsigned char *value, int differ) {
    const size_t nb = ac_bitmap_nbytes(n);
    unsigned char *in = xmalloc(n * (size_t)es + 1);
    memcpy(in, src, n * (size_t)es);
    if (differ) { /* the second nonzero element, if there is one */
        size_t i = 0, seen = 0;
        for (; i < n; i++)
            if ((bm[i / 8] >> (i % 8) & 1) && ++seen == 2) break;
        if (i == n) { free(in); return; }
        in[i * es] ^= 0x02; /* still nonzero: the value's low byte is odd */
    }
    uint8_t *out = xmalloc(nb + GUARD);
    for (int t = 0; t < n_isas; t++)
        for (int threads = 1; threads <= 2; threads++) {
            const ac_options o = opts(isas[t].isa, threads);
            unsigned char got_value[8] = {0};
            size_t nnz = 7;
            int one = -1;
            memset(out, CANARY, nb + GUARD);
            int rc = ac_mask_encode(in, n, es, out, got_value, &nnz, &one, &o);
            int ok = rc == AC_OK && nnz == want_nnz && memcmp(out, bm, nb) == 0 &&
                     canary_ok(out + nb, GUARD);
            static const unsigned char zeros[8] = {0};
            if (differ) ok = ok && one == 0;
            else ok = ok && one == (want_nnz > 0) &&
                      memcmp(got_value, want_nnz ? value : zeros, (size_t)es) == 0;
            report(ok, "mask encode isa=%s threads=%d es=%d n=%zu differ=%d: rc=%d nnz=%zu/%zu "
                   "one=%d", ac_isa_name(isas[t].isa), threads, es, n, differ, rc, nnz,
                   want_nnz, one);
        }
    free(out);
    free(in);
}

/* ac_mask_decode against the model (value where the bit is set, zero bits elsewhere) at
 * every width, odd lengths and offsets, each path and thread count; nothing written outside
 * dst; a set padding bit refused with dst untouched. The model's masks go through
 * ac_mask_encode too. */
static void mask_tests(void) {
    static const size_t sizes[] = {0, 1, 7, 8, 9, 63, 64, 65, 1000, 300007, 1000003};
    static const int widths[4] = {1, 2, 4, 8};
    for (int w = 0; w < 4; w++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            const int es = widths[w];
            const size_t n = sizes[s], nb = ac_bitmap_nbytes(n), bytes = n * (size_t)es;
            const size_t off = rnd() % 8;
            uint8_t *bm = xmalloc(nb);
            for (size_t i = 0; i < nb; i++) bm[i] = (uint8_t)rnd();
            if (n % 8) bm[nb - 1] &= (uint8_t)((1u << (n % 8)) - 1);
            unsigned char value[8], *want = xmalloc(bytes);
            uint64_t v = rnd_nonzero(es > 1 ? es : 2) | 1; /* odd: the differ case stays nonzero */
            if (es == 1) value[0] = (unsigned char)(v & 0xFF);
            else put_elem(value, es, v);
            if (es == 1) v = value[0];
            for (size_t i = 0; i < n; i++) {
                int set = (bm[i / 8] >> (i % 8)) & 1;
                if (es == 1) want[i] = set ? value[0] : 0;
                else put_elem(want + i * es, es, set ? v : 0);
            }
            size_t set = 0;
            for (size_t i = 0; i < n; i++) set += (bm[i / 8] >> (i % 8)) & 1;
            mask_encode_case(want, n, es, bm, set, value, 0);
            mask_encode_case(want, n, es, bm, set, value, 1);
            unsigned char *block = xmalloc(off + bytes + GUARD), *dst = block + off;
            for (int t = 0; t < n_isas; t++)
                for (int threads = 1; threads <= 2; threads++) {
                    const ac_options o = opts(isas[t].isa, threads);
                    memset(block, CANARY, off + bytes + GUARD);
                    int rc = ac_mask_decode(bm, n, value, es, dst, &o);
                    report(rc == AC_OK && memcmp(dst, want, bytes) == 0 &&
                               canary_ok(block, off) && canary_ok(dst + bytes, GUARD),
                           "mask decode isa=%s threads=%d es=%d n=%zu rc=%d",
                           ac_isa_name(isas[t].isa), threads, es, n, rc);
                    if (n % 8) {
                        bm[nb - 1] |= 0x80;
                        memset(block, CANARY, off + bytes + GUARD);
                        rc = ac_mask_decode(bm, n, value, es, dst, &o);
                        report(rc == AC_ECORRUPT && canary_ok(block, off + bytes + GUARD),
                               "mask decode with a padding bit -> %d", rc);
                        bm[nb - 1] &= (uint8_t)((1u << (n % 8)) - 1);
                    }
                }
            free(block);
            free(want);
            free(bm);
        }
}

/* The defaults are read where a call says 0 / AC_ISA_DEFAULT, and only there. */
static void default_tests(void) {
    const int isa = ac_default_isa(), threads = ac_default_threads();
    report(ac_isa_available(isa) && threads >= 1, "defaults: isa %d, threads %d", isa, threads);
    report(ac_set_default_threads(3) == AC_OK && ac_default_threads() == 3, "set default threads");
    report(ac_set_default_isa(AC_ISA_SCALAR) == AC_OK && ac_default_isa() == AC_ISA_SCALAR,
           "set default isa");
    api_roundtrip(4, 300007, 0); /* explicit options: the defaults play no part */
    size_t nnz = 0;
    float x[600];
    for (int i = 0; i < 600; i++) x[i] = i % 2 ? (float)i : 0.0f;
    uint8_t bm[75];
    float vals[600];
    report(ac_bitmap_encode(x, 600, 4, 0, bm, vals, &nnz, NULL) == AC_OK && nnz == 300,
           "encode with the defaults (NULL options)");
    report(ac_default_isa() == AC_ISA_SCALAR && ac_default_threads() == 3,
           "a call changes no default");
    ac_set_default_isa(isa);
    ac_set_default_threads(threads);
}

static void api_tests(void) {
    api_argument_tests();
    mask_tests();
    default_tests();
    /* Not multiples of 8, and several driver blocks per thread. */
    static const size_t sizes[] = {1000003, 2999999};
    for (int w = 0; w < 3; w++) {
        const int es = 2 << w;
        const uint64_t mid = es == 2 ? 0x1419 : es == 4 ? 0x3A83126F : 0x3F50624DD2F1A9FCull;
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            api_roundtrip(es, sizes[s], 0);
            api_roundtrip(es, sizes[s], mid);
        }
    }
    api_roundtrip(8, 4194319, 0); /* 32 MiB */
}

int main(void) {
    int rc = ac_init();
    report(rc == AC_OK, "ac_init() -> %d", rc);
    printf("cpu features: %s\nbest isa: %s, openmp: %d\n", ac_cpu_features(),
           ac_isa_name(ac_best_isa()), ac_openmp_enabled());
    collect_isas();
    for (int t = 0; t < n_isas; t++) printf("isa %-6s tested\n", ac_isa_name(isas[t].isa));

    unsigned long long before = n_passed + n_failed;
    kernel_tests();
    popcount_tests();
    bytes_bits_tests();
    sample_tests();
    printf("kernels: %llu cases\n", n_passed + n_failed - before);

    before = n_passed + n_failed;
    api_tests();
    printf("driver api: %llu cases\n", n_passed + n_failed - before);

    return finish();
}
