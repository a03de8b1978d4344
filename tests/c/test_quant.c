/* Standalone C tests for the dynamic k-bit quantization codec (no Python).
 *
 * Part 1: every SIMD quantization table compiled in and usable on this CPU must equal the
 *   scalar reference (ac_kernels_scalar + ac_quant_kernels_scalar) byte for byte, entry by
 *   entry: minmax, quantize (both roundings, bit trick and casts), dequantize, pack/unpack,
 *   dtype conversions. Buffers a kernel only reads are allocated at their exact size so ASan
 *   catches over-reads; buffers it writes are checked for stray writes with canary bytes.
 *   A few checks of the reference against the documented math ride along.
 * Part 2: the public driver (ac_quant_encode / ac_quant_decode) on every available ISA with
 *   1 and 2 threads and both code conversions: identical packed bytes, mins and scales;
 *   decode(encode(x)) within the rounding error bound; non-finite input and bad arguments.
 *
 * Prints "N passed, M failed" (test cases) last; exits 1 on any failure. */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "actcodec.h"
#include "../../csrc/runtime/kernels.h"

#define HARNESS_SEED 0x452821E638D01377ull
#include "harness.h"

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* A finite float with a random exponent in [e_lo, e_hi] (e_lo >= -150 reaches subnormals). */
static float rnd_mag(int e_lo, int e_hi) {
    int e = e_lo + (int)rnd_below((size_t)(e_hi - e_lo + 1));
    float f = ldexpf(1.0f + (float)rnd01(), e);
    return (rnd() & 1) ? -f : f;
}

/* Any finite float, every bit pattern with exponent < 255 equally likely. */
static float rnd_finite(void) {
    uint32_t u;
    do u = (uint32_t)rnd();
    while ((u & 0x7F800000u) == 0x7F800000u);
    return u2f(u);
}

/* An output buffer of len bytes (at misalignment off within its block) with canaries. */
typedef struct {
    unsigned char *block, *p;
    size_t len;
} guarded;

static guarded guarded_new(size_t len, size_t off) {
    guarded g;
    g.block = xmalloc(GUARD + off + len + GUARD);
    g.p = g.block + GUARD + off;
    g.len = len;
    return g;
}
static void guarded_reset(guarded *g) {
    memset(g->block, CANARY, (size_t)(g->p - g->block) + g->len + GUARD);
}
static int guarded_clean(const guarded *g) {
    return canary_ok(g->block, (size_t)(g->p - g->block)) && canary_ok(g->p + g->len, GUARD);
}

/* ---- tables under test ---- */
static ac_kernels ref; /* the scalar reference */

typedef struct {
    int isa;
    ac_kernels k;
} isa_kernels;

static isa_kernels simd[AC_ISA_COUNT]; /* SIMD tables built like dispatch.c builds them */
static int n_simd;
static int driver_isas[AC_ISA_COUNT], n_driver_isas; /* every available ISA, scalar first */

static void collect_isas(void) {
    int (*const fill[AC_ISA_COUNT])(ac_kernels *) = {ac_kernels_scalar, ac_kernels_sse2,
                                                      ac_kernels_avx2, ac_kernels_neon};
    int (*const qfill[AC_ISA_COUNT])(ac_kernels *) = {
        NULL, ac_quant_kernels_sse2, ac_quant_kernels_avx2, ac_quant_kernels_neon};
    memset(&ref, 0, sizeof ref);
    ac_kernels_scalar(&ref);
    ac_quant_kernels_scalar(&ref);
    for (int isa = 0; isa < AC_ISA_COUNT; isa++) {
        if (ac_isa_available(isa)) driver_isas[n_driver_isas++] = isa;
        if (isa == AC_ISA_SCALAR) continue;
        ac_kernels k;
        memset(&k, 0, sizeof k);
        int compiled = fill[isa](&k);
        ac_quant_kernels_scalar(&k);
        int quant = qfill[isa](&k);
        if (compiled && quant && ac_isa_available(isa)) {
            simd[n_simd].isa = isa;
            simd[n_simd].k = k;
            n_simd++;
            printf("isa %-6s kernels tested\n", ac_isa_name(isa));
        } else {
            printf("isa %-6s kernels not tested (%s)\n", ac_isa_name(isa),
                   compiled && quant ? "not supported by this CPU"
                                     : "not compiled for this target");
        }
    }
}

static const int bits_list[4] = {1, 2, 4, 8};
static const char *const dtype_names[5] = {"?", "f16", "bf16", "f32", "f64"};
static size_t dtype_size(int dtype) {
    return dtype == AC_F16 || dtype == AC_BF16 ? 2 : dtype == AC_F32 ? 4 : 8;
}

/* ---- minmax ---- */

enum { M_MAGS, M_ZEROS, M_POS_ZERO, M_NEG_ZERO, M_SUBNORMAL, M_CONST, M_NONFINITE, M_COUNT };
static const char *const minmax_names[M_COUNT] = {"magnitudes", "+-0 only", "pos and +-0",
                                                  "neg and +-0", "subnormal", "constant",
                                                  "non-finite"};

static float signed_zero(void) { return (rnd() & 1) ? -0.0f : 0.0f; }
/* Extremes compare by bits, except that a zero may come back with either sign (the kernel
 * contract: the driver makes it +0.0). */
static uint32_t extreme_bits(float v) { return f2u(v + 0.0f); }

static uint32_t rnd_nonfinite_bits(void) {
    static const uint32_t special[6] = {0x7F800000u, 0xFF800000u, 0x7FC00000u,
                                        0xFFC00000u, 0x7F800001u, 0x7FBFFFFFu};
    return rnd() & 1 ? special[rnd_below(6)] : (0x7F800000u | ((uint32_t)rnd() & 0x807FFFFFu));
}

static void minmax_case(size_t n, int pattern) {
    const size_t off = rnd_below(8); /* float offset: 4-byte aligned, not more */
    float *block = xmalloc((off + n) * sizeof(float)), *x = block + off;
    const float base = rnd_mag(-60, 60);
    for (size_t i = 0; i < n; i++) {
        float v;
        switch (pattern) {
        case M_MAGS: v = rnd() % 16 ? rnd_mag(-150, 127) : signed_zero(); break;
        case M_ZEROS: v = signed_zero(); break;
        case M_POS_ZERO: v = rnd() % 4 ? fabsf(rnd_mag(-20, 20)) : signed_zero(); break;
        case M_NEG_ZERO: v = rnd() % 4 ? -fabsf(rnd_mag(-20, 20)) : signed_zero(); break;
        case M_SUBNORMAL: v = u2f(((uint32_t)rnd() & 0x807FFFFFu)); break;
        case M_CONST: v = base; break;
        default: v = rnd_mag(-30, 30); break;
        }
        x[i] = v;
    }
    if (pattern == M_NONFINITE) /* one or two bad elements anywhere, first and last included */
        for (int j = 0; j < 1 + (int)(rnd() & 1); j++) {
            size_t at = rnd() % 4 == 0 ? (rnd() & 1 ? 0 : n - 1) : rnd_below(n);
            x[at] = u2f(rnd_nonfinite_bits());
        }
    float rlo, rhi;
    int rbad = ref.minmax(x, n, &rlo, &rhi);
    /* The reference itself: the verdict, and the extremes by value. */
    int want_bad = 0;
    float want_lo = x[0], want_hi = x[0];
    for (size_t i = 0; i < n; i++) {
        want_bad |= !isfinite(x[i]);
        if (x[i] < want_lo) want_lo = x[i];
        if (x[i] > want_hi) want_hi = x[i];
    }
    report(rbad == want_bad && (rbad || (rlo == want_lo && rhi == want_hi)),
           "minmax reference n=%zu %s", n, minmax_names[pattern]);
    for (int t = 0; t < n_simd; t++) {
        float lo = 1234.5f, hi = -1234.5f;
        int bad = simd[t].k.minmax(x, n, &lo, &hi);
        report(bad == rbad && (bad || (extreme_bits(lo) == extreme_bits(rlo) &&
                                       extreme_bits(hi) == extreme_bits(rhi))),
               "minmax isa=%s n=%zu %s: nonfinite %d/%d lo %08x/%08x hi %08x/%08x",
               ac_isa_name(simd[t].isa), n, minmax_names[pattern], bad, rbad, f2u(lo),
               f2u(rlo), f2u(hi), f2u(rhi));
    }
    free(block);
}

