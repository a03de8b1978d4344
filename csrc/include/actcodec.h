/* actcodec public C API: activation-compression codecs with run-time SIMD dispatch.
 * Pure C99/C11, no Python headers. Every function checks its lengths and returns an
 * ac_status; nothing aborts the process. */
#ifndef ACTCODEC_H
#define ACTCODEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    AC_OK = 0,
    AC_EINVAL = -1,       /* a bad argument (size, element width, parameter) */
    AC_ECORRUPT = -2,     /* encoded data is inconsistent (popcount, padding bits) */
    AC_ENOMEM = -3,       /* scratch allocation failed */
    AC_EUNSUPPORTED = -4, /* requested ISA is not available on this CPU/build */
    AC_ENONFINITE = -5    /* quantization input holds NaN/inf (or a float32 range overflow) */
} ac_status;

/* Element types; the values are the container format's dtype ids. */
typedef enum { AC_F16 = 1, AC_BF16 = 2, AC_F32 = 3, AC_F64 = 4 } ac_dtype;

/* Instruction-set paths, in order of preference within an architecture. */
typedef enum {
    AC_ISA_DEFAULT = -1,  /* in ac_options: the process default */
    AC_ISA_SCALAR = 0,
    AC_ISA_SSE2 = 1,
    AC_ISA_AVX2 = 2,
    AC_ISA_NEON = 3,
    AC_ISA_COUNT = 4
} ac_isa;

/* Settings of one call. Every function that runs kernels takes one; NULL means
 * AC_OPTIONS_DEFAULT. Nothing a call is given outlives it or changes another call. */
typedef struct {
    int threads;  /* 1..1024, or 0: the process default (ac_default_threads) */
    int isa;      /* an available ac_isa, or AC_ISA_DEFAULT (ac_default_isa) */
    int bittrick; /* quantization's code <-> float conversion: 1 DAF's bit trick, 0 casts,
                   * -1 the path's default (the trick on scalar, where rint is a libm call;
                   * casts elsewhere). Both give identical bytes. */
} ac_options;
#define AC_OPTIONS_DEFAULT {0, AC_ISA_DEFAULT, -1}

/* ---- dispatch and defaults (dispatch.c, threads.c) ---- */

/* Reads ACTCODEC_SIMD and ACTCODEC_NUM_THREADS once. Returns AC_EINVAL for an unknown
 * ACTCODEC_SIMD name, AC_EUNSUPPORTED for a path this CPU lacks (the default path then stays
 * the best available). Safe to call more than once; later calls return the first result. */
int ac_init(void);
const char *ac_isa_name(int isa);       /* "scalar", "sse2", "avx2", "neon"; NULL if out of range */
int ac_isa_from_name(const char *name); /* -1 if unknown */
int ac_isa_available(int isa);          /* compiled in and supported by this CPU */
int ac_best_isa(void);
/* Human-readable CPU feature list, e.g. "sse2 ssse3 sse4.1 avx avx2 popcnt bmi2". */
const char *ac_cpu_features(void);
int ac_openmp_enabled(void);            /* 1 if built with OpenMP */

/* The process defaults, used where a call's options say 0 / AC_ISA_DEFAULT. */
int ac_default_isa(void);               /* ACTCODEC_SIMD, else the best available */
int ac_set_default_isa(int isa);        /* AC_EUNSUPPORTED if not available */
int ac_default_threads(void);           /* ACTCODEC_NUM_THREADS, else the cores */
int ac_set_default_threads(int n);      /* n in 1..1024; AC_EINVAL otherwise */

/* ---- sparse bitmap codec (bitmap.c) ----
 * Element i is "nonzero" iff its bit pattern is not all zero bits (so -0.0 and NaNs are kept
 * bit-exact). Bitmap bit i lives in byte i/8 at bit position i%8 (LSB first); padding bits
 * after element n-1 are zero. Values: the nonzero elements in order, packed densely. */
size_t ac_bitmap_nbytes(size_t n);      /* (n + 7) / 8 */

/* src: n elements of esize (2, 4 or 8) bytes. prune_abs_bits: 0 = lossless; otherwise the
 * element is stored as zero when (bits & ~sign_bit) < prune_abs_bits (|x| < t for floats,
 * where prune_abs_bits is the bit pattern of the smallest representable value >= t).
 * bitmap: ac_bitmap_nbytes(n) bytes. values: room for n elements. *nnz receives the count. */
