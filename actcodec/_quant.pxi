# Bindings for dynamic k-bit quantization (csrc/quant*.c). Buffers are flat byte views;
# parameter and shape checks live in actcodec/quant.py.
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


def quant_encode(const uint8_t[::1] src, int dtype_id, int esize, int bits, size_t group,
                 int rounding, uint64_t seed):
    """Returns (packed uint8, mins float32, scales float32)."""
    if src.shape[0] % esize:
        raise ValueError("quant_encode: buffer is not a whole number of elements")
    cdef size_t n = src.shape[0] // esize
    cdef size_t ng = ac_quant_ngroups(n, group)
    cdef cnp.ndarray packed = np.empty(ac_quant_packed_nbytes(n, bits), np.uint8)
    cdef cnp.ndarray mins = np.empty(ng, np.float32)
    cdef cnp.ndarray scales = np.empty(ng, np.float32)
    cdef const uint8_t *s = _cptr(src)
    cdef uint8_t *p = <uint8_t *>cnp.PyArray_DATA(packed)
    cdef float *mn = <float *>cnp.PyArray_DATA(mins)
    cdef float *sc = <float *>cnp.PyArray_DATA(scales)
    cdef size_t bad = SIZE_MAX
    cdef int status
    with nogil:
        status = ac_quant_encode(s, n, dtype_id, bits, group, rounding, seed, p, mn, sc, &bad)
    if status == AC_ENONFINITE:
        raise NonFiniteError(bad)
    _check(status, "quant encode")
    return packed, mins, scales


def quant_decode(const uint8_t[::1] packed, const float[::1] mins, const float[::1] scales,
                 int bits, size_t group, int out_dtype_id, int out_esize, uint8_t[::1] out):
    """Decode into `out`, a flat writable byte view of n * out_esize bytes."""
    if out.shape[0] % out_esize:
        raise ValueError("quant_decode: output is not a whole number of elements")
    cdef size_t n = out.shape[0] // out_esize
    cdef size_t ng = ac_quant_ngroups(n, group)
    if <size_t>packed.shape[0] != ac_quant_packed_nbytes(n, bits):
        raise ValueError(f"packed codes have {packed.shape[0]} bytes, "
                         f"{ac_quant_packed_nbytes(n, bits)} expected")
    if <size_t>mins.shape[0] != ng or <size_t>scales.shape[0] != ng:
        raise ValueError(f"{ng} groups need {ng} mins and scales, got {mins.shape[0]} "
                         f"and {scales.shape[0]}")
    cdef const uint8_t *p = _cptr(packed)
    cdef const float *mn = NULL if ng == 0 else &mins[0]
    cdef const float *sc = NULL if ng == 0 else &scales[0]
    cdef uint8_t *o = _wptr(out)
    cdef int status
    with nogil:
        status = ac_quant_decode(p, mn, sc, n, bits, group, out_dtype_id, o)
    _check(status, "quant decode")


def minmax(const uint8_t[::1] src, int dtype_id, int esize):
    """(min, max) as float32 values over the configured threads; NonFiniteError on NaN/inf."""
    if src.shape[0] == 0 or src.shape[0] % esize:
        raise ValueError("minmax needs a non-empty buffer of whole elements")
    cdef size_t n = src.shape[0] // esize
    cdef float mn = 0, mx = 0
    cdef size_t bad = SIZE_MAX
    cdef const uint8_t *s = _cptr(src)
    cdef int status
    with nogil:
        status = ac_minmax(s, n, dtype_id, &mn, &mx, &bad)
    if status == AC_ENONFINITE:
        raise NonFiniteError(bad)
    _check(status, "minmax")
    return mn, mx


def get_bittrick():
    return ac_get_bittrick() != 0


def set_bittrick(on):
    """True: DAF's bit trick; False: casts; None: the measured default of the active path."""
    ac_set_bittrick(-1 if on is None else (1 if on else 0))


def uniform(uint64_t seed, uint64_t index):
    """The stochastic-rounding draw in [0, 1) for one element (reference and other backends)."""
    return ac_uniform(seed, index)
