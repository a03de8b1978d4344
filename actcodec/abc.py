"""The interface every codec implements: one class per codec, one instance registered by
name and wire id in actcodec.registry.

A codec turns a flat run of element bits (a C-contiguous unsigned-integer numpy array, host
memory) into payload buffers, checks buffers it did not write, and decodes them into host
memory. Its size model says, from counts alone, how many payload bytes it would write: a dense
codec answers `nbytes`, a sparse one is a bitmap of the nonzero elements followed by those
elements stored by the dense codec it names (`values`), or by one element (`values = None`).
The codec choice (actcodec.choice) compares codecs by these models, never by encoding.
"""
from __future__ import annotations

import struct

import numpy as np

NO_PARAMS = struct.Struct("<")


class Codec:
    """One codec. Subclasses set the class attributes and implement the methods that apply."""

    name: str = ""                  # its name in the API and in Encoded.codec
    codec_id: int = 0               # its id in the byte format (docs/FORMAT.md)
    dtypes: tuple = ()              # element types it encodes
    lossy: bool = False             # whether decoding may differ from what was encoded
    decodes_to_float32: bool = False  # whether it may decode into float32 instead
    params_struct: struct.Struct = NO_PARAMS  # its parameters in the byte format
    sparse: bool = False            # a bitmap of the nonzero elements, then `values`
    values: str | None = None       # sparse: the dense codec storing the nonzero elements

    # ---- parameters ----
    def params_to_tuple(self, params: dict) -> tuple:
        return ()

    def params_from_tuple(self, values: tuple) -> dict:
        return {}

    # ---- size model ----
    def nbytes(self, count: int, esize: int, params: dict | None) -> int:
        """Payload bytes of `count` elements of `esize` bytes (dense codecs)."""
        raise NotImplementedError

    # ---- encode, validate, decode ----
    def encode(self, flat: np.ndarray, name: str, params: dict, opts: dict, alloc,
               work=None) -> tuple:
        """(buffers, nonzero count or None) of a flat bit view of `name` elements. `work`:
        what the encoder's survey already computed for this codec (see encoder.py)."""
        raise NotImplementedError

    def validate(self, enc) -> int | None:
        """Check buffers from an untrusted source before anything decodes them; raise
        ValueError naming the problem. Returns the nonzero count where the codec has one."""
        raise NotImplementedError

    def decode_into(self, enc, buffers: tuple, out_bytes: np.ndarray, target: str,
                    opts: dict) -> None:
        """Decode host `buffers` of `enc` into the flat uint8 view `out_bytes` of `target`
        elements (checked by the caller)."""
        raise NotImplementedError
