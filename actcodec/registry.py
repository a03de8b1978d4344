"""The codecs by name and by wire id. Registration is explicit: actcodec/__init__.py
registers the built-in codecs, in the order the codec choice breaks ties (lossless first)."""
from __future__ import annotations

from .abc import Codec

CODECS: dict = {}  # name -> the registered Codec instance
_BY_ID: dict = {}


def register(codec: Codec) -> Codec:
    """Make `codec` known by its name and wire id (both must be new)."""
    if not isinstance(codec, Codec):
        raise TypeError(f"register needs an actcodec.abc.Codec instance, got {type(codec).__name__}")
    if codec.name in CODECS or codec.codec_id in _BY_ID:
        raise ValueError(f"a codec named {codec.name!r} or with id {codec.codec_id} is already "
                         f"registered")
    CODECS[codec.name] = codec
    _BY_ID[codec.codec_id] = codec
    return codec


def get(name: str) -> Codec:
    codec = CODECS.get(name)
    if codec is None:
        raise ValueError(f"unknown codec {name!r} (known: {', '.join(CODECS)})")
    return codec


def by_id(codec_id: int) -> Codec:
    codec = _BY_ID.get(codec_id)
    if codec is None:
        raise ValueError(f"unknown codec id {codec_id} (known: "
                         f"{', '.join(f'{c.codec_id}={c.name}' for c in CODECS.values())})")
    return codec
