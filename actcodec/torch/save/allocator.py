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

import hashlib
import importlib.util
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

        source = os.path.join(os.path.dirname(__file__), "_allocator.cpp")
        with open(source, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:12]
        # One build per torch version and source: a build there is this source's, so it is
        # loaded as it is (torch's load() imports its build tools and runs ninja to check
        # it: 0.15 s of every process's first step)
        version = re.sub(r"\W", "_", torch.__version__)
        name = f"actcodec_torch_allocator_{version}_{digest}"
        built = _build_directory_guess(name)
        module = _load_built(name, os.path.join(built, name + ".so")) if built else None
        if module is None:
            from torch.utils.cpp_extension import _get_build_directory, load

            where = _get_build_directory(name, verbose=False)
            print(f"actcodec: compiling its torch allocator, which keeps freed activations "
                  f"out of the process's heap (once per torch version, about a minute; cached "
                  f"in {where})", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            module = load(name=name, sources=[source], extra_cflags=["-O2"], verbose=False)
            print(f"actcodec: allocator built in {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
        _MODULE.append(module)
    return _MODULE[0]


def _build_directory_guess(name: str) -> str | None:
    """Where torch.utils.cpp_extension builds `name` (its layout: TORCH_EXTENSIONS_DIR, or
    the user's cache by Python version and accelerator), or None where that is not known:
    then torch's own answer is asked (a guess gone wrong only costs torch's slower path)."""
    import torch

    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        try:
            from torch import _appdirs  # what cpp_extension asks, without its build tools
            cache = _appdirs.user_cache_dir(appname="torch_extensions")
        except (ImportError, AttributeError):
            return None
        hip, cuda = torch.version.hip, torch.version.cuda
        accelerator = f"rocm{hip.replace('.', '')}" if hip else \
            f"cu{cuda.replace('.', '')}" if cuda else "cpu"
        python = f"py{sys.version_info.major}{sys.version_info.minor}" \
            f"{getattr(sys, 'abiflags', '')}"
        root = os.path.join(os.path.realpath(cache), f"{python}_{accelerator}")
    return os.path.join(root, name)


def _load_built(name: str, path: str):
    """The extension built at `path`, or None where it does not load (a partial build)."""
    spec = importlib.util.spec_from_file_location(name, path)
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError:
        return None
    return module


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