static void minmax_tests(void) {
    static const size_t large[] = {4096, 4097, 65536 + 3};
    for (size_t n = 1; n <= 600; n++)
        for (int p = 0; p < M_COUNT; p++) minmax_case(n, p);
    for (size_t i = 0; i < sizeof large / sizeof large[0]; i++)
        for (int p = 0; p < M_COUNT; p++) minmax_case(large[i], p);
}

/* ---- quantize ---- */

enum { Q_UNIFORM, Q_MAGS, Q_CONST, Q_RELU, Q_TIES, Q_NEAR, Q_WIDE, Q_TINY, Q_COUNT };
static const char *const quant_names[Q_COUNT] = {"uniform", "magnitudes", "constant", "relu",
                                                 "ties", "near-levels", "wide-t", "tiny"};

/* The driver's group parameters from the reference min/max; 0 if the driver would not call
 * the kernels (range overflow, or 1 / scale overflowing). */
static int driver_params(const float *x, size_t n, uint32_t levels, float *mn, float *inv) {
    float lo, hi;
    if (ref.minmax(x, n, &lo, &hi)) return 0;
    lo += 0.0f;
    hi += 0.0f;
    float scale = (hi - lo) / (float)levels;
    if (!isfinite(scale)) return 0;
    *mn = lo;
    *inv = scale > 0 ? 1.0f / scale : 0.0f;
    return !isinf(*inv);
}

/* Fills x[0, n) for a pattern and picks (mn, inv) with 0 <= (x - mn) * inv < 2^23. */
static void quant_input(float *x, size_t n, int pattern, uint32_t levels, float *mn, float *inv) {
    for (int attempt = 0;; attempt++) {
        const int e = (int)rnd_below(60) - 30;
        const float lo = rnd_mag(-40, 40), width = fabsf(rnd_mag(-40, 40));
        for (size_t i = 0; i < n; i++) {
            switch (pattern) {
            case Q_UNIFORM: x[i] = lo + width * (float)rnd01(); break;
            case Q_MAGS: x[i] = rnd() % 8 ? rnd_mag(e - 20, e + 20) : signed_zero(); break;
            case Q_CONST: x[i] = lo; break;
            case Q_RELU: x[i] = rnd() & 1 ? 0.0f : fabsf(rnd_mag(e - 8, e)); break;
            case Q_TINY: x[i] = ldexpf((float)rnd01(), -105 - (int)rnd_below(15)); break;
            default: x[i] = 0; break;
            }
        }
        if (pattern == Q_TIES || pattern == Q_NEAR) {
            /* mn = j 2^e and inv = 2^-e make t = (x - mn) * inv exact: ties k + 0.5 and
             * integers around every level, or their float neighbours. */
            const float step = ldexpf(1.0f, e), m0 = (float)((int)rnd_below(2001) - 1000) * step;
            for (size_t i = 0; i < n; i++) {
                float k = (float)rnd_below(levels + 3) + (rnd() % 3 ? 0.5f : 0.0f);
                float v = m0 + k * step;
                if (pattern == Q_NEAR) v = nextafterf(v, rnd() & 1 ? INFINITY : -INFINITY);
                x[i] = v >= m0 ? v : m0;
            }
            *mn = m0;
            *inv = ldexpf(1.0f, -e);
            return;
        }
        if (pattern == Q_WIDE) { /* t up to ~2^22: codes far beyond levels are clamped */
            for (size_t i = 0; i < n; i++) x[i] = (float)rnd01();
            *mn = 0.0f;
            *inv = ldexpf(1.0f, (int)rnd_below(23));
            return;
        }
        if (n == 0) {
            *mn = 0.0f;
            *inv = 1.0f;
            return;
        }
        if (driver_params(x, n, levels, mn, inv)) return;
        if (attempt > 100) { /* cannot happen with these ranges; fail loudly rather than hang */
            fprintf(stderr, "quant_input: no usable parameters for %s\n", quant_names[pattern]);
            exit(2);
        }
    }
}

static void quantize_case(size_t n, int pattern, int bits) {
    const uint32_t levels = (1u << bits) - 1u;
    const size_t off = rnd_below(8), coff = rnd_below(32);
    float *block = xmalloc((off + n) * sizeof(float)), *x = block + off;
    float mn, inv;
    quant_input(x, n, pattern, levels, &mn, &inv);
    const uint32_t key = (uint32_t)rnd();
    /* idx0 anywhere, or right below 2^32 so the call ends exactly at (or just before) it. */
    const uint32_t idx0 =
        rnd() & 1 ? (uint32_t)rnd() : 0u - (uint32_t)n - (uint32_t)rnd_below(3);
    uint8_t *want[2][2];
    guarded got = guarded_new(n, coff);
    for (int trick = 0; trick < 2; trick++)
        for (int r = 0; r < 2; r++) {
            want[trick][r] = xmalloc(n);
            ref.quantize[trick][r](x, n, mn, inv, levels, key, idx0, want[trick][r]);
        }
    for (int r = 0; r < 2; r++) /* the reference: both conversions give the same codes */
        report(memcmp(want[0][r], want[1][r], n) == 0,
               "quantize reference trick == cast n=%zu %s bits=%d round=%d", n,
               quant_names[pattern], bits, r);
    for (int t = 0; t < n_simd; t++)
        for (int trick = 0; trick < 2; trick++)
            for (int r = 0; r < 2; r++) {
                guarded_reset(&got);
                simd[t].k.quantize[trick][r](x, n, mn, inv, levels, key, idx0, got.p);
                size_t i = 0;
                while (i < n && got.p[i] == want[trick][r][i]) i++;
                report(i == n && guarded_clean(&got),
                       "quantize isa=%s n=%zu %s bits=%d trick=%d round=%d mn=%a inv=%a "
                       "key=%08x idx0=%08x: %s at %zu",
                       ac_isa_name(simd[t].isa), n, quant_names[pattern], bits, trick, r,
                       (double)mn, (double)inv, key, idx0, i < n ? "code" : "stray write", i);
            }
    for (int trick = 0; trick < 2; trick++)
        for (int r = 0; r < 2; r++) free(want[trick][r]);
    free(got.block);
    free(block);
}

