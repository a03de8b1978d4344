"""Opt-in: torch's CPU allocations of `threshold` bytes and more from actcodec's store.

Under compression a training step allocates and frees thousands of full-size activations
among the small, long-lived allocations everything else makes; glibc's heap keeps the holes
(measured: 0.9-1.3 GB free inside a 1.2-1.6 GB heap on a GPT-2 step whose live bytes peak at
0.4 GB), so the process's memory hardly falls with the saved bytes. Installed, the large
tensors take pages of the store instead: no small allocation lands between them, their pages
are reused step after step, and the store gives back what a step no longer needs.

    import actcodec.torch as act
    act.allocator.install()            # once, before training; uninstall() restores torch's

This changes how the whole process allocates CPU tensors, so it is opt-in. It compiles a
small C++ file against the installed torch on first use (a C++ compiler and ninja are needed;
torch caches the build, so later processes load it at once)."""
from __future__ import annotations

import os
import re
import threading

from .. import _ext
from .. import store as stores

THRESHOLD = 1 << 20
_LOCK = threading.Lock()
_MODULE: list = []


def _build():
    if not _MODULE:
        import torch
        from torch.utils.cpp_extension import load

        source = os.path.join(os.path.dirname(__file__), "_allocator.cpp")
        # One build per torch version: torch's build cache is keyed by the name and sources.
        name = "actcodec_torch_allocator_" + re.sub(r"\W", "_", torch.__version__)
        _MODULE.append(load(name=name, sources=[source], extra_cflags=["-O2"], verbose=False))
    return _MODULE[0]


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
        module.install(store.address, alloc, release, threshold)


def uninstall() -> None:
    """torch's own allocator again for new tensors (those from the store go back to it)."""
    with _LOCK:
        if _MODULE:
            _MODULE[0].uninstall()


def installed() -> bool:
    return bool(_MODULE) and _MODULE[0].installed()
