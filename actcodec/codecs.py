"""Codec objects in the numcodecs style: ``encode`` returns the container bytes, ``decode``
restores the array, and ``get_config``/``from_config`` round-trip the settings."""
from __future__ import annotations

import numpy as np

from . import bitmap, container, raw


class Codec:
    codec_id = "actcodec"

    def encode(self, buf) -> bytes:
        return self._encode(buf).to_bytes()

    def decode(self, buf, out=None) -> np.ndarray:
        enc = container.from_bytes(buf)
        if enc.codec != self.codec_name:
            raise ValueError(f"{type(self).__name__} cannot decode a {enc.codec!r} encoding")
        return enc.decode(out)

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
        bitmap.params_from_tuple((float(prune),))  # validates
        self.prune = float(prune)

    def _encode(self, buf):
        return bitmap.encode(buf, prune=self.prune)

    def _config(self):
        return {"prune": self.prune}


class Raw(Codec):
    """Stores the elements unchanged, in the same container."""

    codec_id = "actcodec.raw"
    codec_name = "raw"

    def _encode(self, buf):
        return raw.encode(buf)

    def _config(self):
        return {}
