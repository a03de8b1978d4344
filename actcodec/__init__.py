"""actcodec: fast activation-compression codecs for memory-efficient training.

numpy users: ``actcodec.encode(x)`` (or ``actcodec.bitmap.encode(x)``, ...) returns an
`Encoded`; ``.decode()`` restores the array, ``.to_bytes()`` / ``actcodec.from_bytes()``
store and load it. Every call takes ``threads=`` and ``simd=``; ``set_num_threads`` and
``set_simd`` set only the defaults for calls that name none.

Extending: a codec is a class of ``actcodec.abc.Codec`` registered with
``actcodec.registry.register``; an array library is a backend registered with
``actcodec.backends.register`` (``actcodec.torch`` registers torch's).
"""
from __future__ import annotations

import os

try:
    from . import _ext
except ImportError as exc:  # running from a source tree whose extension was never built
    raise ImportError(
        "actcodec's compiled extension (actcodec._ext) is not built here. In a source "
        "checkout run `pip install -e .` (builds it in place); after a plain `pip install .`, "
        "run Python outside the source directory so the installed package is imported."
    ) from exc

if _ext._init() != 0:
    _forced = os.environ.get("ACTCODEC_SIMD")
    _avail = [n for i, n in enumerate(_ext.isa_names()) if _ext.isa_available(i)]
    raise ImportError(
        f"ACTCODEC_SIMD={_forced!r} cannot be used: "
        + ("unknown path" if _forced not in _ext.isa_names() else "not available on this CPU")
        + f"; available here: {', '.join(_avail)}"
    )

from . import (_options, backends, bitmap, bitmap_quant, mask, quant, raw,  # noqa: E402
               registry, resident)

# The built-in codecs, in the order the codec choice breaks ties of size (lossless first).
for _codec in (raw.Raw(), bitmap.Bitmap(), mask.Mask(), quant.Quant(),
               bitmap_quant.BitmapQuant()):
    registry.register(_codec)
del _codec

from .container import Encoded, from_bytes  # noqa: E402
from .encoder import encode  # noqa: E402
from .numcodecs import Auto, Bitmap, BitmapQuant, Codec, Mask, Quant, Raw  # noqa: E402
from .quant import NonFiniteError  # noqa: E402

__version__ = "0.2.0"


def set_num_threads(n: int) -> None:
    """The default thread count of codec calls that pass no `threads` (initially
    ACTCODEC_NUM_THREADS, else the cores)."""
    _ext.set_default_threads(_options.threads(n))


def get_num_threads() -> int:
    return _ext.default_threads()


def set_simd(name: str) -> None:
    """The default SIMD path of codec calls that pass no `simd` ("scalar", "sse2", "avx2",
    "neon"; initially ACTCODEC_SIMD, else the best this CPU has)."""
    if name is None:
        raise ValueError("set_simd needs a path name")
    _ext.set_default_isa(_options.isa(name))


def get_simd() -> str:
    """The default SIMD path."""
    return _ext.isa_names()[_ext.default_isa()]


def simd_info() -> dict:
    """Detected CPU features, the compiled-and-supported paths, the best and the default one,
    the default thread count, and whether OpenMP is built in."""
    return {
        "features": _ext.cpu_features(),
        "available": _options.available(),
        "best": _ext.isa_names()[_ext.best_isa()],
        "default": get_simd(),
        "threads": _ext.default_threads(),
        "openmp": _ext.openmp_enabled(),
    }


__all__ = [
    "Auto", "Bitmap", "BitmapQuant", "Codec", "Encoded", "Mask", "NonFiniteError", "Quant",
    "Raw", "backends", "bitmap", "bitmap_quant", "encode", "from_bytes", "get_num_threads",
    "get_simd", "mask", "quant", "raw", "registry", "resident", "set_num_threads", "set_simd",
    "simd_info",
]