int ac_bitmap_encode(const void *src, size_t n, int esize, uint64_t prune_abs_bits,
                     uint8_t *bitmap, void *values, size_t *nnz, const ac_options *opt);

/* Counts set bits of a bitmap of n elements; AC_ECORRUPT if a padding bit is set. */
int ac_bitmap_count(const uint8_t *bitmap, size_t n, size_t *nnz, const ac_options *opt);

/* Inverse of encode. Checks that the bitmap has exactly nnz set bits and zero padding
 * (AC_ECORRUPT otherwise, dst untouched), so it never reads past values[nnz). */
int ac_bitmap_decode(const uint8_t *bitmap, const void *values, size_t nnz, size_t n,
                     int esize, void *dst, const ac_options *opt);

/* A mask: a tensor whose nonzero elements all have one bit pattern, stored as its bitmap and
 * that value. Encode makes the bitmap of n elements of esize (1, 2, 4 or 8) bytes in one pass
 * and sets *one_value to 1 when every nonzero element equals the first (whose bytes then go
 * to value; zero bytes when there is none), else 0 (the bitmap is still right, value is
 * not). The nonzero elements are compared block by block and never stored. */
int ac_mask_encode(const void *src, size_t n, int esize, uint8_t *bitmap, void *value,
                   size_t *nnz, int *one_value, const ac_options *opt);
/* Decode: element i is `value` where bitmap bit i is set, zero bits elsewhere. AC_ECORRUPT
 * (dst untouched) if a padding bit is set. */
int ac_mask_decode(const uint8_t *bitmap, size_t n, const void *value, int esize, void *dst,
                   const ac_options *opt);

/* ---- sampled density (sample.c) ----
 * Reads `runs` runs of run_len elements (needs runs * run_len <= n): with stride = n / runs,
 * run r starts at r * stride + ac_sample_mix(r) % (stride - run_len + 1). *nnz: nonzero bit
 * patterns in the sample; *sumsq: the sum over runs of (nonzero count of the run)^2;
 * *one_value: 1 if the sample holds a nonzero element and all its nonzero elements have one
 * bit pattern (a mask, perhaps), else 0. Scalar and single-threaded: a sample is a few KiB. */
uint64_t ac_sample_mix(uint64_t x);
int ac_sample_nonzero(const void *src, size_t n, int esize, size_t runs, size_t run_len,
                      uint64_t *nnz, uint64_t *sumsq, int *one_value);
/* A lower bound on the share of nonzero elements, from 64 runs of 64: the sample's share
 * minus five standard errors (runs as the unit, since neighbours are alike) and one run's
 * worth; 0 when that is not positive or n < 4096. *one_value (may be NULL) as above. */
double ac_nonzero_share_floor(const void *src, size_t n, int esize, int *one_value);

/* ---- dynamic k-bit quantization (quant.c) ----
 * Groups of `group` consecutive elements (the last may be short; group >= n means one group
 * for the whole tensor). Per group, in float32: mn = min, mx = max (a zero extreme counts as
 * +0.0), scale = (mx - mn) / L with L = 2^bits - 1, inv = scale > 0 ? 1 / scale : 0,
 * t = (x - mn) * inv, and
 *   nearest:    code = min(rint(t), L)                 (ties to even)
 *   stochastic: code = min(floor(t + u), L)            u = ac_uniform(seed, element index)
 * (where 1 / scale overflows, i.e. scale < ~2.9e-39, t = (x - mn) / scale instead).
 * Decoding gives mn + (float)code * scale (a multiply then an add, never fused).
 * float16/bfloat16/float64 input is converted to float32 first (float64 rounds to nearest).
 * Codes are packed in the unified layout: blocks of AC_QBLOCK_BYTES bytes; block b holds
 * codes [b*P, (b+1)*P) with P = 8 * AC_QBLOCK_BYTES / bits, byte j holding codes j + i*32 at
 * bit offset bits*i. A last partial block of m codes takes min(m, 32) bytes. */
#define AC_QBLOCK_BYTES 32
typedef enum { AC_ROUND_NEAREST = 0, AC_ROUND_STOCHASTIC = 1 } ac_rounding;

