"""A call's settings: threads and SIMD path, checked here and passed down to C per call.

None means the process default (`actcodec.set_num_threads`, `actcodec.set_simd`, or the
environment variables ACTCODEC_NUM_THREADS and ACTCODEC_SIMD); nothing here is global."""
from __future__ import annotations

from . import _ext

MAX_THREADS = 1024


def threads(n) -> int:
    """The C value for a thread count: 0 for the default."""
    if n is None:
        return 0
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_THREADS:
        raise ValueError(f"threads must be an int from 1 to {MAX_THREADS} or None, got {n!r}")
    return n


def isa(name) -> int:
    """The C value for a SIMD path name: ISA_DEFAULT for None."""
    if name is None:
        return _ext.ISA_DEFAULT
    index = _ext.isa_index(name) if isinstance(name, str) else -1
    if index < 0:
        raise ValueError(f"unknown SIMD path {name!r}; choose from {', '.join(_ext.isa_names())}")
    if not _ext.isa_available(index):
        raise ValueError(f"SIMD path {name!r} is not available on this CPU/build; available: "
                         f"{', '.join(available())}")
    return index


def bittrick(on) -> int:
    """The C value for the code <-> float conversion: -1 for the path's default."""
    if on is None:
        return -1
    if not isinstance(on, bool):
        raise ValueError(f"bittrick must be True, False or None, got {on!r}")
    return int(on)


def available() -> list[str]:
    return [n for i, n in enumerate(_ext.isa_names()) if _ext.isa_available(i)]


def resolve(threads_=None, simd=None) -> dict:
    """Keyword arguments for the bindings."""
    return {"threads": threads(threads_), "isa": isa(simd)}
