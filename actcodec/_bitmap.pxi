# Bindings for the sparse bitmap codec and masks (csrc/bitmap*.c). Buffers are flat uint8
# views the caller allocates; shape and dtype checks live in actcodec/bitmap.py and mask.py.


cdef size_t _elements(const uint8_t[::1] buf, int esize, str what) except? 0:
    if esize not in (1, 2, 4, 8) or buf.shape[0] % esize:
        raise ValueError(f"{what}: {buf.shape[0]} bytes is not a whole number of "
                         f"{esize}-byte elements")
    return buf.shape[0] // esize


cdef int _bitmap_size(const uint8_t[::1] bitmap, size_t n) except -1:
    if <size_t>bitmap.shape[0] != ac_bitmap_nbytes(n):
        raise ValueError(f"bitmap has {bitmap.shape[0]} bytes, {ac_bitmap_nbytes(n)} expected "
                         f"for {n} elements")
    return 0


def bitmap_encode(const uint8_t[::1] src, int esize, uint64_t prune_abs_bits,
                  uint8_t[::1] bitmap, uint8_t[::1] values, int threads=0, int isa=-1):
    """Encode a flat byte view of elements of `esize` bytes into `bitmap` (exactly its size)
    and `values` (room for every element); returns the number of values written."""
    if esize == 1:
        raise ValueError("bitmap_encode: elements of 2, 4 or 8 bytes")
    cdef size_t n = _elements(src, esize, "bitmap_encode")
    _bitmap_size(bitmap, n)
    if <size_t>values.shape[0] < n * esize:
        raise ValueError(f"bitmap_encode: values has {values.shape[0]} bytes, needs room for "
                         f"{n * esize}")
    cdef const uint8_t *s = _cptr(src)
    cdef uint8_t *b = _wptr(bitmap)
    cdef uint8_t *v = _wptr(values)
    cdef size_t nnz = 0
    cdef int status
    cdef ac_options o = _opts(threads, isa, -1)
    with nogil:
        status = ac_bitmap_encode(s, n, esize, prune_abs_bits, b, v, &nnz, &o)
    _check(status, "bitmap encode")
    return nnz


def bitmap_count(const uint8_t[::1] bitmap, size_t n, int isa=-1):
    """Number of set bits of a bitmap for n elements; ValueError on a malformed bitmap."""
    _bitmap_size(bitmap, n)
    cdef size_t nnz = 0
    cdef const uint8_t *b = _cptr(bitmap)
    cdef int status
    cdef ac_options o = _opts(1, isa, -1)
    with nogil:
        status = ac_bitmap_count(b, n, &nnz, &o)
    _check(status, "bitmap")
    return nnz


def bitmap_decode(const uint8_t[::1] bitmap, const uint8_t[::1] values, int esize,
                  uint8_t[::1] out, int threads=0, int isa=-1):
    """Decode into `out`, a flat writable byte view of n * esize bytes."""
    if esize == 1:
        raise ValueError("bitmap_decode: elements of 2, 4 or 8 bytes")
    cdef size_t n = _elements(out, esize, "bitmap_decode")
    cdef size_t nnz = _elements(values, esize, "bitmap_decode")
    _bitmap_size(bitmap, n)
    cdef const uint8_t *b = _cptr(bitmap)
    cdef const uint8_t *v = _cptr(values)
    cdef uint8_t *d = _wptr(out)
    cdef int status
    cdef ac_options o = _opts(threads, isa, -1)
    with nogil:
        status = ac_bitmap_decode(b, v, nnz, n, esize, d, &o)
    _check(status, "bitmap decode")


def mask_encode(const uint8_t[::1] src, int esize, uint8_t[::1] bitmap, uint8_t[::1] value,
                int threads=0, int isa=-1):
    """The bitmap of a flat byte view of elements of `esize` bytes (1 for bool) into `bitmap`,
    and (nnz, whether every nonzero element has one bit pattern, written to `value`)."""
    cdef size_t n = _elements(src, esize, "mask_encode")
    _bitmap_size(bitmap, n)
    if value.shape[0] != esize:
        raise ValueError(f"mask_encode: value needs {esize} bytes, has {value.shape[0]}")
    cdef const uint8_t *s = _cptr(src)
    cdef uint8_t *b = _wptr(bitmap)
    cdef uint8_t *v = _wptr(value)
    cdef size_t nnz = 0
    cdef int one = 0, status
    cdef ac_options o = _opts(threads, isa, -1)
    with nogil:
        status = ac_mask_encode(s, n, esize, b, v, &nnz, &one, &o)
    _check(status, "mask encode")
    return nnz, bool(one)


def mask_decode(const uint8_t[::1] bitmap, const uint8_t[::1] value, uint8_t[::1] out,
                int threads=0, int isa=-1):
    """`value` (one element's bytes) where the bitmap's bit is set, zero bytes elsewhere,
    into `out`, a flat writable byte view of n elements of len(value) bytes."""
    cdef int esize = value.shape[0]
    cdef size_t n = _elements(out, esize, "mask_decode")
    _bitmap_size(bitmap, n)
    cdef const uint8_t *b = _cptr(bitmap)
    cdef const uint8_t *v = _cptr(value)
    cdef uint8_t *d = _wptr(out)
    cdef int status
    cdef ac_options o = _opts(threads, isa, -1)
    with nogil:
        status = ac_mask_decode(b, n, v, esize, d, &o)
    _check(status, "mask decode")


def sample_nonzero(const uint8_t[::1] src, int esize, size_t runs, size_t run_len):
    """Nonzero counts of `runs` runs of run_len elements of a flat byte view, one at a hashed
    offset in each of `runs` equal stretches: (nonzero total, sum of the runs' squared counts,
    whether every nonzero sampled element has one bit pattern)."""
    if esize == 1:
        raise ValueError("sample_nonzero: elements of 2, 4 or 8 bytes")
    cdef size_t n = _elements(src, esize, "sample_nonzero")
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
    if esize == 1:
        raise ValueError("nonzero_share_floor: elements of 2, 4 or 8 bytes")
    cdef size_t n = _elements(src, esize, "nonzero_share_floor")
    if n == 0:
        return 0.0, False
    cdef int one = 0
    cdef double low
    cdef const uint8_t *s = _cptr(src)
    with nogil:
        low = ac_nonzero_share_floor(s, n, esize, &one)
    return low, bool(one)
