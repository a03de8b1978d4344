# Bindings for ISA dispatch, the thread knob and the small utilities.

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