size_t ac_quant_packed_nbytes(size_t n, int bits);
size_t ac_quant_ngroups(size_t n, size_t group);
/* mins/scales: ac_quant_ngroups(n, group) floats each. On AC_ENONFINITE, *bad_index is the
 * first element that is NaN/inf (after conversion to float32) or whose group range overflows. */
int ac_quant_encode(const void *src, size_t n, int dtype, int bits, size_t group, int rounding,
                    uint64_t seed, uint8_t *packed, float *mins, float *scales,
                    size_t *bad_index, const ac_options *opt);
int ac_quant_decode(const uint8_t *packed, const float *mins, const float *scales, size_t n,
                    int bits, size_t group, int out_dtype, void *dst, const ac_options *opt);
/* Min and max (as float32; a zero extreme as +0.0) of n >= 1 elements: the pass the
 * per-tensor mode runs. AC_ENONFINITE with *bad_index at the first NaN/inf. */
int ac_minmax(const void *src, size_t n, int dtype, float *mn, float *mx, size_t *bad_index,
              const ac_options *opt);
/* The stochastic-rounding uniform draw in [0, 1) (24 bits), for references and other backends. */
float ac_uniform(uint64_t seed, uint64_t index);

/* ---- the activation store (store.c) ----
 * Memory the library maps itself for what a training step keeps from its forward pass to its
 * backward (or, opted in, for torch's large tensors), so that those lifetimes never fragment
 * the process's heap. Address space is reserved a region at a time (`reserve_bytes`; 0: 32 GiB
 * on 64-bit systems, less where the system refuses that much; a larger block gets a region of
 * its own) and pages become resident when a block first reaches them. A block is a run of
 * whole 4 KiB pages. The first region records each step (a period between resets): at a
 * reset it plans where each block of the step just ended goes next time, largest first around
 * what is still live (store_plan.c), and a repeated step's requests, matched by size in order,
 * land there, so the step fits its peak of simultaneous use; a request the plan does not
 * know goes first-fit above the plan. A reset gives back the pages above what the plan and
 * the live blocks need. Thread-safe; blocks are not zeroed. */
typedef struct ac_store ac_store;
typedef struct {
    size_t reserved_bytes;  /* address space of the regions */
    size_t mapped_bytes;    /* pages that may be resident: reached by a block, not given back */
    size_t used_bytes;      /* the pages of live blocks */
    size_t peak_used_bytes; /* the most used_bytes since the store began or the last reset */
    size_t blocks, regions;
} ac_store_usage;
ac_store *ac_store_new(size_t reserve_bytes);      /* NULL if out of memory */
void ac_store_delete(ac_store *s);                 /* unmaps everything, live blocks too */
void *ac_store_alloc(ac_store *s, size_t nbytes);  /* page-aligned; NULL for 0 bytes or no memory */
int ac_store_release(ac_store *s, void *p);        /* AC_EINVAL if p is no live block's start */
/* Keeps the first nbytes of the block at p (at least one page) and gives the rest back;
 * returns the bytes it now holds (0 if p is no live block's start). */
size_t ac_store_shrink(ac_store *s, void *p, size_t nbytes);
void ac_store_stats(ac_store *s, ac_store_usage *out);
/* Ends a step (a period): plans the next from it, gives back the pages neither the plan nor a
 * live block needs, and starts a new peak at the current use. */
void ac_store_reset_peak(ac_store *s);
/* Gives back every free page, those below live blocks too (a reset gives back only the pages
 * above what the plan and the live blocks need), keeping them usable: a block that reaches
 * one later faults it in again. Returns the bytes given back (0 where the system has no way
 * to give pages back in place: Windows). */
size_t ac_store_give_back_free(ac_store *s);
/* peak_used_bytes starts again from used_bytes (a moment's peak), nothing else changes */
void ac_store_restart_peak(ac_store *s);
/* Ends a period without a plan for the next and without giving pages back: the next period's
 * requests go first fit over the pages held (a period larger than the last, which the plan of
 * the smaller one would only send above itself). */
void ac_store_forget_plan(ac_store *s);

/* ---- utilities ---- */
/* Fast 64-bit checksum of a byte string (container format). Same value on every platform. */
uint64_t ac_checksum64(const void *data, size_t nbytes, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif
