"""Array types other than numpy: a *backend* lets the core encode them and hold payload
buffers of their kind, without the core importing the library they come from.

A backend is registered under the top-level module name of its array type ("torch" for
torch.Tensor). The core finds it by an object's type: `of(x)`. A type whose library has a
backend that was never imported ("torch": actcodec.torch) gets it imported then, by name, so a
tensor handed to `actcodec.encode` works without `import actcodec.torch` first; if that import
fails, the error names it. Objects of other types are read with numpy.asarray.

What a backend provides (duck-typed; see actcodec/torch/backend.py):
- `host_bits(x)`: (flat unsigned numpy view of the element bits, dtype name, shape) for data
  in host memory, viewed without a copy where the layout allows; None for data on a device;
- `wrap(buf)`: a host payload buffer (flat uint8 numpy) as this backend's array, same memory;
- `encode(x, codec, **settings)`: the encoding of device data, computed on its device;
- `decode(enc, out, dtype, threads=, simd=)`: an encoding whose buffers are this backend's;
- `host_bytes(buf)`: a flat uint8 numpy view of a host buffer (ValueError on a device);
- `to_numpy(buf)`: a host copy of a device buffer, or host_bytes of a host one;
- `device(buf)` and `from_numpy(buf, device)`: where a buffer lives, and a copy there.
"""
from __future__ import annotations

import importlib

import numpy as np

_REGISTERED: dict = {}  # top-level module name -> backend
_IMPORTS = {"torch": "actcodec.torch"}  # backends the core knows by name, imported on demand


def register(name: str, backend) -> None:
    """Make `backend` the one for array types defined under the top-level module `name`."""
    _REGISTERED[name] = backend


def get(name: str):
    """The backend registered as `name`, importing a known one on demand."""
    backend = _REGISTERED.get(name)
    if backend is None and name in _IMPORTS:
        try:
            importlib.import_module(_IMPORTS[name])
        except ImportError as exc:
            raise ImportError(f"{name} arrays need actcodec's {name} backend, and "
                              f"`import {_IMPORTS[name]}` failed: {exc}") from exc
        backend = _REGISTERED.get(name)
    if backend is None:
        raise ValueError(f"no actcodec backend named {name!r}")
    return backend


def of(x):
    """The backend of x's type, or None (numpy, and anything numpy.asarray reads)."""
    if type(x) is np.ndarray:
        return None
    name = type(x).__module__.partition(".")[0]
    if name in _REGISTERED or name in _IMPORTS:
        return get(name)
    return None


def host_bytes(buf) -> np.ndarray:
    """A flat uint8 numpy view of a buffer in host memory (no copy)."""
    if type(buf) is np.ndarray:
        return buf.reshape(-1).view(np.uint8)
    backend = of(buf)
    return backend.host_bytes(buf) if backend is not None else \
        np.asarray(buf).reshape(-1).view(np.uint8)


def to_numpy(buf) -> np.ndarray:
    """A flat uint8 numpy array of a buffer's bytes: the host buffer itself, or a host copy."""
    backend = of(buf)
    return backend.to_numpy(buf) if backend is not None else host_bytes(buf)
