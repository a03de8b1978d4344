/* Dynamic k-bit quantization driver: groups, tiles, threads and dtype conversion around the
 * active ISA's float32 kernels. Each thread owns a range of whole 256-code spans (every
 * block size divides 256), so threads write disjoint packed bytes; a group that straddles two
 * ranges has its min/max computed by both (identically: min and max are exact). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "../runtime/kernels.h"
#include "quant_common.h"
#include "../runtime/threads.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* Elements staged per step: codes and converted floats stay in L1/L2. A multiple of 256 and a
 * divisor of 2^32, so no kernel call crosses a 2^32 element-index boundary. */
#define TILE 4096u
#define NONE SIZE_MAX

float ac_uniform(uint64_t seed, uint64_t index) {
    uint32_t key = ac_round_key(seed, (uint32_t)(index >> 32));
    return (float)ac_uniform_bits(key, (uint32_t)index) * AC_U24_SCALE;
}

static int bits_index(int bits) {
    return bits == 1 ? 0 : bits == 2 ? 1 : bits == 4 ? 2 : bits == 8 ? 3 : -1;
}

static size_t dtype_size(int dtype) {
    return dtype == AC_F16 || dtype == AC_BF16 ? 2 : dtype == AC_F32 ? 4 : dtype == AC_F64 ? 8 : 0;
}

size_t ac_quant_packed_nbytes(size_t n, int bits) {
    if (bits_index(bits) < 0) return 0;
    size_t per = 256 / (size_t)bits, rem = n % per;
    return n / per * AC_QBLOCK_BYTES + (rem < AC_QBLOCK_BYTES ? rem : AC_QBLOCK_BYTES);
}

size_t ac_quant_ngroups(size_t n, size_t group) {
    if (n == 0) return 0;
    if (group == 0 || group >= n) return 1;
    return n / group + (n % group != 0);
}

typedef struct {
    const ac_kernels *k;
    const unsigned char *src; /* encode input or decode output, dtype elements */
    size_t n, es, group;
    int dtype, bits, rounding, trick;
    uint64_t seed;
    uint8_t *packed;
    float *mins, *scales;
    int fixed;           /* per-tensor mode: stats precomputed in fixed_mn/fixed_mx */
    float fixed_mn, fixed_mx;
    size_t tile;         /* encode's step: a power of two dividing TILE (encode_tile) */
} job;

/* Elements [s, e) as float32: the input itself when it is float32, else converted into buf. */
static const float *as_f32(const job *j, size_t s, size_t e, float *buf) {
    if (j->dtype == AC_F32) return (const float *)(j->src + s * 4);
    j->k->to_f32[j->dtype](j->src + s * j->es, e - s, buf);
    return buf;
}

/* First index in x[0, n) that is NaN or inf. */
static size_t first_nonfinite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return n;
}

/* Codes by division, for groups whose scale is so small (below ~2.9e-39) that 1 / scale
 * overflows: rare, so one portable loop serves every ISA and the results stay identical. */
static void quantize_divide(const float *x, size_t n, float mn, float scale, uint32_t levels,
                            int rounding, uint32_t key, uint32_t idx0, uint8_t *codes) {
    for (size_t i = 0; i < n; i++) {
        float t = (x[i] - mn) / scale;
        if (rounding == AC_ROUND_STOCHASTIC)
            t = floorf(t + (float)ac_uniform_bits(key, idx0 + (uint32_t)i) * AC_U24_SCALE);
        else
            t = rintf(t);
        codes[i] = (uint8_t)(t < (float)levels ? t : (float)levels);
    }
}

/* Min and max over [s, e), tile by tile; NONE, or the first bad index. */
static size_t range_minmax(const job *j, size_t s, size_t e, float *buf, float *mn, float *mx) {
    for (size_t t = s; t < e; t += TILE) {
        size_t te = e - t < TILE ? e : t + TILE;
        const float *x = as_f32(j, t, te, buf);
        float a, b;
        if (j->k->minmax(x, te - t, &a, &b)) return t + first_nonfinite(x, te - t);
        if (t == s || a < *mn) *mn = a;
        if (t == s || b > *mx) *mx = b;
    }
    /* Which zero a min/max of mixed -0.0/+0.0 returns depends on the evaluation order; adding
     * +0.0 makes it +0.0 on every path without changing any decoded value. */
    *mn += 0.0f;
    *mx += 0.0f;
    return NONE;
}

/* A group's scale (step between codes) from its min and max, and 1 / scale in *inv (0 for a
 * constant group, inf when the scale is too small to invert: the callers then divide). */
static inline float group_scale(float lo, float hi, uint32_t levels, float *inv) {
    float scale = (hi - lo) / (float)levels;
    *inv = scale > 0 ? 1.0f / scale : 0.0f;
    return scale;
}

