# Bindings for ISA dispatch, the thread knob and the small utilities.
from libc.stdint cimport SIZE_MAX

def _init():
    """Run detection; report a bad ACTCODEC_SIMD as (status, value)."""
    return ac_init()


def isa_names():
    return [ac_isa_name(i).decode() for i in range(AC_ISA_COUNT)]


def isa_available(str name):
    cdef int isa = ac_isa_from_name(name.encode())
    return isa >= 0 and ac_isa_available(isa) != 0


def best_isa():
    return ac_isa_name(ac_best_isa()).decode()


def active_isa():
    return ac_isa_name(ac_active_isa()).decode()


def set_isa(str name):
    cdef int isa = ac_isa_from_name(name.encode())
    if isa < 0:
        raise ValueError(f"unknown SIMD path {name!r}; choose from {', '.join(isa_names())}")
    if ac_set_isa(isa) != AC_OK:
        raise ValueError(f"SIMD path {name!r} is not available on this CPU/build; "
                         f"available: {', '.join(n for n in isa_names() if isa_available(n))}")


def cpu_features():
    return ac_cpu_features().decode().split()


def openmp_enabled():
    return ac_openmp_enabled() != 0


def get_num_threads():
    return ac_get_num_threads()


def set_num_threads(int n):
    if ac_set_num_threads(n) != AC_OK:
        raise ValueError(f"thread count must be between 1 and 1024, got {n}")


def get_tuning():
    """The speed knobs that change no output byte (see csrc/actcodec.h, "Tuning"): quant's
    short-tile threshold and the bitmap encode's streaming threshold in bytes (None: never),
    and the bitmap encode's largest block."""
    cdef size_t short = ac_get_quant_short_tiles_from()
    cdef size_t stream = ac_get_bitmap_stream_from()
    return {"quant_short_tiles_from": None if short == SIZE_MAX else short,
            "bitmap_block_max": ac_get_bitmap_block_max(),
            "bitmap_stream_from": None if stream == SIZE_MAX else stream}


cdef size_t _threshold(str name, value) except? 0:
    """A byte threshold knob's value: an int >= 0, or None for never (SIZE_MAX)."""
    if value is None:
        return SIZE_MAX
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= SIZE_MAX:
        return value
    raise ValueError(f"{name} must be an int >= 0 or None, got {value!r}")


def set_tuning(quant_short_tiles_from=False, bitmap_block_max=None, bitmap_stream_from=False):
    """Set the knobs of get_tuning; an argument left out keeps its value, and a bad one
    changes none. For benchmarks (bench/tuning_pairs.py) and machines whose caches differ
    from the one measured."""
    cdef size_t short = 0, stream = 0
    if quant_short_tiles_from is not False:
        short = _threshold("quant_short_tiles_from", quant_short_tiles_from)
    if bitmap_stream_from is not False:
        stream = _threshold("bitmap_stream_from", bitmap_stream_from)
    if bitmap_block_max is not None:  # the C setter checks and sets in one; the rest waits
        if (not isinstance(bitmap_block_max, int) or isinstance(bitmap_block_max, bool)
                or not 0 <= bitmap_block_max <= SIZE_MAX
                or ac_set_bitmap_block_max(bitmap_block_max) != AC_OK):
            raise ValueError(f"bitmap_block_max must be a power of two from 131072 bytes to "
                             f"1 GiB, got {bitmap_block_max!r}")
    if quant_short_tiles_from is not False:
        ac_set_quant_short_tiles_from(short)
    if bitmap_stream_from is not False:
        ac_set_bitmap_stream_from(stream)


def checksum64(const uint8_t[::1] data, uint64_t seed=0):
    """64-bit checksum of a contiguous byte buffer (the container format's checksum)."""
    cdef uint64_t h
    cdef const uint8_t *p = _cptr(data)
    cdef size_t n = data.shape[0]
    with nogil:
        h = ac_checksum64(p, n, seed)
    return h


def parallel_copy(uint8_t[::1] dst, const uint8_t[::1] src):
    """memcpy over the configured threads (benchmark yardstick)."""
    if dst.shape[0] != src.shape[0]:
        raise ValueError("parallel_copy: dst and src differ in size")
    cdef uint8_t *d = _wptr(dst)
    cdef const uint8_t *s = _cptr(src)
    cdef size_t n = src.shape[0]
    with nogil:
        ac_parallel_copy(d, s, n)


def parallel_fill(uint8_t[::1] dst, int byte):
    """memset over the configured threads (benchmark yardstick: writing an output)."""
    if not 0 <= byte <= 255:
        raise ValueError(f"parallel_fill: byte must be 0..255, got {byte}")
    cdef uint8_t *d = _wptr(dst)
    cdef size_t n = dst.shape[0]
    with nogil:
        ac_parallel_fill(d, byte, n)