static void quantize_tests(void) {
    static const size_t large[] = {4096, 4096 + 17, 65536 + 5};
    for (size_t n = 0; n <= 600; n++)
        for (int b = 0; b < 4; b++) /* patterns rotate with n */
            quantize_case(n, (int)((n + (size_t)b) % Q_COUNT), bits_list[b]);
    for (size_t i = 0; i < sizeof large / sizeof large[0]; i++)
        for (int p = 0; p < Q_COUNT; p++)
            for (int b = 0; b < 4; b++) quantize_case(large[i], p, bits_list[b]);
}

/* ---- group kernels: one call over consecutive groups = one call per group ---- */
/* (ginv serves as the scales of the dequantize check: any finite floats do.) */

static void groups_case(size_t n, size_t G, int bits, int with_bad) {
    const uint32_t levels = (1u << bits) - 1u, key = (uint32_t)rnd(), idx0 = (uint32_t)rnd();
    const size_t off = rnd_below(8), ng = (n + G - 1) / G;
    float *block = xmalloc((off + n + 1) * sizeof(float)), *x = block + off;
    float *mn = xmalloc((ng + 1) * sizeof(float)), *mx = xmalloc((ng + 1) * sizeof(float));
    float *gmn = xmalloc((ng + 1) * sizeof(float)), *ginv = xmalloc((ng + 1) * sizeof(float));
    uint8_t *want = xmalloc(n + 1);
    guarded got = guarded_new(n, rnd_below(32));
    int want_bad = 0;
    for (size_t s = 0, g = 0; s < n; s += G, g++) { /* each group its own range */
        size_t len = n - s < G ? n - s : G;
        float lo = rnd_mag(-20, 20), width = fabsf(rnd_mag(-20, 20));
        for (size_t i = 0; i < len; i++)
            x[s + i] = rnd() % 8 ? lo + width * (float)rnd01() : signed_zero();
        if (!driver_params(x + s, len, levels, &gmn[g], &ginv[g])) {
            gmn[g] = 0.0f; /* keep t in the kernels' domain: codes clamp at levels */
            ginv[g] = 0.0f;
        }
    }
    if (with_bad && n) x[rnd_below(n)] = u2f(rnd_nonfinite_bits());
    for (size_t s = 0, g = 0; s < n; s += G, g++) {
        size_t len = n - s < G ? n - s : G;
        float lo, hi;
        want_bad |= ref.minmax(x + s, len, &lo, &hi);
        mn[g] = lo;
        mx[g] = hi;
        ref.quantize[0][0](x + s, len, gmn[g], ginv[g], levels, key, idx0 + (uint32_t)s,
                           want + s);
    }
    for (int t = -1; t < n_simd; t++) {
        const ac_kernels *k = t < 0 ? &ref : &simd[t].k;
        const char *isa = t < 0 ? "scalar" : ac_isa_name(simd[t].isa);
        float *lo = xmalloc((ng + 1) * sizeof(float)), *hi = xmalloc((ng + 1) * sizeof(float));
        int bad = n ? k->minmax_groups(x, n, G, lo, hi) : 0;
        size_t g = 0;
        while (!bad && g < ng && extreme_bits(lo[g]) == extreme_bits(mn[g]) &&
               extreme_bits(hi[g]) == extreme_bits(mx[g]))
            g++;
        report(bad == want_bad && (bad || g == ng),
               "minmax_groups isa=%s n=%zu G=%zu: nonfinite %d/%d, group %zu", isa, n, G, bad,
               want_bad, g);
        free(lo);
        free(hi);
        if (want_bad) continue;
        for (int trick = 0; trick < 2; trick++) {
            uint8_t *ref_codes = xmalloc(n + 1);
            for (size_t s = 0, h = 0; s < n; s += G, h++) /* this rounding's reference */
                ref.quantize[trick][1](x + s, n - s < G ? n - s : G, gmn[h], ginv[h], levels,
                                       key, idx0 + (uint32_t)s, ref_codes + s);
            for (int r = 0; r < 2; r++) {
                const uint8_t *w = r == 0 ? want : ref_codes;
                guarded_reset(&got);
                k->quantize_groups[trick][r](x, n, G, gmn, ginv, levels, key, idx0, got.p);
                size_t i = 0;
                while (i < n && got.p[i] == w[i]) i++;
                report(i == n && guarded_clean(&got),
                       "quantize_groups isa=%s n=%zu G=%zu bits=%d trick=%d round=%d: %s at %zu",
                       isa, n, G, bits, trick, r, i < n ? "code" : "stray write", i);
            }
            free(ref_codes);
        }
        for (int trick = 0; trick < 2; trick++) { /* and back: dequantize the codes */
            float *dq = xmalloc((n + 1) * sizeof(float)), *dw = xmalloc((n + 1) * sizeof(float));
            for (size_t s = 0, h = 0; s < n; s += G, h++)
                ref.dequantize[trick](want + s, n - s < G ? n - s : G, gmn[h], ginv[h], dw + s);
            k->dequantize_groups[trick](want, n, G, gmn, ginv, dq);
            size_t i = 0;
            while (i < n && f2u(dq[i]) == f2u(dw[i])) i++;
            report(i == n, "dequantize_groups isa=%s n=%zu G=%zu trick=%d: differs at %zu", isa,
                   n, G, trick, i);
            free(dq);
            free(dw);
        }
    }
    free(got.block);
    free(want);
    free(gmn);
    free(ginv);
    free(mn);
    free(mx);
    free(block);
}

static void groups_tests(void) {
    static const size_t sizes[] = {32, 33, 64, 96, 100, 256, 1000, 4096};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (int rep = 0; rep < 12; rep++) {
            size_t G = sizes[i], n = rep < 4 ? rnd_below(3 * G + 2) : G * (1 + rnd_below(5));
            groups_case(n, G, bits_list[rep % 4], rep % 5 == 4);
        }
    groups_case(4096, 256, 2, 0);
    groups_case(4096 - 7, 32, 8, 0);
}

/* ---- dequantize ---- */

static void dequantize_case(size_t n) {
    const size_t coff = rnd_below(32), ooff = 4 * rnd_below(8);
    uint8_t *block = xmalloc(coff + n), *codes = block + coff;
    for (size_t i = 0; i < n; i++) codes[i] = (uint8_t)rnd();
    const float mn = rnd() % 8 ? rnd_mag(-140, 120) : signed_zero();
    const float scale = rnd() % 8 ? fabsf(rnd_mag(-149, 110)) : 0.0f;
    float *want = xmalloc(n * sizeof(float));
    guarded got = guarded_new(n * sizeof(float), ooff);
    for (int trick = 0; trick < 2; trick++) {
        ref.dequantize[trick](codes, n, mn, scale, want);
        for (size_t i = 0; i < n; i++) { /* the reference: mn + code * scale, two roundings */
            volatile float prod = (float)codes[i] * scale;
            if (f2u(want[i]) != f2u(mn + prod)) {
                report(0, "dequantize reference trick=%d n=%zu at %zu", trick, n, i);
                break;
            }
        }
        for (int t = 0; t < n_simd; t++) {
            guarded_reset(&got);
            simd[t].k.dequantize[trick](codes, n, mn, scale, (float *)got.p);
            report(memcmp(got.p, want, n * sizeof(float)) == 0 && guarded_clean(&got),
                   "dequantize isa=%s trick=%d n=%zu mn=%a scale=%a", ac_isa_name(simd[t].isa),
                   trick, n, (double)mn, (double)scale);
        }
    }
    free(got.block);
    free(want);
    free(block);
}

