"""actcodec: fast activation-compression codecs for memory-efficient training.

numpy users: ``actcodec.bitmap.encode(x)`` returns an `Encoded`; ``.decode()`` restores the
array, ``.to_bytes()`` / ``actcodec.from_bytes()`` store and load it.
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

_status = _ext._init()
if _status != 0:
    _forced = os.environ.get("ACTCODEC_SIMD")
    _avail = [n for n in _ext.isa_names() if _ext.isa_available(n)]
    raise ImportError(
        f"ACTCODEC_SIMD={_forced!r} cannot be used: "
        + ("unknown path" if _forced not in _ext.isa_names() else "not available on this CPU")
        + f"; available here: {', '.join(_avail)}"
    )

from . import _outputs, bitmap, bitmap_quant, quant, raw  # noqa: E402  (registers the codecs)
from .auto import encode  # noqa: E402
from .codecs import Auto, Bitmap, BitmapQuant, Codec, Quant, Raw  # noqa: E402
from .container import Encoded, from_bytes  # noqa: E402
from .quant import NonFiniteError  # noqa: E402

__version__ = "0.1.0"

set_num_threads = _ext.set_num_threads
get_num_threads = _ext.get_num_threads


def set_simd(name: str) -> None:
    """Force a SIMD path for this process ("scalar", "sse2", "avx2", "neon")."""
    _ext.set_isa(name)


def get_simd() -> str:
    """The active SIMD path."""
    return _ext.active_isa()


def simd_info() -> dict:
    """Detected CPU features, the compiled-and-supported paths, the active one, threads."""
    return {
        "features": _ext.cpu_features(),
        "available": [n for n in _ext.isa_names() if _ext.isa_available(n)],
        "best": _ext.best_isa(),
        "active": _ext.active_isa(),
        "threads": _ext.get_num_threads(),
        "openmp": _ext.openmp_enabled(),
    }


def set_own_mapping_bytes(nbytes: int | None) -> None:
    """Decoded arrays of at least `nbytes` (default 32 MiB, where glibc maps fresh pages for
    every allocation anyway) get a mapping of their own with transparent huge pages asked for:
    a 64 MiB tensor for torch decodes in a fifth of the time. None leaves every array to
    numpy's allocator: the right choice when glibc is told to keep large blocks for reuse
    (MALLOC_MMAP_THRESHOLD_ above 32 MiB, or mallopt)."""
    _outputs.set_own_mapping_bytes(nbytes)


def get_own_mapping_bytes() -> int | None:
    return _outputs.get_own_mapping_bytes()


def set_bittrick(on: bool | None) -> None:
    """Choose the code<->float conversion: DAF's bit trick (True) or plain casts (False);
    None restores the default, the faster on the active SIMD path (measured: casts on SSE2
    and AVX2, the bit trick on scalar). Both give bit-identical results."""
    _ext.set_bittrick(on)


def get_bittrick() -> bool:
    return _ext.get_bittrick()


def set_tuning(*, quant_short_tiles_from: int | None | bool = False,
               bitmap_block_max: int | None = None,
               bitmap_stream_from: int | None | bool = False) -> None:
    """Speed knobs measured on one machine (bench/tuning_pairs.py); no output byte depends on
    them. quant_short_tiles_from: inputs of at least this many bytes are quantized in short
    tiles (default 16 MiB, half that machine's L3; None: never). bitmap_block_max: the
    threaded bitmap encode's largest block, a power of two from 128 KiB (default 2 MiB).
    bitmap_stream_from: threaded bitmap encodes of inputs of at least this many bytes write
    their values with non-temporal stores on x86-64 (default 8 MiB; None: never). A knob
    left out keeps its value."""
    _ext.set_tuning(quant_short_tiles_from, bitmap_block_max, bitmap_stream_from)


def get_tuning() -> dict:
    return _ext.get_tuning()


__all__ = [
    "Auto", "Bitmap", "BitmapQuant", "Codec", "Encoded", "NonFiniteError", "Quant", "Raw",
    "bitmap", "bitmap_quant", "encode", "from_bytes", "get_bittrick", "get_num_threads",
    "get_own_mapping_bytes", "get_simd", "get_tuning", "quant", "raw", "set_bittrick",
    "set_num_threads", "set_own_mapping_bytes", "set_simd", "set_tuning", "simd_info",
]