/* Whether every tile holds whole groups of G (the array's last may be short): G divides the
 * tile, and tiles start on multiples of it, so the group kernels can take a tile at once. */
static inline int tiles_hold_whole_groups(size_t G, size_t tile) {
    return G <= tile && tile % G == 0;
}

/* Encode reads each tile twice: from memory for the min/max, then from L1 for the codes.
 * While the codes are computed no new lines are requested and the prefetcher's stream
 * pauses; short tiles keep those pauses short. Input under half a typical L3 is usually
 * still cached from the op that wrote it, where long tiles cost fewer calls. The tile never
 * changes the bytes written (codes and keys depend on element indices only). */
#define SHORT_TILE 512u
#define SHORT_TILES_FROM ((size_t)16 << 20)

static size_t encode_tile(size_t nbytes, size_t group) {
    if (nbytes < SHORT_TILES_FROM) return TILE;
    if (group <= SHORT_TILE) return SHORT_TILE;
    return tiles_hold_whole_groups(group, TILE) ? group : TILE;
}

/* Groups under 32 elements (the C API takes them; Python's does not) take the per-group path
 * in encode, which bounds the stack arrays below. */
#define GROUP_MIN_TILED 32u
#define GROUPS_PER_TILE_MAX (TILE / GROUP_MIN_TILED)

/* Encodes tile [ts, te) (x: its float32 elements) through the group kernels: every min/max,
 * then every scale, then every code. Returns 0, with nothing written, when the tile needs the
 * per-group path: a group size that does not divide the tile, the per-tensor mode, a NaN/inf
 * (whose index that path finds), a range that overflows, or a scale too small to invert. */
static int tile_of_groups(const job *j, size_t ts, size_t te, const float *x, uint32_t levels,
                          uint32_t key, uint8_t *codes) {
    size_t G = j->group, nt = te - ts;
    if (j->fixed || G < GROUP_MIN_TILED || !tiles_hold_whole_groups(G, j->tile)) return 0;
    size_t g0 = ts / G, ng = (nt + G - 1) / G;
    float lo[GROUPS_PER_TILE_MAX], hi[GROUPS_PER_TILE_MAX];
    float scale[GROUPS_PER_TILE_MAX], inv[GROUPS_PER_TILE_MAX];
    if (j->k->minmax_groups(x, nt, G, lo, hi)) return 0;
    for (size_t g = 0; g < ng; g++) {
        lo[g] += 0.0f; /* one zero on every path, as in range_minmax */
        hi[g] += 0.0f;
        scale[g] = group_scale(lo[g], hi[g], levels, &inv[g]);
        if (!isfinite(scale[g]) || isinf(inv[g])) return 0;
    }
    memcpy(j->mins + g0, lo, ng * sizeof *lo);
    memcpy(j->scales + g0, scale, ng * sizeof *scale);
    j->k->quantize_groups[j->trick][j->rounding](x, nt, G, lo, inv, levels, key, (uint32_t)ts,
                                                  codes);
    return 1;
}

/* Encodes elements [a, b) (a on a 256-code boundary). Returns NONE or the first bad index. */
static size_t encode_range(const job *j, size_t a, size_t b) {
    const ac_kernels *k = j->k;
    float fbuf[TILE], sbuf[TILE];
    uint8_t codes[TILE];
    uint32_t levels = (1u << j->bits) - 1u;
    size_t per = 256 / (size_t)j->bits, g_cur = NONE, G = j->group;
    float mn = 0, inv = 0, scale = 0;
    for (size_t ts = a; ts < b; ts += j->tile) {
        size_t te = b - ts < j->tile ? b : ts + j->tile;
        const float *x = as_f32(j, ts, te, fbuf);
        /* At 8 bits the unified layout is the identity: codes go straight to their bytes. */
        uint8_t *cbuf = j->bits == 8 ? j->packed + ts : codes;
        /* Tiles start on multiples of the tile, which divides 2^32: one key serves the tile. */
        uint32_t key = ac_round_key(j->seed, (uint32_t)((uint64_t)ts >> 32));
        size_t s = ts;
        if (tile_of_groups(j, ts, te, x, levels, key, cbuf)) s = te;
        for (; s < te;) {
            size_t g = s / G, gs = g * G, ge = j->n - gs < G ? j->n : gs + G;
            size_t e = ge < te ? ge : te;
            if (g != g_cur) {
                float lo = j->fixed_mn, hi = j->fixed_mx;
                if (!j->fixed) {
                    size_t bad = range_minmax(j, gs, ge, sbuf, &lo, &hi);
                    if (bad != NONE) return bad;
                }
                scale = group_scale(lo, hi, levels, &inv);
                if (!isfinite(scale)) return gs; /* the range overflows float32 */
                mn = lo;
                if (gs >= a) { /* the range holding a group's first element writes its stats */
                    j->mins[g] = lo;
                    j->scales[g] = scale;
                }
                g_cur = g;
            }
            if (isinf(inv))
                quantize_divide(x + (s - ts), e - s, mn, scale, levels, j->rounding, key,
                                (uint32_t)s, cbuf + (s - ts));
            else
                k->quantize[j->trick][j->rounding](x + (s - ts), e - s, mn, inv, levels, key,
                                                   (uint32_t)s, cbuf + (s - ts));
            s = e;
        }
        if (j->bits == 8) continue;
        size_t nt = te - ts, full = nt / per, rem = nt % per;
        uint8_t *out = j->packed + ts / per * AC_QBLOCK_BYTES;
        k->pack[bits_index(j->bits)](codes, full, out);
        if (rem) { /* the tensor's last, partial block: pack padded, keep min(rem, 32) bytes */
            uint8_t c[256] = {0}, p[AC_QBLOCK_BYTES];
            memcpy(c, codes + full * per, rem);
            k->pack[bits_index(j->bits)](c, 1, p);
            memcpy(out + full * AC_QBLOCK_BYTES, p, rem < AC_QBLOCK_BYTES ? rem : AC_QBLOCK_BYTES);
        }
    }
    return NONE;
}

