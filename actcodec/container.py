"""The container: an encoded array and its versioned, checksummed byte format.

An `Encoded` knows its codec, parameters, dtype, shape and payload buffers. `to_bytes()` writes
the format described in docs/FORMAT.md; `from_bytes()` parses it without trusting a single
byte: every length, id and parameter is checked, and anything wrong raises ValueError.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from math import prod

import numpy as np

from . import _dtypes, _ext, _outputs

MAGIC = b"ACTC"
FORMAT_VERSION = 1
MAX_NDIM = 32
MAX_BUFFERS = 16
MAX_PARAMS = 4096
_FIXED = struct.Struct("<4sBBBBBxxxI")  # magic, version, codec, dtype, ndim, nbuffers, params len
_U64 = struct.Struct("<Q")

# codec name -> module with CODEC_ID, PARAMS (struct.Struct), params_to_tuple/from_tuple,
# validate(encoded) and decode_into(encoded, out_bytes, out_dtype_name), and optionally
# DECODES_TO_FLOAT32. Filled by the codec modules.
CODECS: dict = {}


def register(name: str, module) -> None:
    CODECS[name] = module


def _codec_by_id(codec_id: int):
    for name, mod in CODECS.items():
        if mod.CODEC_ID == codec_id:
            return name, mod
    raise ValueError(f"unknown codec id {codec_id} (known: "
                     f"{', '.join(f'{m.CODEC_ID}={n}' for n, m in CODECS.items())})")


@dataclass(frozen=True, eq=False)
class Encoded:
    """An encoded array. `nbytes` is the exact size of the payload buffers it holds."""

    codec: str
    dtype: str
    shape: tuple
    params: dict
    buffers: tuple = field(repr=False)

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    @property
    def original_nbytes(self) -> int:
        return self.size * _dtypes.itemsize(self.dtype)

    @property
    def ratio(self) -> float:
        """original bytes / payload bytes (inf for an empty payload)."""
        return self.original_nbytes / self.nbytes if self.nbytes else float("inf")

    def decode(self, out: np.ndarray | None = None, dtype: str | None = None) -> np.ndarray:
        """Decode into a new array, or into `out` (C-contiguous, same shape). `dtype` is the
        encoded dtype (default) or, for quantized codecs, "float32"."""
        target = self.dtype if dtype is None else _dtypes.canonical_name(dtype)
        to_f32 = getattr(CODECS[self.codec], "DECODES_TO_FLOAT32", False)
        if target != self.dtype and not (target == "float32" and to_f32):
            allowed = self.dtype + (" or float32" if to_f32 else "")
            raise ValueError(f"a {self.codec} encoding of {self.dtype} decodes to {allowed}, "
                             f"not {target}")
        if out is None:
            out = _outputs.empty(self.shape, _dtypes.numpy_dtype(target))
        else:
            _check_out(out, self.shape, target)
        CODECS[self.codec].decode_into(self, out.reshape(-1).view(np.uint8), target)
        return out

    def to_bytes(self) -> bytes:
        mod = CODECS[self.codec]
        params = mod.PARAMS.pack(*mod.params_to_tuple(self.params))
        header = bytearray(_FIXED.pack(MAGIC, FORMAT_VERSION, mod.CODEC_ID,
                                       _dtypes.DTYPES[self.dtype][0], len(self.shape),
                                       len(self.buffers), len(params)))
        for dim in self.shape:
            header += _U64.pack(dim)
        header += params
        for buf in self.buffers:
            header += struct.pack("<QQ", buf.nbytes, _ext.checksum64(buf))
        header += _U64.pack(_ext.checksum64(bytes(header)))
        return b"".join([bytes(header), *(b.data for b in self.buffers)])


def _check_out(out, shape, dtype_name) -> None:
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
    want = _dtypes.numpy_dtype(dtype_name)
    if out.dtype != want and not (dtype_name == "bfloat16" and out.dtype == np.uint16):
        raise TypeError(f"out has dtype {out.dtype}, expected {want}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {tuple(shape)}")
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")
    if not out.flags.writeable:
        raise ValueError("out is read-only")


def from_bytes(data) -> Encoded:
    """Parse bytes written by `Encoded.to_bytes()`. Payload buffers are zero-copy views of
    `data`. Raises ValueError naming the first problem found."""
    try:
        view = memoryview(data).cast("B")
    except TypeError as exc:
        raise TypeError(f"from_bytes needs a bytes-like object, got {type(data).__name__}") from exc
    total = len(view)
    if total < _FIXED.size:
        raise ValueError(f"truncated: {total} bytes is shorter than the {_FIXED.size}-byte header")
    magic, version, codec_id, dtype_id, ndim, nbuf, plen = _FIXED.unpack_from(view, 0)
    if magic != MAGIC:
        raise ValueError(f"not an actcodec encoding (magic {bytes(magic)!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise ValueError(f"unsupported format version {version} (this actcodec reads "
                         f"version {FORMAT_VERSION})")
    if bytes(view[9:12]) != b"\0\0\0":
        raise ValueError("reserved header bytes are not zero")
    if ndim > MAX_NDIM:
        raise ValueError(f"ndim {ndim} exceeds the maximum {MAX_NDIM}")
    if nbuf > MAX_BUFFERS:
        raise ValueError(f"{nbuf} buffers exceeds the maximum {MAX_BUFFERS}")
    if plen > MAX_PARAMS:
        raise ValueError(f"parameter block of {plen} bytes exceeds the maximum {MAX_PARAMS}")
    hlen = _FIXED.size + 8 * ndim + plen + 16 * nbuf + 8
    if total < hlen:
        raise ValueError(f"truncated: header needs {hlen} bytes, only {total} present")
    stored = _U64.unpack_from(view, hlen - 8)[0]
    if stored != _ext.checksum64(view[: hlen - 8]):
        raise ValueError("header checksum mismatch: the header is corrupted")
    # The header is intact from here on; still check that what it says makes sense.
    codec, mod = _codec_by_id(codec_id)
    if dtype_id not in _dtypes.DTYPE_BY_ID:
        raise ValueError(f"unknown dtype id {dtype_id}")
    dtype = _dtypes.DTYPE_BY_ID[dtype_id]
    pos = _FIXED.size
    shape = struct.unpack_from(f"<{ndim}Q", view, pos)
    pos += 8 * ndim
    if plen != mod.PARAMS.size:
        raise ValueError(f"{codec} parameters must be {mod.PARAMS.size} bytes, got {plen}")
    params = mod.params_from_tuple(mod.PARAMS.unpack_from(view, pos))
    pos += plen
    lengths = []
    for _ in range(nbuf):
        lengths.append(struct.unpack_from("<QQ", view, pos))
        pos += 16
    payload = sum(n for n, _ in lengths)
    if hlen + payload != total:
        raise ValueError(f"length mismatch: header and buffers need {hlen + payload} bytes, "
                         f"got {total}")
    buffers = []
    pos = hlen
    for i, (n, checksum) in enumerate(lengths):
        buf = np.frombuffer(view, np.uint8, count=n, offset=pos) if n else np.empty(0, np.uint8)
        if _ext.checksum64(buf) != checksum:
            raise ValueError(f"payload checksum mismatch in buffer {i}: the data is corrupted")
        buffers.append(buf)
        pos += n
    enc = Encoded(codec, dtype, tuple(int(d) for d in shape), params, tuple(buffers))
    mod.validate(enc)
    return enc


def expect_buffers(enc: Encoded, count: int) -> None:
    if len(enc.buffers) != count:
        raise ValueError(f"{enc.codec} encoding needs {count} buffers, has {len(enc.buffers)}")
