"""torch's CPU allocations of `threshold` bytes and more from actcodec's store.

Under compression a training step allocates and frees thousands of full-size activations
among the small, long-lived allocations everything else makes; glibc's heap keeps the holes
(measured: 0.9-1.3 GB free inside a 1.2-1.6 GB heap on a GPT-2 step whose live bytes peak at
0.4 GB), so the process's memory hardly falls with the saved bytes. Installed, the large
tensors take pages of the store instead: no small allocation lands between them, their pages
are reused step after step, and the store gives back what a step no longer needs.

`compress_saved` installs it on first use (`allocator=False` opts out): without it, the
default path would raise a compressed step's peak rather than lower it. Like torch's own
allocator it is one per process, and it outlives the context, so backward and the steps after
use it too. Training without compress_saved installs it by hand:

    import actcodec.torch as act
    act.allocator.install()            # once, before training; uninstall() restores torch's

It compiles a small C++ file against the installed torch on first use (a C++ compiler and
ninja are needed; a message says so while it builds, and torch caches the build, so later
processes load it at once). Where it cannot be built, `ensure` warns once and training goes on
with torch's allocator."""
from __future__ import annotations

import os
import re
import sys
import threading
import time
import warnings

from ... import _ext, resident
from ... import store as stores

THRESHOLD = 1 << 20
_LOCK = threading.Lock()
_MODULE: list = []  # the built module, once loaded (one per process)
_UNAVAILABLE: list = []  # why it could not be built, once that was found


def _build():
    if not _MODULE:
        import torch
        from torch.utils.cpp_extension import _get_build_directory, load

        source = os.path.join(os.path.dirname(__file__), "_allocator.cpp")
        # One build per torch version: torch's build cache is keyed by the name and sources.
        name = "actcodec_torch_allocator_" + re.sub(r"\W", "_", torch.__version__)
        where = _get_build_directory(name, verbose=False)
        cached = os.path.exists(os.path.join(where, name + ".so"))
        if not cached:
            print(f"actcodec: compiling its torch allocator, which keeps freed activations out "
                  f"of the process's heap (once per torch version, about a minute; cached in "
                  f"{where})", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        _MODULE.append(load(name=name, sources=[source], extra_cflags=["-O2"], verbose=False))
        if not cached:
            print(f"actcodec: allocator built in {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    return _MODULE[0]


def ensure() -> bool:
    """Install the allocator if no install has happened yet (the default threshold and store);
    True once it is installed. Where it cannot be built, one warning says what is lost and
    False is returned from then on."""
    if _MODULE and _MODULE[0].installed():
        return True
    if _UNAVAILABLE:
        return False
    if _MODULE:  # built, and uninstalled by hand: that choice stands
        return False
    try:
        install()
    except Exception as exc:  # noqa: BLE001 - no compiler, no ninja, a failed build
        with _LOCK:
            if not _UNAVAILABLE:
                _UNAVAILABLE.append(exc)
                warnings.warn(
                    f"actcodec could not build its torch allocator ({type(exc).__name__}: "
                    f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}). "
                    f"compress_saved still compresses what backward holds, but freed "
                    f"activations stay in the process's heap, so its peak memory may not fall. "
                    f"Install a C++ compiler and ninja, or pass allocator=False to use torch's "
                    f"allocator without this warning.", RuntimeWarning, stacklevel=3)
        return False
    return True


def install(threshold: int = THRESHOLD, store=None) -> None:
    """Route torch's CPU allocations of at least `threshold` bytes to `store` (default: the
    process's store, which holds compress_saved's payloads too). The first install fixes the
    store; a later one may change the threshold. compress_saved ends a store period at each
    step; training without it calls `actcodec.store.new_step(None)` at each step's start, or
    the store keeps the pages of its largest step."""
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ValueError(f"threshold must be a positive int, got {threshold!r}")
    with _LOCK:
        module = _build()
        store = store if store is not None else stores.default()
        store.pin()  # the allocator holds its address, for as long as the process lives
        alloc, release = _ext.store_functions()
        first = not module.installed()
        module.install(store.address, alloc, release, threshold)
    if first:
        # tensors freed before the install (a plain forward's, say) would otherwise keep their
        # pages resident in the heap for the life of the process, now that large tensors come
        # from the store
        resident.trim_heap()


def uninstall() -> None:
    """torch's own allocator again for new tensors (those from the store go back to it)."""
    with _LOCK:
        if _MODULE:
            _MODULE[0].uninstall()


def installed() -> bool:
    return bool(_MODULE) and _MODULE[0].installed()
