"""The numcodecs wrappers: codec objects in the numcodecs style (``encode`` returns the container bytes, ``decode``
restores the array, ``get_config``/``from_config`` round-trip the settings), registered under
numcodecs' entry-point group, so ``numcodecs.get_codec({"id": "actcodec.bitmap"})`` finds them
and zarr can use them. numcodecs itself is optional: these classes need only numpy."""
from __future__ import annotations

import numpy as np

from . import _dtypes, container, encoder, quant
from .registry import CODECS

try:  # zarr and numcodecs' own checks want their base class; it is optional here
    from numcodecs.abc import Codec as _Base
except ImportError:  # pragma: no cover - depends on the environment
    _Base = object


class Codec(_Base):
    """The numcodecs interface over an actcodec codec: the bytes are the container format."""

    codec_id = "actcodec"
    codec_name: str | None = None

    def encode(self, buf) -> bytes:
        return self._encode(np.asarray(buf)).to_bytes()

    def decode(self, buf, out=None) -> np.ndarray:
        enc = container.from_bytes(buf)
        if self.codec_name is not None and enc.codec != self.codec_name:
            raise ValueError(f"{type(self).__name__} cannot decode a {enc.codec!r} encoding")
        if out is None:
            return enc.decode()
        # numcodecs hands a buffer of the right size, not always of the right shape or dtype
        target = np.asarray(out)
        if not target.flags.c_contiguous:
            raise ValueError("out must be C-contiguous")
        raw_bytes = target.reshape(-1).view(np.uint8)
        if raw_bytes.nbytes != enc.original_nbytes:
            raise ValueError(f"out holds {raw_bytes.nbytes} bytes, the encoding decodes to "
                             f"{enc.original_nbytes}")
        enc.decode(out=raw_bytes.view(_dtypes.numpy_dtype(enc.dtype)).reshape(enc.shape))
        return out

    def get_config(self) -> dict:
        return {"id": self.codec_id, **self._config()}

    @classmethod
    def from_config(cls, config: dict):
        config = dict(config)
        cid = config.pop("id", cls.codec_id)
        if cid != cls.codec_id:
            raise ValueError(f"config is for codec {cid!r}, not {cls.codec_id!r}")
        return cls(**config)

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self._config().items())
        return f"{type(self).__name__}({args})"


class Bitmap(Codec):
    """Lossless sparse bitmap codec; `prune` > 0 makes it lossy (|x| < prune -> 0)."""

    codec_id = "actcodec.bitmap"
    codec_name = "bitmap"

    def __init__(self, prune: float = 0.0):
        CODECS["bitmap"].params_from_tuple((float(prune),))  # validates
        self.prune = float(prune)

    def _encode(self, buf):
        return encoder.encode(buf, "bitmap", prune=self.prune)

    def _config(self):
        return {"prune": self.prune}


class Raw(Codec):
    """Stores the elements unchanged, in the same container."""

    codec_id = "actcodec.raw"
    codec_name = "raw"

    def _encode(self, buf):
        return encoder.encode(buf, "raw")

    def _config(self):
        return {}


class Mask(Codec):
    """A mask (bool, or floats whose nonzero elements are one value) at 1 bit per element."""

    codec_id = "actcodec.mask"
    codec_name = "mask"

    def _encode(self, buf):
        return encoder.encode(buf, "mask")

    def _config(self):
        return {}


class _Quantized(Codec):
    """Shared settings of the k-bit codecs."""

    def __init__(self, bits: int = 8, group_size: int | None = 256, rounding: str = "nearest",
                 seed: int = 0, nonfinite: str = "raise"):
        self._p = quant.check_params(bits, group_size, rounding, nonfinite, seed)

    def _encode(self, buf):
        return encoder.encode(buf, self.codec_name, **self._p)

    def _config(self):
        return dict(self._p)


class Quant(_Quantized):
    """Dynamic k-bit quantization, per group of `group_size` elements."""

    codec_id = "actcodec.quant"
    codec_name = "quant"


class BitmapQuant(_Quantized):
    """Bitmap of the nonzeros (exact zeros) + k-bit quantization of the nonzero values."""

    codec_id = "actcodec.bitmap_quant"
    codec_name = "bitmap_quant"


class Auto(Codec):
    """Picks the smallest encoding `bits` allows (None: lossless only); decodes any."""

    codec_id = "actcodec.auto"
    codec_name = None

    def __init__(self, bits: int | None = None, group_size: int | None = 256,
                 rounding: str = "nearest", seed: int = 0):
        if bits is not None:
            quant.check_params(bits, group_size, rounding, "raise", seed)
        self._p = {"bits": bits, "group_size": group_size, "rounding": rounding, "seed": seed}

    def _encode(self, buf):
        return encoder.encode(buf, "auto", **self._p)

    def _config(self):
        return dict(self._p)