/* Decodes elements [a, b) into j->src (the output). */
static void decode_range(const job *j, size_t a, size_t b, int out_dtype) {
    const ac_kernels *k = j->k;
    float fbuf[TILE];
    uint8_t codes[TILE];
    size_t per = 256 / (size_t)j->bits, G = j->group, oes = dtype_size(out_dtype);
    unsigned char *dst = (unsigned char *)j->src;
    for (size_t ts = a; ts < b; ts += TILE) {
        size_t te = b - ts < TILE ? b : ts + TILE;
        size_t nt = te - ts, full = nt / per, rem = nt % per;
        const uint8_t *in = j->packed + ts / per * AC_QBLOCK_BYTES;
        const uint8_t *cbuf = j->bits == 8 ? j->packed + ts : codes; /* identity layout */
        if (j->bits != 8) k->unpack[bits_index(j->bits)](in, full, codes);
        if (rem && j->bits != 8) {
            uint8_t p[AC_QBLOCK_BYTES] = {0}, c[256];
            memcpy(p, in + full * AC_QBLOCK_BYTES, rem < AC_QBLOCK_BYTES ? rem : AC_QBLOCK_BYTES);
            k->unpack[bits_index(j->bits)](p, 1, c);
            memcpy(codes + full * per, c, rem);
        }
        float *y = out_dtype == AC_F32 ? (float *)(dst + ts * 4) : fbuf;
        size_t s = ts;
        if (tiles_hold_whole_groups(G, TILE)) { /* one call for the tile */
            k->dequantize_groups[j->trick](cbuf, nt, G, j->mins + ts / G, j->scales + ts / G, y);
            s = te;
        }
        for (; s < te;) {
            size_t g = s / G, ge = j->n - g * G < G ? j->n : g * G + G;
            size_t e = ge < te ? ge : te;
            k->dequantize[j->trick](cbuf + (s - ts), e - s, j->mins[g], j->scales[g], y + (s - ts));
            s = e;
        }
        if (out_dtype != AC_F32) k->from_f32[out_dtype](fbuf, nt, dst + ts * oes);
    }
}

/* Thread ranges: whole tiles, so every range starts on a 256-code boundary. */
static size_t range_size(size_t n, int threads) {
    size_t per = (n + (size_t)threads - 1) / (size_t)threads;
    return (per + TILE - 1) / TILE * TILE;
}

static int check_args(size_t n, int dtype, int bits, size_t group) {
    if (dtype_size(dtype) == 0 || bits_index(bits) < 0) return AC_EINVAL;
    if (n > SIZE_MAX / 16) return AC_EINVAL;
    (void)group;
    return AC_OK;
}

/* Min and max of all j->n elements over `threads` threads (the per-tensor pass). */
static int minmax_parallel(const job *j, int threads, float *mn, float *mx, size_t *bad_index) {
    float lo[64], hi[64];
    size_t badt[64], bad = NONE, n = j->n;
    if (threads > 64) threads = 64;
    size_t span = range_size(n, threads);
#ifdef _OPENMP
#pragma omp parallel for schedule(static, 1) num_threads(threads) if (threads > 1)
#endif
    for (int t = 0; t < threads; t++) {
        float buf[TILE];
        size_t a = (size_t)t * span, b = a + span < n ? a + span : n;
        badt[t] = a < b ? range_minmax(j, a, b, buf, &lo[t], &hi[t]) : NONE;
        if (a >= b) lo[t] = hi[t] = NAN; /* empty range: skipped below */
    }
    for (int t = 0; t < threads; t++) {
        if (badt[t] < bad) bad = badt[t];
        if (isnan(lo[t])) continue;
        if (t == 0 || lo[t] < *mn) *mn = lo[t];
        if (t == 0 || hi[t] > *mx) *mx = hi[t];
    }
    if (bad != NONE) { *bad_index = bad; return AC_ENONFINITE; }
    return AC_OK;
}