static void dequantize_tests(void) {
    for (size_t n = 0; n <= 600; n++) dequantize_case(n);
    dequantize_case(4096);
    dequantize_case(65536 + 7);
}

/* ---- pack / unpack ---- */

static void pack_case(size_t nblocks, int bits) {
    const int bi = bits == 1 ? 0 : bits == 2 ? 1 : bits == 4 ? 2 : 3;
    const size_t ncodes = nblocks * (256 / (size_t)bits), nbytes = nblocks * 32;
    const size_t o1 = rnd_below(32), o2 = rnd_below(32);
    uint8_t *cblock = xmalloc(o1 + ncodes), *codes = cblock + o1;
    uint8_t *pblock = xmalloc(o2 + nbytes), *packed = pblock + o2;
    for (size_t i = 0; i < ncodes; i++) codes[i] = (uint8_t)(rnd() & ((1u << bits) - 1u));
    for (size_t i = 0; i < nbytes; i++) packed[i] = (uint8_t)rnd();
    uint8_t *want_p = xmalloc(nbytes), *want_c = xmalloc(ncodes);
    ref.pack[bi](codes, nblocks, want_p);
    ref.unpack[bi](packed, nblocks, want_c);
    /* The reference against the layout: byte j of block b holds codes j + 32 i, i = 0.. */
    int layout_ok = 1;
    for (size_t b = 0; b < nblocks && layout_ok; b++)
        for (unsigned j = 0; j < 32; j++)
            for (unsigned i = 0; i < 8u / (unsigned)bits; i++) {
                unsigned c = (want_p[32 * b + j] >> (bits * (int)i)) & ((1u << bits) - 1u);
                layout_ok &= c == codes[b * (256 / (size_t)bits) + j + 32 * i];
            }
    report(layout_ok, "pack reference layout bits=%d nblocks=%zu", bits, nblocks);
    guarded gp = guarded_new(nbytes, rnd_below(32)), gc = guarded_new(ncodes, rnd_below(32));
    for (int t = 0; t < n_simd; t++) {
        const char *isa = ac_isa_name(simd[t].isa);
        guarded_reset(&gp);
        simd[t].k.pack[bi](codes, nblocks, gp.p);
        report(memcmp(gp.p, want_p, nbytes) == 0 && guarded_clean(&gp),
               "pack isa=%s bits=%d nblocks=%zu", isa, bits, nblocks);
        guarded_reset(&gc);
        simd[t].k.unpack[bi](packed, nblocks, gc.p);
        report(memcmp(gc.p, want_c, ncodes) == 0 && guarded_clean(&gc),
               "unpack (any bytes) isa=%s bits=%d nblocks=%zu", isa, bits, nblocks);
        guarded_reset(&gc);
        simd[t].k.unpack[bi](want_p, nblocks, gc.p);
        report(memcmp(gc.p, codes, ncodes) == 0 && guarded_clean(&gc),
               "unpack(pack(codes)) isa=%s bits=%d nblocks=%zu", isa, bits, nblocks);
    }
    free(gc.block);
    free(gp.block);
    free(want_c);
    free(want_p);
    free(pblock);
    free(cblock);
}

static void pack_tests(void) {
    for (int b = 0; b < 4; b++) {
        for (size_t nb = 0; nb <= 40; nb++) pack_case(nb, bits_list[b]);
        pack_case(16 * 32 / (size_t)bits_list[b] + 3, bits_list[b]); /* past a 4096-code tile */
        pack_case(2049, bits_list[b]);
    }
}

/* ---- dtype conversions ---- */

static void to_f32_check(int dtype, const unsigned char *src, size_t n, const char *what) {
    const size_t es = dtype_size(dtype);
    const size_t off = rnd_below(8), doff = 4 * rnd_below(8);
    unsigned char *block = xmalloc(off + n * es), *s = block + off; /* odd offsets too */
    memcpy(s, src, n * es);
    float *want = xmalloc(n * sizeof(float));
    ref.to_f32[dtype](s, n, want);
    guarded got = guarded_new(n * sizeof(float), doff);
    for (int t = 0; t < n_simd; t++) {
        guarded_reset(&got);
        simd[t].k.to_f32[dtype](s, n, (float *)got.p);
        size_t i = 0;
        while (i < n && memcmp(got.p + 4 * i, want + i, 4) == 0) i++;
        uint64_t in = 0;
        uint32_t have = 0;
        if (i < n) {
            memcpy(&in, s + i * es, es);
            memcpy(&have, got.p + 4 * i, 4);
        }
        report(i == n && guarded_clean(&got),
               "to_f32 isa=%s %s %s n=%zu: %s at %zu (in %" PRIx64 " got %08x want %08x)",
               ac_isa_name(simd[t].isa), dtype_names[dtype], what, n,
               i < n ? "value" : "stray write", i, in, have, i < n ? f2u(want[i]) : 0);
    }
    free(got.block);
    free(want);
    free(block);
}

static void from_f32_check(int dtype, const float *src, size_t n, const char *what) {
    const size_t es = dtype_size(dtype);
    const size_t off = rnd_below(8), doff = rnd_below(8);
    float *block = xmalloc((off + n) * sizeof(float)), *s = block + off;
    memcpy(s, src, n * sizeof(float));
    unsigned char *want = xmalloc(n * es);
    ref.from_f32[dtype](s, n, want);
    guarded got = guarded_new(n * es, doff);
    for (int t = 0; t < n_simd; t++) {
        guarded_reset(&got);
        simd[t].k.from_f32[dtype](s, n, got.p);
        size_t i = 0;
        while (i < n && memcmp(got.p + es * i, want + es * i, es) == 0) i++;
        uint64_t have = 0, expect = 0;
        if (i < n) {
            memcpy(&have, got.p + es * i, es);
            memcpy(&expect, want + es * i, es);
        }
        report(i == n && guarded_clean(&got),
               "from_f32 isa=%s %s %s n=%zu: %s at %zu (in %08x got %" PRIx64 " want %" PRIx64 ")",
               ac_isa_name(simd[t].isa), dtype_names[dtype], what, n,
               i < n ? "value" : "stray write", i, i < n ? f2u(s[i]) : 0, have, expect);
    }
    free(got.block);
    free(want);
    free(block);
}

/* Random doubles: any bit pattern, or near float values (rounding ties and neighbours). */
static double rnd_f64(void) {
    uint64_t u = rnd();
    double d;
    switch (rnd() % 4) {
    case 0: break; /* any bits: NaN payloads, inf, subnormals, out of float range */
    case 1: {      /* exactly halfway between two floats, or one double ulp off it */
        double f = (double)rnd_finite();
        u = 0;
        memcpy(&u, &f, 8);
        u += (1ull << 28) + (uint64_t)rnd_below(3) - 1;
        break;
    }
    case 2: d = ldexp(rnd01(), (int)rnd_below(320) - 160); memcpy(&u, &d, 8); break;
    default: d = (double)rnd_finite(); memcpy(&u, &d, 8); break;
    }
    memcpy(&d, &u, 8);
    return d;
}

