"""The container: an encoded array and its versioned, checksummed byte format.

An `Encoded` knows its codec, parameters, dtype, shape and payload buffers (1-D uint8 numpy
arrays, or 1-D uint8 arrays of one backend, such as torch tensors on one device: see
actcodec.backends). `decode()` gives back a numpy array for numpy buffers and the backend's
array for a backend's. `to_bytes()` writes the
format described in docs/FORMAT.md; `from_bytes()` parses it without trusting a single byte:
every length, id and parameter is checked, and anything wrong raises ValueError.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from math import prod

import numpy as np

from . import _dtypes, _ext, _options, backends
from .registry import CODECS, by_id

MAGIC = b"ACTC"
FORMAT_VERSION = 1
MAX_NDIM = 32
MAX_BUFFERS = 16
MAX_PARAMS = 4096
_FIXED = struct.Struct("<4sBBBBBxxxI")  # magic, version, codec, dtype, ndim, nbuffers, params len
_U64 = struct.Struct("<Q")


@dataclass(frozen=True, eq=False)
class Encoded:
    """An encoded array. `nbytes` is the exact size of the payload buffers it holds. `nnz`,
    for the bitmap codecs, is the number of nonzero elements (counted once, when encoded or
    parsed)."""

    codec: str
    dtype: str
    shape: tuple
    params: dict
    buffers: tuple = field(repr=False)
    nnz: int | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)  # numpy's and torch's count alike

    @property
    def original_nbytes(self) -> int:
        return self.size * _dtypes.itemsize(self.dtype)

    @property
    def ratio(self) -> float:
        """original bytes / payload bytes (inf for an empty payload)."""
        return self.original_nbytes / self.nbytes if self.nbytes else float("inf")

    @property
    def backend(self):
        """The backend of the buffers (actcodec.backends), or None for numpy buffers."""
        return backends.of(self.buffers[0]) if self.buffers else None

    @property
    def is_torch(self) -> bool:
        return self.backend is not None and self.backend.name == "torch"

    @property
    def device(self):
        """The buffers' device (a torch device for torch buffers), or "numpy"."""
        backend = self.backend
        return backend.device(self.buffers[0]) if backend is not None else "numpy"

    def decode_dtype(self, dtype=None) -> str:
        """The dtype name a decode gives: the encoded dtype, or float32 where allowed."""
        target = self.dtype if dtype is None else _dtypes.canonical_name(dtype)
        to_f32 = CODECS[self.codec].decodes_to_float32
        if target != self.dtype and not (target == "float32" and to_f32):
            allowed = self.dtype + (" or float32" if to_f32 else "")
            raise ValueError(f"a {self.codec} encoding of {self.dtype} decodes to {allowed}, "
                             f"not {target}")
        return target

    def decode(self, out=None, dtype=None, *, threads: int | None = None,
               simd: str | None = None):
        """Decode into a new array, or into `out` (C-contiguous, this shape and dtype). numpy
        buffers give a numpy array; a backend's buffers its array (torch: a tensor on their
        device). `dtype` is the encoded dtype (default) or, for quantized codecs, "float32".
        threads and simd: this call's settings (None: the defaults)."""
        backend = self.backend
        if backend is not None:
            return backend.decode(self, out, dtype, threads=threads, simd=simd)
        target = self.decode_dtype(dtype)
        opts = _options.resolve(threads, simd)
        if out is None:
            out = np.empty(self.shape, _dtypes.numpy_dtype(target))
        else:
            check_out(out, self.shape, target)
        self.decode_into(out.reshape(-1).view(np.uint8), target, opts)
        return out

    def decode_into(self, out_bytes: np.ndarray, target: str, opts: dict) -> None:
        """The C path: decode into a flat uint8 view of host memory (checked by the caller),
        from buffers on the host."""
        buffers = tuple(backends.host_bytes(b) for b in self.buffers)
        CODECS[self.codec].decode_into(self, buffers, out_bytes, target, opts)

    def numpy(self) -> "Encoded":
        """The same encoding over numpy buffers (host copies of device buffers; CPU tensors
        are viewed, not copied)."""
        if self.backend is None:
            return self
        return _replace(self, tuple(backends.to_numpy(b) for b in self.buffers))

    def to(self, device="cpu", backend: str = "torch") -> "Encoded":
        """The same encoding over a backend's buffers on `device` (torch: uint8 tensors;
        numpy buffers are viewed on the CPU, copied elsewhere; read-only ones, such as a
        parsed byte string's, are copied: torch has no read-only tensors)."""
        target = backends.get(backend)
        return _replace(self, tuple(target.from_numpy(b, device) for b in self.buffers))

    def to_bytes(self) -> bytes:
        mod = CODECS[self.codec]
        bufs = [backends.to_numpy(b) for b in self.buffers]
        params = mod.params_struct.pack(*mod.params_to_tuple(self.params))
        header = bytearray(_FIXED.pack(MAGIC, FORMAT_VERSION, mod.codec_id,
                                       _dtypes.DTYPES[self.dtype][0], len(self.shape),
                                       len(bufs), len(params)))
        for dim in self.shape:
            header += _U64.pack(dim)
        header += params
        for buf in bufs:
            header += struct.pack("<QQ", buf.nbytes, _ext.checksum64(buf))
        header += _U64.pack(_ext.checksum64(bytes(header)))
        return b"".join([bytes(header), *(b.data for b in bufs)])


def _replace(enc: Encoded, buffers: tuple) -> Encoded:
    return Encoded(enc.codec, enc.dtype, enc.shape, enc.params, buffers, enc.nnz)


def check_out(out, shape, dtype_name) -> None:
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
    mod = by_id(codec_id)
    codec = mod.name
    if dtype_id not in _dtypes.DTYPE_BY_ID:
        raise ValueError(f"unknown dtype id {dtype_id}")
    dtype = _dtypes.DTYPE_BY_ID[dtype_id]
    if dtype not in mod.dtypes:
        raise ValueError(f"the {codec} codec does not encode {dtype}")
    pos = _FIXED.size
    shape = struct.unpack_from(f"<{ndim}Q", view, pos)
    pos += 8 * ndim
    if plen != mod.params_struct.size:
        raise ValueError(f"{codec} parameters must be {mod.params_struct.size} bytes, got {plen}")
    params = mod.params_from_tuple(mod.params_struct.unpack_from(view, pos))
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
    return Encoded(codec, dtype, enc.shape, params, enc.buffers, mod.validate(enc))


def validate(enc: Encoded) -> Encoded:
    """Check an encoding from an untrusted source (any buffers) as `from_bytes` does; returns
    it with its nonzero count."""
    if enc.codec not in CODECS:
        raise ValueError(f"unknown codec {enc.codec!r}")
    mod = CODECS[enc.codec]
    if enc.dtype not in mod.dtypes:
        raise ValueError(f"the {enc.codec} codec does not encode {enc.dtype}")
    host = Encoded(enc.codec, enc.dtype, tuple(enc.shape), enc.params, enc.numpy().buffers)
    return Encoded(enc.codec, enc.dtype, tuple(enc.shape), enc.params, enc.buffers,
                   mod.validate(host))


def expect_buffers(enc: Encoded, count: int) -> None:
    if len(enc.buffers) != count:
        raise ValueError(f"{enc.codec} encoding needs {count} buffers, has {len(enc.buffers)}")
