# Bindings for ISA detection, the process defaults and the small utilities.

def _init():
    """Run detection; nonzero when ACTCODEC_SIMD names an unknown or unavailable path."""
    return ac_init()


ISA_DEFAULT = AC_ISA_DEFAULT


def isa_names():
    return [ac_isa_name(i).decode() for i in range(AC_ISA_COUNT)]


def isa_index(str name):
    """The C index of a path name; -1 if unknown."""
    return ac_isa_from_name(name.encode())


def isa_available(int isa):
    return ac_isa_available(isa) != 0


def best_isa():
    return ac_best_isa()


def default_isa():
    return ac_default_isa()


def set_default_isa(int isa):
    _check(ac_set_default_isa(isa), "set_default_isa")


def default_threads():
    return ac_default_threads()


def set_default_threads(int n):
    _check(ac_set_default_threads(n), "set_default_threads")


def cpu_features():
    return ac_cpu_features().decode().split()


def openmp_enabled():
    return ac_openmp_enabled() != 0


def checksum64(const uint8_t[::1] data, uint64_t seed=0):
    """64-bit checksum of a contiguous byte buffer (the container format's checksum)."""
    cdef uint64_t h
    cdef const uint8_t *p = _cptr(data)
    cdef size_t n = data.shape[0]
    with nogil:
        h = ac_checksum64(p, n, seed)
    return h