static void conversion_tests(void) {
    /* 16-bit types: every bit pattern, once in order and at random lengths. */
    static uint16_t all16[65536];
    for (uint32_t i = 0; i < 65536; i++) all16[i] = (uint16_t)i;
    for (int dtype = AC_F16; dtype <= AC_BF16; dtype++) {
        to_f32_check(dtype, (const unsigned char *)all16, 65536, "all patterns");
        for (size_t n = 0; n <= 200; n++)
            to_f32_check(dtype, (const unsigned char *)(all16 + rnd_below(65536 - 200)), n, "run");
    }
    /* Exactness of the reference where the answer is known: every float16 and bfloat16
     * survives the round trip through float32 bit for bit (NaNs: quieted, payload kept). */
    {
        float f[65536];
        uint16_t back[65536];
        for (int dtype = AC_F16; dtype <= AC_BF16; dtype++) {
            ref.to_f32[dtype](all16, 65536, f);
            ref.from_f32[dtype](f, 65536, back);
            uint32_t i = 0;
            for (; i < 65536; i++) {
                uint16_t quiet = dtype == AC_F16 ? 0x200 : 0x40;
                int nan = isnan(f[i]);
                if (back[i] != (nan ? all16[i] | quiet : all16[i])) break;
            }
            report(i == 65536, "reference %s round trip at %04x", dtype_names[dtype], i);
        }
    }
    /* float64 -> float32. */
    {
        const size_t n = 20000;
        double *d = xmalloc(n * sizeof(double));
        for (size_t i = 0; i < n; i++) d[i] = rnd_f64();
        to_f32_check(AC_F64, (const unsigned char *)d, n, "random");
        for (size_t len = 0; len <= 100; len++)
            to_f32_check(AC_F64, (const unsigned char *)(d + rnd_below(n - 100)), len, "run");
        free(d);
    }
    /* float32 -> 16-bit types and float64, on finite floats: every exponent, ties for both
     * 16-bit formats (float16 normal and subnormal, bfloat16), the float16 overflow edge;
     * then inf and NaN, which both paths also agree on. */
    {
        const size_t n = 1u << 16;
        float *x = xmalloc(n * sizeof(float));
        static const char *const kinds[6] = {"finite", "f16 ties", "f16 subnormal ties",
                                             "bf16 ties", "f16 overflow edge", "inf/nan"};
        for (int kind = 0; kind < 6; kind++) {
            for (size_t i = 0; i < n; i++) {
                uint32_t u = f2u(rnd_finite());
                switch (kind) {
                case 1: u = (u & ~0x1FFFu) | 0x1000u; break;
                case 2: /* k + 1/2 float16 subnormal steps */
                    u = f2u(ldexpf((float)rnd_below(2048) + 0.5f, -24)) | (u & 0x80000000u);
                    break;
                case 3: u = (u & ~0xFFFFu) | 0x8000u; break;
                case 4: u = (0x477FE000u + (uint32_t)rnd_below(0x4000)) | (u & 0x80000000u); break;
                case 5: u = rnd() & 1 ? rnd_nonfinite_bits() : u; break;
                default: break;
                }
                if (kind > 0 && rnd() % 8 == 0) u += (uint32_t)rnd_below(3) - 1u; /* neighbours */
                x[i] = u2f(u);
            }
            for (int dtype = AC_F16; dtype <= AC_F64; dtype++) {
                if (dtype == AC_F32) continue;
                from_f32_check(dtype, x, n, kinds[kind]);
                if (kind == 0)
                    for (size_t len = 0; len <= 100; len++)
                        from_f32_check(dtype, x + rnd_below(n - 100), len, "run");
            }
        }
        free(x);
    }
    /* A sweep over the whole float32 range with a prime stride, both directions of f16. */
    {
        const size_t n = 1u << 20;
        float *x = xmalloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) x[i] = u2f((uint32_t)(i * 4099u + 17u));
        from_f32_check(AC_F16, x, n, "stride sweep");
        from_f32_check(AC_BF16, x, n, "stride sweep");
        free(x);
    }
}

/* ---- public driver API ---- */

