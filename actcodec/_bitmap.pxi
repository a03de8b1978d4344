# Bindings for the sparse bitmap codec (csrc/bitmap*.c). Buffers are flat uint8 views;
# shape and dtype checks live in actcodec/bitmap.py.
cimport numpy as cnp


def bitmap_encode(const uint8_t[::1] src, int esize, uint64_t prune_abs_bits,
                  bint own_mapping=False):
    """Encode a flat byte view of elements of `esize` bytes. Returns (bitmap, values) as
    uint8 arrays; `values` is allocated for the worst case and shrunk in place (realloc, or
    with `own_mapping` unmapping the tail of a mapping of its own), so pages it never touched
    are never committed."""
    if esize not in (2, 4, 8) or src.shape[0] % esize:
        raise ValueError(f"bitmap_encode: {src.shape[0]} bytes is not a whole number of "
                         f"{esize}-byte elements")
    cdef size_t n = src.shape[0] // esize
    cdef cnp.ndarray bitmap = np.empty(ac_bitmap_nbytes(n), np.uint8)
    cdef cnp.ndarray values = None
    cdef PageBuffer pages = None
    cdef void *v
    if own_mapping and n > 0:
        pages = PageBuffer(n * esize)
        v = pages.ptr
    else:
        values = np.empty(n * esize, np.uint8)
        v = cnp.PyArray_DATA(values)
    cdef const uint8_t *s = _cptr(src)
    cdef uint8_t *b = <uint8_t *>cnp.PyArray_DATA(bitmap)
    cdef size_t nnz = 0
    cdef int status
    with nogil:
        status = ac_bitmap_encode(s, n, esize, prune_abs_bits, b, v, &nnz)
    _check(status, "bitmap encode")
    if pages is None:
        values.resize((nnz * esize,), refcheck=False)
        return bitmap, values
    if nnz == 0:
        return bitmap, np.empty(0, np.uint8)
    pages.shrink(nnz * esize)
    return bitmap, np.frombuffer(pages, np.uint8)


def bitmap_count(const uint8_t[::1] bitmap, size_t n):
    """Number of set bits of a bitmap for n elements; ValueError on a malformed bitmap."""
    if <size_t>bitmap.shape[0] != ac_bitmap_nbytes(n):
        raise ValueError(f"bitmap has {bitmap.shape[0]} bytes, {ac_bitmap_nbytes(n)} expected "
                         f"for {n} elements")
    cdef size_t nnz = 0
    cdef const uint8_t *b = _cptr(bitmap)
    cdef int status
    with nogil:
        status = ac_bitmap_count(b, n, &nnz)
    _check(status, "bitmap")
    return nnz


def bitmap_decode(const uint8_t[::1] bitmap, const uint8_t[::1] values, int esize,
                  uint8_t[::1] out):
    """Decode into `out`, a flat writable byte view of n * esize bytes."""
    if esize not in (2, 4, 8) or out.shape[0] % esize or values.shape[0] % esize:
        raise ValueError("bitmap_decode: buffer sizes are not whole elements")
    cdef size_t n = out.shape[0] // esize
    cdef size_t nnz = values.shape[0] // esize
    if <size_t>bitmap.shape[0] != ac_bitmap_nbytes(n):
        raise ValueError(f"bitmap has {bitmap.shape[0]} bytes, {ac_bitmap_nbytes(n)} expected "
                         f"for {n} elements")
    cdef const uint8_t *b = _cptr(bitmap)
    cdef const uint8_t *v = _cptr(values)
    cdef uint8_t *o = _wptr(out)
    cdef int status
    with nogil:
        status = ac_bitmap_decode(b, v, nnz, n, esize, o)
    _check(status, "bitmap decode")


def sample_nonzero(const uint8_t[::1] src, int esize, size_t runs, size_t run_len):
    """Nonzero counts of `runs` runs of run_len elements of a flat byte view, one at a hashed
    offset in each of `runs` equal stretches: (nonzero total, sum of the runs' squared counts,
    whether every nonzero sampled element has one bit pattern)."""
    if esize not in (2, 4, 8) or src.shape[0] % esize:
        raise ValueError(f"sample_nonzero: {src.shape[0]} bytes is not a whole number of "
                         f"{esize}-byte elements")
    cdef size_t n = src.shape[0] // esize
    if runs == 0 or run_len == 0 or runs > n // run_len:
        raise ValueError(f"sample_nonzero: {runs} runs of {run_len} do not fit in {n} elements")
    cdef uint64_t nnz = 0, sumsq = 0
    cdef int one = 0, status
    cdef const uint8_t *s = _cptr(src)
    with nogil:
        status = ac_sample_nonzero(s, n, esize, runs, run_len, &nnz, &sumsq, &one)
    _check(status, "sample_nonzero")
    return nnz, sumsq, bool(one)


def nonzero_share_floor(const uint8_t[::1] src, int esize):
    """(a lower bound on the share of nonzero elements from a 64-run sample, whether every
    nonzero sampled element has one bit pattern); (0.0, False) under 4096 elements."""
    if esize not in (2, 4, 8) or src.shape[0] % esize:
        raise ValueError(f"nonzero_share_floor: {src.shape[0]} bytes is not a whole number of "
                         f"{esize}-byte elements")
    cdef size_t n = src.shape[0] // esize
    if n == 0:
        return 0.0, False
    cdef int one = 0
    cdef double low
    cdef const uint8_t *s = _cptr(src)
    with nogil:
        low = ac_nonzero_share_floor(s, n, esize, &one)
    return low, bool(one)
