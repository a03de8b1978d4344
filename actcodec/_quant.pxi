# Bindings for dynamic k-bit quantization (csrc/quant*.c). Buffers are flat byte views the
# caller allocates; parameter and shape checks live in actcodec/quant.py.
from libc.stdint cimport SIZE_MAX


class NonFiniteError(ValueError):
    """Quantization met NaN/inf (or a group range beyond float32); .index is the first one."""

    def __init__(self, index):
        self.index = index
        super().__init__(
            f"element {index} is NaN/inf or outside the float32 range (or its group's range "
            f"overflows float32); quantization needs finite input. Pass nonfinite='keep' to "
            f"store such elements exactly beside the codes.")


def quant_packed_nbytes(size_t n, int bits):
    return ac_quant_packed_nbytes(n, bits)


def quant_ngroups(size_t n, size_t group):
    return ac_quant_ngroups(n, group)


cdef int _quant_sizes(size_t n, int bits, size_t group, const uint8_t[::1] packed,
                      const float[::1] mins, const float[::1] scales, str what) except -1:
    cdef size_t ng = ac_quant_ngroups(n, group)
    if <size_t>packed.shape[0] != ac_quant_packed_nbytes(n, bits):
        raise ValueError(f"{what}: packed codes have {packed.shape[0]} bytes, "
                         f"{ac_quant_packed_nbytes(n, bits)} expected")
    if <size_t>mins.shape[0] != ng or <size_t>scales.shape[0] != ng:
        raise ValueError(f"{what}: {ng} groups need {ng} mins and scales, got {mins.shape[0]} "
                         f"and {scales.shape[0]}")
    return 0


def quant_encode(const uint8_t[::1] src, int dtype_id, int esize, int bits, size_t group,
                 int rounding, uint64_t seed, uint8_t[::1] packed, float[::1] mins,
                 float[::1] scales, int threads=0, int isa=-1, int bittrick=-1):
    """Quantize into `packed`, `mins` and `scales`, sized exactly for the input."""
    if esize not in (2, 4, 8) or src.shape[0] % esize:
        raise ValueError("quant_encode: buffer is not a whole number of elements")
    cdef size_t n = src.shape[0] // esize
    _quant_sizes(n, bits, group, packed, mins, scales, "quant_encode")
    cdef const uint8_t *s = _cptr(src)
    cdef uint8_t *p = _wptr(packed)
    cdef float *mn = NULL if mins.shape[0] == 0 else &mins[0]
    cdef float *sc = NULL if scales.shape[0] == 0 else &scales[0]
    cdef size_t bad = SIZE_MAX
    cdef int status
    cdef ac_options o = _opts(threads, isa, bittrick)
    with nogil:
        status = ac_quant_encode(s, n, dtype_id, bits, group, rounding, seed, p, mn, sc, &bad,
                                 &o)
    if status == AC_ENONFINITE:
        raise NonFiniteError(bad)
    _check(status, "quant encode")


def quant_decode(const uint8_t[::1] packed, const float[::1] mins, const float[::1] scales,
                 int bits, size_t group, int out_dtype_id, int out_esize, uint8_t[::1] out,
                 int threads=0, int isa=-1, int bittrick=-1):
    """Decode into `out`, a flat writable byte view of n * out_esize bytes."""
    if out_esize not in (2, 4, 8) or out.shape[0] % out_esize:
        raise ValueError("quant_decode: output is not a whole number of elements")
    cdef size_t n = out.shape[0] // out_esize
    _quant_sizes(n, bits, group, packed, mins, scales, "quant_decode")
    cdef const uint8_t *p = _cptr(packed)
    cdef const float *mn = NULL if mins.shape[0] == 0 else &mins[0]
    cdef const float *sc = NULL if scales.shape[0] == 0 else &scales[0]
    cdef uint8_t *d = _wptr(out)
    cdef int status
    cdef ac_options o = _opts(threads, isa, bittrick)
    with nogil:
        status = ac_quant_decode(p, mn, sc, n, bits, group, out_dtype_id, d, &o)
    _check(status, "quant decode")


def minmax(const uint8_t[::1] src, int dtype_id, int esize, int threads=0, int isa=-1):
    """(min, max) as float32 values; NonFiniteError on NaN/inf."""
    if src.shape[0] == 0 or esize not in (2, 4, 8) or src.shape[0] % esize:
        raise ValueError("minmax needs a non-empty buffer of whole elements")
    cdef size_t n = src.shape[0] // esize
    cdef float mn = 0, mx = 0
    cdef size_t bad = SIZE_MAX
    cdef const uint8_t *s = _cptr(src)
    cdef int status
    cdef ac_options o = _opts(threads, isa, -1)
    with nogil:
        status = ac_minmax(s, n, dtype_id, &mn, &mx, &bad, &o)
    if status == AC_ENONFINITE:
        raise NonFiniteError(bad)
    _check(status, "minmax")
    return mn, mx


def uniform(uint64_t seed, uint64_t index):
    """The stochastic-rounding draw in [0, 1) for one element (reference and other backends)."""
    return ac_uniform(seed, index)