static void encode_arg_tests(void) {
    float x[4] = {1, 2, 3, 4}, mins[1], scales[1];
    uint8_t packed[32];
    size_t bad = 0;
    report(ac_quant_encode(x, 4, 0, 4, 256, 0, 1, packed, mins, scales, &bad, NULL) == AC_EINVAL,
           "encode dtype 0 -> EINVAL");
    report(ac_quant_encode(x, 4, 5, 4, 256, 0, 1, packed, mins, scales, &bad, NULL) == AC_EINVAL,
           "encode dtype 5 -> EINVAL");
    static const int bad_bits[] = {0, 3, 5, 16, -1};
    for (size_t i = 0; i < sizeof bad_bits / sizeof bad_bits[0]; i++) {
        report(ac_quant_encode(x, 4, AC_F32, bad_bits[i], 256, 0, 1, packed, mins, scales,
                               &bad, NULL) == AC_EINVAL, "encode bits=%d -> EINVAL", bad_bits[i]);
        report(ac_quant_decode(packed, mins, scales, 4, bad_bits[i], 256, AC_F32, x, NULL) == AC_EINVAL,
               "decode bits=%d -> EINVAL", bad_bits[i]);
    }
    report(ac_quant_encode(x, 4, AC_F32, 4, 256, 2, 1, packed, mins, scales, &bad, NULL) == AC_EINVAL,
           "encode rounding 2 -> EINVAL");
    report(ac_quant_encode(x, 4, AC_F32, 4, 256, -1, 1, packed, mins, scales, &bad, NULL) == AC_EINVAL,
           "encode rounding -1 -> EINVAL");
    report(ac_quant_encode(x, 4, AC_F32, 4, 256, 0, 1, packed, mins, scales, NULL, NULL) == AC_EINVAL,
           "encode bad_index NULL -> EINVAL");
    report(ac_quant_encode(NULL, 4, AC_F32, 4, 256, 0, 1, packed, mins, scales, &bad, NULL) == AC_EINVAL,
           "encode src NULL -> EINVAL");
    report(ac_quant_encode(x, 4, AC_F32, 4, 256, 0, 1, NULL, mins, scales, &bad, NULL) == AC_EINVAL,
           "encode packed NULL -> EINVAL");
    report(ac_quant_encode(x, 4, AC_F32, 4, 256, 0, 1, packed, NULL, scales, &bad, NULL) == AC_EINVAL,
           "encode mins NULL -> EINVAL");
    report(ac_quant_encode(x, 4, AC_F32, 4, 256, 0, 1, packed, mins, NULL, &bad, NULL) == AC_EINVAL,
           "encode scales NULL -> EINVAL");
    report(ac_quant_encode(x, SIZE_MAX / 8, AC_F32, 4, 256, 0, 1, packed, mins, scales, &bad, NULL) ==
               AC_EINVAL, "encode n too large -> EINVAL");
    report(ac_quant_encode(NULL, 0, AC_F32, 4, 256, 0, 1, NULL, NULL, NULL, &bad, NULL) == AC_OK,
           "encode n=0 -> OK");
    report(ac_quant_decode(packed, mins, scales, 4, 4, 256, 0, x, NULL) == AC_EINVAL,
           "decode dtype 0 -> EINVAL");
    report(ac_quant_decode(packed, mins, scales, 4, 4, 256, 9, x, NULL) == AC_EINVAL,
           "decode dtype 9 -> EINVAL");
    report(ac_quant_decode(NULL, mins, scales, 4, 4, 256, AC_F32, x, NULL) == AC_EINVAL,
           "decode packed NULL -> EINVAL");
    report(ac_quant_decode(packed, NULL, scales, 4, 4, 256, AC_F32, x, NULL) == AC_EINVAL,
           "decode mins NULL -> EINVAL");
    report(ac_quant_decode(packed, mins, NULL, 4, 4, 256, AC_F32, x, NULL) == AC_EINVAL,
           "decode scales NULL -> EINVAL");
    report(ac_quant_decode(packed, mins, scales, 4, 4, 256, AC_F32, NULL, NULL) == AC_EINVAL,
           "decode dst NULL -> EINVAL");
    report(ac_quant_decode(NULL, NULL, NULL, 0, 4, 256, AC_F32, NULL, NULL) == AC_OK,
           "decode n=0 -> OK");
    report(ac_quant_packed_nbytes(0, 4) == 0 && ac_quant_packed_nbytes(1, 4) == 1 &&
               ac_quant_packed_nbytes(64, 4) == 32 && ac_quant_packed_nbytes(65, 4) == 33 &&
               ac_quant_packed_nbytes(100, 4) == 64 && ac_quant_packed_nbytes(300, 1) == 64 &&
               ac_quant_packed_nbytes(10, 3) == 0, "ac_quant_packed_nbytes");
    report(ac_quant_ngroups(0, 256) == 0 && ac_quant_ngroups(1, 256) == 1 &&
               ac_quant_ngroups(512, 256) == 2 && ac_quant_ngroups(513, 256) == 3 &&
               ac_quant_ngroups(513, 0) == 1, "ac_quant_ngroups");
    /* The stochastic draw: 24 bits in [0, 1), different per index. */
    float u0 = ac_uniform(42, 0), u1 = ac_uniform(42, 1), uh = ac_uniform(42, 1ull << 32);
    report(u0 >= 0 && u0 < 1 && u1 >= 0 && u1 < 1 && u0 != u1 && uh != u0 &&
               ldexpf(u0, 24) == floorf(ldexpf(u0, 24)), "ac_uniform");
    /* Options out of range, and paths this CPU lacks. */
    ac_options bad_opts[4] = {{-1, AC_ISA_DEFAULT, -1}, {1025, AC_ISA_DEFAULT, -1},
                              {0, AC_ISA_COUNT, -1}, {0, AC_ISA_DEFAULT, 2}};
    for (int i = 0; i < 4; i++) {
        report(ac_quant_encode(x, 4, AC_F32, 4, 256, 0, 1, packed, mins, scales, &bad,
                               &bad_opts[i]) == AC_EINVAL, "encode with bad options %d", i);
        report(ac_quant_decode(packed, mins, scales, 4, 4, 256, AC_F32, x, &bad_opts[i]) ==
                   AC_EINVAL, "decode with bad options %d", i);
        float lo, hi;
        report(ac_minmax(x, 4, AC_F32, &lo, &hi, &bad, &bad_opts[i]) == AC_EINVAL,
               "minmax with bad options %d", i);
    }
    for (int isa = 0; isa < AC_ISA_COUNT; isa++) {
        if (ac_isa_available(isa)) continue;
        ac_options o = {0, isa, -1};
        report(ac_quant_encode(x, 4, AC_F32, 4, 256, 0, 1, packed, mins, scales, &bad, &o) ==
                   AC_EUNSUPPORTED, "encode on unavailable %s", ac_isa_name(isa));
    }
}

/* An input tensor: the dtype bytes and their float32 values (what the codec quantizes). */
typedef struct {
    int dtype;
    size_t n;
    unsigned char *data;
    float *x32;
} tensor;

/* Runs of random length, each from one distribution: smooth values around a centre, ReLU
 * output, constants, a grid with ties, tiny (subnormal-range) values. */
static tensor make_tensor(int dtype, size_t n) {
    tensor t = {dtype, n, xmalloc(n * dtype_size(dtype)), xmalloc(n * sizeof(float))};
    const int emax = dtype == AC_F16 ? 12 : 60;
    for (size_t i = 0; i < n;) {
        size_t len = 1 + rnd_below(rnd() & 1 ? 700 : 5000);
        if (len > n - i) len = n - i;
        const int kind = (int)rnd_below(6), e = (int)rnd_below((size_t)emax + 20) - 20;
        const float centre = rnd_mag(e - 6, e), spread = fabsf(rnd_mag(e - 12, e));
        for (size_t j = i; j < i + len; j++) {
            float v;
            switch (kind) {
            case 0: v = centre + spread * (float)(rnd01() + rnd01() - 1.0); break;
            case 1: v = rnd() & 1 ? 0.0f : fabsf(spread * (float)rnd01()); break;
            case 2: v = centre; break;
            case 3: v = ldexpf((float)rnd_below(64) * 0.5f, e - 5); break;
            case 4: v = ldexpf((float)rnd01() - 0.5f, dtype == AC_F16 ? -12 : -128); break;
            default: v = rnd_mag(e - 20, e); break;
            }
            t.x32[j] = v;
        }
        i += len;
    }
    if (dtype == AC_F32) {
        memcpy(t.data, t.x32, n * sizeof(float));
    } else if (dtype == AC_F64) { /* doubles between floats, so conversion has to round */
        for (size_t i = 0; i < n; i++) {
            double d = (double)t.x32[i] * (1.0 + (rnd01() - 0.5) * 0x1p-22);
            memcpy(t.data + 8 * i, &d, 8);
            t.x32[i] = (float)d;
        }
    } else {
        ref.from_f32[dtype](t.x32, n, t.data);
        ref.to_f32[dtype](t.data, n, t.x32);
    }
    return t;
}

static void tensor_free(tensor *t) {
    free(t->data);
    free(t->x32);
}

/* One unit in the last place of |v| as a float, in double. */
static double ulp_of(double v) {
    int e;
    frexp(fabs(v), &e);
    return ldexp(1.0, (e - 24 < -149 ? -149 : e - 24));
}

/* decode(encode(x)) against x: within half a step (nearest) or a step (stochastic), plus the
 * few roundings of the float32 arithmetic; constant groups exactly. */