int ac_minmax(const void *src, size_t n, int dtype, float *mn, float *mx, size_t *bad_index,
              const ac_options *opt) {
    if (dtype_size(dtype) == 0 || n > SIZE_MAX / 16 || mn == NULL || mx == NULL ||
        bad_index == NULL || (n > 0 && src == NULL))
        return AC_EINVAL;
    ac_call call;
    int status = ac_call_from(opt, &call);
    if (status != AC_OK) return status;
    *bad_index = NONE;
    if (n == 0) return AC_EINVAL;
    job j = {call.k, src, n, dtype_size(dtype), n, dtype, 8, 0, 0, 0, NULL, NULL, NULL, 0, 0, 0, TILE};
    size_t ntiles = n / TILE + (n % TILE != 0);
    return minmax_parallel(&j, ac_threads_for(call.threads, n * j.es, ntiles), mn, mx, bad_index);
}

int ac_quant_encode(const void *src, size_t n, int dtype, int bits, size_t group, int rounding,
                    uint64_t seed, uint8_t *packed, float *mins, float *scales,
                    size_t *bad_index, const ac_options *opt) {
    if (check_args(n, dtype, bits, group) != AC_OK || bad_index == NULL ||
        (rounding != AC_ROUND_NEAREST && rounding != AC_ROUND_STOCHASTIC))
        return AC_EINVAL;
    ac_call call;
    int status = ac_call_from(opt, &call);
    if (status != AC_OK) return status;
    *bad_index = NONE;
    if (n == 0) return AC_OK;
    if (src == NULL || packed == NULL || mins == NULL || scales == NULL) return AC_EINVAL;
    job j = {call.k, src, n, dtype_size(dtype), group == 0 || group > n ? n : group,
             dtype, bits, rounding, call.trick, seed, packed, mins, scales, 0, 0, 0, TILE};
    j.tile = encode_tile(n * j.es, j.group);
    size_t ntiles = n / TILE + (n % TILE != 0);
    int threads = ac_threads_for(call.threads, n * j.es, ntiles);
    size_t span = range_size(n, threads), bad = NONE;
    if (j.group == n) { /* per tensor: one min/max pass over all threads, then quantize */
        status = minmax_parallel(&j, threads, &j.fixed_mn, &j.fixed_mx, bad_index);
        if (status != AC_OK) return status;
        j.fixed = 1;
    }
    size_t nranges = (n + span - 1) / span;
    size_t *badr = malloc(nranges * sizeof *badr);
    if (badr == NULL) return AC_ENOMEM;
#ifdef _OPENMP
#pragma omp parallel for schedule(static, 1) num_threads(threads) if (threads > 1)
#endif
    for (long long r = 0; r < (long long)nranges; r++) {
        size_t a = (size_t)r * span, b = a + span < n ? a + span : n;
        badr[r] = encode_range(&j, a, b);
    }
    for (size_t r = 0; r < nranges; r++)
        if (badr[r] < bad) bad = badr[r];
    free(badr);
    if (bad != NONE) { *bad_index = bad; return AC_ENONFINITE; }
    return AC_OK;
}

int ac_quant_decode(const uint8_t *packed, const float *mins, const float *scales, size_t n,
                    int bits, size_t group, int out_dtype, void *dst, const ac_options *opt) {
    if (check_args(n, out_dtype, bits, group) != AC_OK) return AC_EINVAL;
    ac_call call;
    int status = ac_call_from(opt, &call);
    if (status != AC_OK) return status;
    if (n == 0) return AC_OK;
    if (packed == NULL || mins == NULL || scales == NULL || dst == NULL) return AC_EINVAL;
    job j = {call.k, dst, n, dtype_size(out_dtype), group == 0 || group > n ? n : group,
             out_dtype, bits, 0, call.trick, 0, (uint8_t *)packed, (float *)mins,
             (float *)scales, 0, 0, 0, TILE};
    size_t ntiles = n / TILE + (n % TILE != 0);
    int threads = ac_threads_for(call.threads, n * j.es, ntiles);
    size_t span = range_size(n, threads), nranges = (n + span - 1) / span;
#ifdef _OPENMP
#pragma omp parallel for schedule(static, 1) num_threads(threads) if (threads > 1)
#endif
    for (long long r = 0; r < (long long)nranges; r++) {
        size_t a = (size_t)r * span, b = a + span < n ? a + span : n;
        decode_range(&j, a, b, out_dtype);
    }
    return AC_OK;
}
