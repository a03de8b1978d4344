# Declarations of the pure-C core (csrc/actcodec.h).
from libc.stdint cimport uint8_t, uint64_t

cdef extern from "actcodec.h" nogil:
    enum:
        AC_OK
        AC_EINVAL
        AC_ECORRUPT
        AC_ENOMEM
        AC_EUNSUPPORTED
        AC_ENONFINITE
        AC_ISA_COUNT
        AC_ISA_DEFAULT
    ctypedef struct ac_options:
        int threads
        int isa
        int bittrick
    int ac_init()
    const char *ac_isa_name(int isa)
    int ac_isa_from_name(const char *name)
    int ac_isa_available(int isa)
    int ac_best_isa()
    const char *ac_cpu_features()
    int ac_openmp_enabled()
    int ac_default_isa()
    int ac_set_default_isa(int isa)
    int ac_default_threads()
    int ac_set_default_threads(int n)
    size_t ac_bitmap_nbytes(size_t n)
    int ac_bitmap_encode(const void *src, size_t n, int esize, uint64_t prune_abs_bits,
                         uint8_t *bitmap, void *values, size_t *nnz, const ac_options *opt)
    int ac_bitmap_count(const uint8_t *bitmap, size_t n, size_t *nnz, const ac_options *opt)
    int ac_bitmap_decode(const uint8_t *bitmap, const void *values, size_t nnz, size_t n,
                         int esize, void *dst, const ac_options *opt)
    int ac_mask_encode(const void *src, size_t n, int esize, uint8_t *bitmap, void *value,
                       size_t *nnz, int *one_value, const ac_options *opt)
    int ac_mask_decode(const uint8_t *bitmap, size_t n, const void *value, int esize, void *dst,
                       const ac_options *opt)
    int ac_sample_nonzero(const void *src, size_t n, int esize, size_t runs, size_t run_len,
                          uint64_t *nnz, uint64_t *sumsq, int *one_value)
    double ac_nonzero_share_floor(const void *src, size_t n, int esize, int *one_value)
    size_t ac_quant_packed_nbytes(size_t n, int bits)
    size_t ac_quant_ngroups(size_t n, size_t group)
    int ac_quant_encode(const void *src, size_t n, int dtype, int bits, size_t group,
                        int rounding, uint64_t seed, uint8_t *packed, float *mins,
                        float *scales, size_t *bad_index, const ac_options *opt)
    int ac_quant_decode(const uint8_t *packed, const float *mins, const float *scales,
                        size_t n, int bits, size_t group, int out_dtype, void *dst,
                        const ac_options *opt)
    int ac_minmax(const void *src, size_t n, int dtype, float *mn, float *mx, size_t *bad_index,
                  const ac_options *opt)
    float ac_uniform(uint64_t seed, uint64_t index)
    uint64_t ac_checksum64(const void *data, size_t nbytes, uint64_t seed)


cdef inline int _check(int status, str what) except -1:
    """Turn a C status into the Python exception a caller can act on."""
    if status == AC_OK:
        return 0
    if status == AC_ECORRUPT:
        raise ValueError(f"{what}: corrupted encoding (bitmap count or padding bits do not match)")
    if status == AC_ENOMEM:
        raise MemoryError(f"{what}: out of memory")
    if status == AC_EUNSUPPORTED:
        raise ValueError(f"{what}: instruction set not available on this CPU")
    raise ValueError(f"{what}: invalid argument (status {status})")


cdef inline ac_options _opts(int threads, int isa, int bittrick) noexcept:
    cdef ac_options o
    o.threads = threads
    o.isa = isa
    o.bittrick = bittrick
    return o


cdef inline const uint8_t *_cptr(const uint8_t[::1] m) noexcept:
    return NULL if m.shape[0] == 0 else &m[0]


cdef inline uint8_t *_wptr(uint8_t[::1] m) noexcept:
    return NULL if m.shape[0] == 0 else &m[0]