static void check_error_bound(const tensor *t, size_t group, int bits, int rounding,
                              const float *mins, const float *scales, const float *xhat,
                              const char *ctx) {
    const size_t G = group == 0 || group > t->n ? t->n : group;
    const double levels = (double)((1u << bits) - 1u);
    size_t worst_i = SIZE_MAX;
    for (size_t g = 0; g * G < t->n; g++) {
        const size_t s = g * G, e = s + G < t->n ? s + G : t->n;
        const double mn = mins[g], scale = scales[g];
        int constant = 1;
        for (size_t i = s; i < e; i++) constant &= t->x32[i] == t->x32[s];
        const double m = fmax(fabs(mn), fabs(mn + levels * scale));
        double bound = (rounding == AC_ROUND_NEAREST ? 0.5 : 1.0) * scale +
                       scale * 0x1p-12 + 8 * ulp_of(m);
        if (scale == 0) bound += levels * 0x1p-149; /* the step underflowed: all codes 0 */
        for (size_t i = s; i < e; i++) {
            double err = fabs((double)t->x32[i] - (double)xhat[i]);
            if (constant ? xhat[i] != t->x32[i] : !(err <= bound)) {
                worst_i = i;
                break;
            }
        }
        if (worst_i != SIZE_MAX) break;
    }
    report(worst_i == SIZE_MAX, "api %s: decode error bound at %zu (x %a xhat %a)", ctx,
           worst_i, worst_i != SIZE_MAX ? (double)t->x32[worst_i] : 0.0,
           worst_i != SIZE_MAX ? (double)xhat[worst_i] : 0.0);
}

typedef struct {
    uint8_t *packed;
    float *mins, *scales;
    size_t nbytes, ngroups;
} encoded;

static encoded encoded_new(size_t n, int bits, size_t group) {
    encoded e;
    e.nbytes = ac_quant_packed_nbytes(n, bits);
    e.ngroups = ac_quant_ngroups(n, group);
    e.packed = xmalloc(e.nbytes);
    e.mins = xmalloc(e.ngroups * sizeof(float));
    e.scales = xmalloc(e.ngroups * sizeof(float));
    return e;
}
static void encoded_free(encoded *e) {
    free(e->packed);
    free(e->mins);
    free(e->scales);
}

/* Every ISA x threads x code conversion must reproduce the scalar, single-thread encoding and
 * its decodes (to float32 and to the input dtype) byte for byte. */
static void api_roundtrip(const tensor *t, int bits, size_t group, int rounding, int full) {
    const size_t n = t->n, es = dtype_size(t->dtype);
    const uint64_t seed = rnd();
    char ctx[160];
    encoded want = encoded_new(n, bits, group), got = encoded_new(n, bits, group);
    float *want_f32 = xmalloc(n * sizeof(float)), *got_f32 = xmalloc(n * sizeof(float));
    unsigned char *want_dt = xmalloc(n * es), *got_dt = xmalloc(n * es);
    size_t bad = 0;

    ac_options o = {1, AC_ISA_SCALAR, 1};
    snprintf(ctx, sizeof ctx, "ref %s n=%zu bits=%d group=%zu round=%d", dtype_names[t->dtype],
             n, bits, group, rounding);
    int rc = ac_quant_encode(t->data, n, t->dtype, bits, group, rounding, seed, want.packed,
                             want.mins, want.scales, &bad, &o);
    report(rc == AC_OK, "api %s: encode rc=%d bad=%zu", ctx, rc, bad);
    rc = ac_quant_decode(want.packed, want.mins, want.scales, n, bits, group, AC_F32, want_f32,
                         &o);
    report(rc == AC_OK, "api %s: decode f32 rc=%d", ctx, rc);
    rc = ac_quant_decode(want.packed, want.mins, want.scales, n, bits, group, t->dtype, want_dt,
                         &o);
    report(rc == AC_OK, "api %s: decode %s rc=%d", ctx, dtype_names[t->dtype], rc);
    check_error_bound(t, group, bits, rounding, want.mins, want.scales, want_f32, ctx);

    for (int d = 0; d < n_driver_isas; d++)
        for (int threads = 1; threads <= 2; threads++)
            for (int trick = 0; trick < 2; trick++) {
                const int isa = driver_isas[d];
                if (isa == AC_ISA_SCALAR && threads == 1 && trick == 1) continue; /* the ref */
                if (!full && trick == 0) continue;
                snprintf(ctx, sizeof ctx, "isa=%s threads=%d trick=%d %s n=%zu bits=%d "
                         "group=%zu round=%d", ac_isa_name(isa), threads, trick,
                         dtype_names[t->dtype], n, bits, group, rounding);
                o = (ac_options){threads, isa, trick};
                memset(got.packed, CANARY, got.nbytes);
                rc = ac_quant_encode(t->data, n, t->dtype, bits, group, rounding, seed,
                                     got.packed, got.mins, got.scales, &bad, &o);
                report(rc == AC_OK && memcmp(got.packed, want.packed, want.nbytes) == 0 &&
                           memcmp(got.mins, want.mins, want.ngroups * sizeof(float)) == 0 &&
                           memcmp(got.scales, want.scales, want.ngroups * sizeof(float)) == 0,
                       "api %s: encode differs from the reference (rc=%d)", ctx, rc);
                rc = ac_quant_decode(want.packed, want.mins, want.scales, n, bits, group, AC_F32,
                                     got_f32, &o);
                report(rc == AC_OK && memcmp(got_f32, want_f32, n * sizeof(float)) == 0,
                       "api %s: decode f32 differs (rc=%d)", ctx, rc);
                if (t->dtype != AC_F32) {
                    rc = ac_quant_decode(want.packed, want.mins, want.scales, n, bits, group,
                                         t->dtype, got_dt, &o);
                    report(rc == AC_OK && memcmp(got_dt, want_dt, n * es) == 0,
                           "api %s: decode %s differs (rc=%d)", ctx, dtype_names[t->dtype], rc);
                }
            }
    free(got_dt);
    free(want_dt);
    free(got_f32);
    free(want_f32);
    encoded_free(&got);
    encoded_free(&want);
}

/* Non-finite elements (NaN, inf, or a float64 beyond float32) are reported at the first one;
 * a group whose range overflows float32 at its first element. */
static void api_nonfinite(int dtype, size_t n, size_t group) {
    tensor t = make_tensor(dtype, n);
    const size_t es = dtype_size(dtype);
    encoded e = encoded_new(n, 8, group); /* room for any width */
    const size_t first = rnd() % 4 == 0 ? (rnd() & 1 ? 0 : n - 1) : rnd_below(n);
    const size_t later = first + rnd_below(n - first);
    for (int j = 0; j < 2; j++) {
        const size_t at = j == 0 ? first : later;
        unsigned char *p = t.data + at * es;
        if (dtype == AC_F16) {
            uint16_t h = rnd() & 1 ? 0x7C00 : (uint16_t)(0x7C00 | (1 + rnd_below(0x3FF)));
            h |= (uint16_t)(rnd() & 1 ? 0x8000 : 0);
            memcpy(p, &h, 2);
        } else if (dtype == AC_BF16) {
            uint16_t h = rnd() & 1 ? 0x7F80 : (uint16_t)(0x7F80 | (1 + rnd_below(0x7F)));
            h |= (uint16_t)(rnd() & 1 ? 0x8000 : 0);
            memcpy(p, &h, 2);
        } else if (dtype == AC_F32) {
            float f = u2f(rnd_nonfinite_bits());
            memcpy(p, &f, 4);
        } else {
            double d = rnd() % 3 == 0 ? NAN : rnd() & 1 ? -INFINITY : (rnd() & 1 ? 1e300 : -1e39);
            memcpy(p, &d, 8);
        }
    }
    for (int d = 0; d < n_driver_isas; d++)
        for (int threads = 1; threads <= 2; threads++) {
            const ac_options o = {threads, driver_isas[d], -1};
            size_t bad = 0;
            int rc = ac_quant_encode(t.data, n, dtype, 4, group, (int)(rnd() & 1), 7, e.packed,
                                     e.mins, e.scales, &bad, &o);
            report(rc == AC_ENONFINITE && bad == first,
                   "api isa=%s threads=%d %s n=%zu group=%zu: non-finite at %zu -> rc=%d bad=%zu",
                   ac_isa_name(driver_isas[d]), threads, dtype_names[dtype], n, group, first, rc,
                   bad);
        }
    tensor_free(&t);
    /* Finite values whose group range overflows: the group's first index. */
    if (dtype == AC_F32 || dtype == AC_F64) {
        t = make_tensor(dtype, n);
        const size_t G = group == 0 || group > n ? n : group;
        const size_t g = rnd_below((n + G - 1) / G), gs = g * G, ge = gs + G < n ? gs + G : n;
        const size_t a = gs + rnd_below(ge - gs), b = gs + rnd_below(ge - gs);
        for (int j = 0; j < 2; j++) {
            float v = j == 0 ? 3e38f : -3e38f;
            size_t at = j == 0 ? a : b;
            if (dtype == AC_F32) memcpy(t.data + 4 * at, &v, 4);
            else { double dv = v; memcpy(t.data + 8 * at, &dv, 8); }
        }
        if (a != b)
            for (int d = 0; d < n_driver_isas; d++)
                for (int threads = 1; threads <= 2; threads++) {
                    const ac_options o = {threads, driver_isas[d], -1};
                    size_t bad = 0;
                    int rc = ac_quant_encode(t.data, n, dtype, 8, group, AC_ROUND_NEAREST, 7,
                                             e.packed, e.mins, e.scales, &bad, &o);
                    report(rc == AC_ENONFINITE && bad == gs,
                           "api isa=%s threads=%d %s n=%zu group=%zu: range overflow in group "
                           "at %zu -> rc=%d bad=%zu", ac_isa_name(driver_isas[d]), threads,
                           dtype_names[dtype], n, group, gs, rc, bad);
                }
        tensor_free(&t);
    }
    encoded_free(&e);
}

/* With nearest rounding the encoding of whole groups and 256-code spans does not depend on
 * where the array starts, so a large array split over threads must equal its chunks encoded
 * one by one. Stochastic rounding draws by element index, so there api_roundtrip checks every
 * path against the reference and the error bound on a large array. */
static size_t gcd_size(size_t a, size_t b) { return b ? gcd_size(b, a % b) : a; }

static void large_array_tests(void) {
    const size_t n = ((size_t)17 << 20) / sizeof(float) + 777; /* 17 MiB, odd tail */
    tensor t = make_tensor(AC_F32, n);
    static const size_t groups[] = {32, 256, 300, 1024, 4096};
    static const int bits[] = {1, 2, 8};
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
        for (int b = 0; b < 3; b++) {
            const size_t G = groups[g], unit = G / gcd_size(G, 4096) * 4096; /* lcm(G, 4096) */
            const size_t chunk = (((size_t)4 << 20) / sizeof(float)) / unit * unit;
            encoded whole = encoded_new(n, bits[b], G), parts = encoded_new(n, bits[b], G);
            for (int d = 0; d < n_driver_isas; d++) {
                const ac_options o = {1 + d % 2, driver_isas[d], -1};
                size_t bad = 0;
                int rc = ac_quant_encode(t.data, n, AC_F32, bits[b], G, AC_ROUND_NEAREST, 0,
                                         whole.packed, whole.mins, whole.scales, &bad, &o);
                for (size_t s = 0; rc == AC_OK && s < n; s += chunk) {
                    const size_t m = n - s < chunk ? n - s : chunk;
                    const size_t per = 256 / (size_t)bits[b];
                    rc = ac_quant_encode(t.data + 4 * s, m, AC_F32, bits[b], G, AC_ROUND_NEAREST,
                                         0, parts.packed + s / per * AC_QBLOCK_BYTES,
                                         parts.mins + s / G, parts.scales + s / G, &bad, &o);
                }
                report(rc == AC_OK && memcmp(whole.packed, parts.packed, whole.nbytes) == 0 &&
                           memcmp(whole.mins, parts.mins, whole.ngroups * sizeof(float)) == 0 &&
                           memcmp(whole.scales, parts.scales, whole.ngroups * sizeof(float)) == 0,
                       "large array: isa=%s n=%zu bits=%d group=%zu equals its %zu-element "
                       "chunks (rc=%d)", ac_isa_name(driver_isas[d]), n, bits[b], G, chunk, rc);
            }
            encoded_free(&parts);
            encoded_free(&whole);
        }
    api_roundtrip(&t, 2, 256, AC_ROUND_STOCHASTIC, 0);
    tensor_free(&t);
}

static void api_tests(void) {
    static const size_t groups[] = {32, 33, 256, 1000, 65536, 0};
    static const size_t sizes[] = {0, 1, 255, 257, 4097, 300001};
    encode_arg_tests();
    for (int dtype = AC_F16; dtype <= AC_F64; dtype++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            tensor t = make_tensor(dtype, sizes[s]);
            /* Both code conversions on everything but the largest size, where one suffices:
             * the kernels are checked against each other above. */
            const int full = sizes[s] < 100000;
            for (int b = 0; b < 4; b++)
                for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
                    for (int r = 0; r < 2; r++) api_roundtrip(&t, bits_list[b], groups[g], r, full);
            tensor_free(&t);
        }
    /* Groups below the Python API's minimum of 32: the C API takes them too. */
    static const size_t small_groups[] = {1, 7, 16};
    static const size_t small_sizes[] = {1, 255, 4097, 9000};
    for (size_t s = 0; s < sizeof small_sizes / sizeof small_sizes[0]; s++) {
        tensor t = make_tensor(AC_F32, small_sizes[s]);
        for (int b = 0; b < 4; b++)
            for (size_t g = 0; g < sizeof small_groups / sizeof small_groups[0]; g++)
                api_roundtrip(&t, bits_list[b], small_groups[g], b & 1, 1);
        tensor_free(&t);
    }
    static const size_t bad_sizes[] = {1, 257, 4097, 300001};
    for (int dtype = AC_F16; dtype <= AC_F64; dtype++)
        for (size_t s = 0; s < sizeof bad_sizes / sizeof bad_sizes[0]; s++) {
            api_nonfinite(dtype, bad_sizes[s], 256);
            api_nonfinite(dtype, bad_sizes[s], 0);
        }
    large_array_tests();
}

int main(void) {
    int rc = ac_init();
    report(rc == AC_OK, "ac_init() -> %d", rc);
    printf("cpu features: %s\nbest isa: %s, openmp: %d\n", ac_cpu_features(),
           ac_isa_name(ac_best_isa()), ac_openmp_enabled());
    collect_isas();

    unsigned long long before = n_passed + n_failed;
    minmax_tests();
    quantize_tests();
    groups_tests();
    dequantize_tests();
    pack_tests();
    conversion_tests();
    printf("kernels: %llu cases\n", n_passed + n_failed - before);

    before = n_passed + n_failed;
    const int isa = ac_default_isa(), threads = ac_default_threads();
    api_tests();
    report(ac_default_isa() == isa && ac_default_threads() == threads,
           "per-call options changed no default");
    printf("driver api: %llu cases\n", n_passed + n_failed - before);

    return finish();
}
