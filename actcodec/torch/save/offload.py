"""What backward needs, held in pinned host memory instead of the GPU's (offload):

    with actcodec.torch.offload_saved():
        loss = model(x)          # each save is copied to host memory as forward goes on
    loss.backward()              # and copied back, the next ones ahead, as backward needs them

Exact: the values come back as they went. Each save of a CUDA tensor (at least `min_bytes`,
not a parameter) is copied to a pinned host buffer on a side stream once the
compute stream has produced it (the side stream waits for the compute stream, never the
host); the tensor's memory is given back to the caching allocator as soon as the compute
stream no longer uses it and the copy has read it (record_stream); where more than
`in_flight` bytes of copies are still running, forward waits for the oldest. In backward, a save's
copy back is started on the side stream (if it was not prefetched), the compute stream waits
for it by an event, and the copies back of the `prefetch` saves packed before it are started
at once: backward meets saves in the reverse of the order forward made them, so they are
ready when it gets there. The host buffers come from a pool (`PinnedPool`, per context) that
keeps them for the next step: pinning memory is slow, and a copy into memory pinned on the
fly does not overlap. A buffer goes back to the pool when its save is gone (the graph freed).

The copies go through a `Copies` object: `CudaCopies` on a GPU; tests put a stand-in in its
place (synchronous copies on the CPU that log what happens), since the bookkeeping (what is
copied when, the pool's reuse, the prefetch order) is the same.
"""
from __future__ import annotations

import math
import threading
import time
import weakref

import torch

MIN_BYTES = 1 << 16  # smaller saves stay where they are: a copy each costs more than they hold
PREFETCH = 2  # saves whose copy back starts ahead of backward reaching them
# Bytes whose copy out may still run while forward goes on. A save's device memory is free
# only once its copy has read it, and forward makes saves faster than a host link copies
# them: beyond this, forward waits for the oldest copies, so that what offloading holds on
# the device stays bounded.
IN_FLIGHT = 256 << 20


def size_class(nbytes: int) -> int:
    """The pool's buffer size for a request: the next power of two up to 1 MiB, above it the
    next multiple of an eighth of the power of two below (at most 1/8 more than asked)."""
    if nbytes <= 1 << 20:
        return 1 << max(0, (nbytes - 1).bit_length())
    step = 1 << (int(math.log2(nbytes)) - 3)
    return -(-nbytes // step) * step


class PinnedPool:
    """Host buffers (uint8 tensors) by size class and device, kept for reuse. `made`: bytes
    allocated so far; `reused`: requests served from the pool.

    A buffer goes back to copies of the device it served: its last copy back and the next
    copy out into it then run on that device's side stream, in order, while another
    device's stream would not wait for the copy back still reading it."""

    def __init__(self, make):
        self._make = make
        self._free: dict = {}
        self._lock = threading.Lock()
        self.made = 0
        self.reused = 0

    def take(self, nbytes: int, device=None) -> torch.Tensor:
        size = size_class(nbytes)
        with self._lock:
            free = self._free.get((size, device))
            if free:
                self.reused += 1
                return free.pop()
            self.made += size
        return self._make(size)

    def give(self, buffer: torch.Tensor, device=None) -> None:
        with self._lock:
            self._free.setdefault((buffer.numel(), device), []).append(buffer)

    def held(self) -> int:
        """Bytes of buffers in the pool now (not in use)."""
        with self._lock:
            return sum(size * len(b) for (size, _), b in self._free.items())

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


class CudaCopies:
    """Copies between CUDA devices and pinned host memory on one side stream per device."""

    def __init__(self):
        self._streams: dict = {}

    def applies(self, t: torch.Tensor) -> bool:
        return t.is_cuda

    def _stream(self, device):
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]

    @staticmethod
    def host_buffer(nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def to_host(self, t: torch.Tensor, host: torch.Tensor):
        """Starts copying t's values into host (its bytes, t's shape, contiguous) once the
        compute stream has made t; returns the copy's event."""
        side = self._stream(t.device)
        side.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(side):
            as_values(host, t.dtype, t.shape).copy_(t, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        t.record_stream(side)  # its memory is not reused before the copy has read it
        return done

    def to_device(self, host: torch.Tensor, device):
        """Starts copying host's bytes into a new tensor on the device; returns (it, its
        event). The tensor is the compute stream's (the caching allocator keeps a pool per
        stream: one made on the side stream would go back to that pool, out of backward's
        reach), so the side stream waits for the compute stream's queued work before it
        writes there; the same stream copied the bytes out: the copy back follows it."""
        main = torch.cuda.current_stream(device)
        out = torch.empty(host.numel(), dtype=torch.uint8, device=device)
        side = self._stream(device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            out.copy_(host, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        out.record_stream(side)
        return out, done

    @staticmethod
    def wait(done) -> None:
        """The host waits for a copy (forward, where too many are still running)."""
        done.synchronize()

    def use(self, out: torch.Tensor, done) -> torch.Tensor:
        """The compute stream waits for the copy back (no host sync)."""
        torch.cuda.current_stream(out.device).wait_event(done)
        return out


def as_values(host: torch.Tensor, dtype, shape) -> torch.Tensor:
    """A byte buffer seen as a contiguous tensor of this dtype and shape."""
    return host.view(dtype).view(shape)


class _Save:
    """One offloaded save: its shape, dtype, device, host bytes and, once its copy back has
    started, the device tensor and event. Its host buffer goes back to the pool with it."""

    __slots__ = ("shape", "dtype", "device", "nbytes", "buffer", "pool", "back", "order",
                 "index", "users", "left", "done", "__weakref__")

    def __del__(self):
        pool, buffer = getattr(self, "pool", None), getattr(self, "buffer", None)
        if pool is not None and buffer is not None:
            pool.give(buffer, self.device)


class Offload:
    """The saved-tensor hooks (see the module doc); reusable: each `with` is a forward.
    `stats`: saves offloaded and their bytes, copies back started ahead (prefetched) and on
    demand, over the context's life."""

    def __init__(self, copies=None, min_bytes: int = MIN_BYTES, prefetch: int = PREFETCH,
                 in_flight: int = IN_FLIGHT):
        if prefetch < 0:
            raise ValueError(f"prefetch must be at least 0, got {prefetch!r}")
        self.copies = copies if copies is not None else CudaCopies()
        self.min_bytes = int(min_bytes)
        self.prefetch = int(prefetch)
        self.in_flight = int(in_flight)
        self._running: list = []  # (event, bytes) of copies out not yet waited for
        self._seen: dict = {}
        self.pool = PinnedPool(self.copies.host_buffer)
        self.stats = {"saves": 0, "bytes": 0, "prefetched": 0, "on_demand": 0, "waits": 0}
        self._hooks = None
        self._order: list = []

    def __enter__(self) -> "Offload":
        self._order = []  # weak references to this forward's saves, in the order made
        self._seen = {}  # (pointer, dtype, shape, strides) -> (the tensor, its save), weakly
        self._running = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        hooks, self._hooks = self._hooks, None
        hooks.__exit__(*exc)

    def _pack(self, t: torch.Tensor):
        nbytes = t.numel() * t.element_size()
        base = t if t._base is None else t._base
        if (base.is_leaf and base.requires_grad) or nbytes < self.min_bytes or \
                not self.copies.applies(t):
            return t  # a parameter or its view (held anyway), small, on another device
        # A tensor saved by several operations goes once, while the tensor first saved
        # lives (then its memory is not another's). A view is copied as its values: a
        # storage is freed once all its views saved are offloaded, so none may stay.
        key = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
        tensor, known = self._seen.get(key, (lambda: None, lambda: None))
        if tensor() is not None and known() is not None:
            s = known()
            s.users += 1
            s.left += 1
            return s
        s = _Save()
        s.shape, s.dtype, s.device, s.nbytes = t.shape, t.dtype, t.device, nbytes
        s.pool, s.buffer, s.back = self.pool, self.pool.take(nbytes, t.device), None
        s.users = s.left = 1  # operations that saved it; of them, still to unpack it
        s.done = False  # all its users had it: backward is past it (not prefetched again)
        self._running.append((self.copies.to_host(t, s.buffer[:nbytes]), nbytes))
        while sum(n for _, n in self._running) > self.in_flight:
            self.copies.wait(self._running.pop(0)[0])
            self.stats["waits"] += 1
        s.order, s.index = self._order, len(self._order)
        self._order.append(weakref.ref(s))
        self._seen[key] = (weakref.ref(t), self._order[-1])
        self.stats["saves"] += 1
        self.stats["bytes"] += nbytes
        return s

    def _fetch(self, s: _Save) -> None:
        s.back = self.copies.to_device(s.buffer[:s.nbytes], s.device)

    def _unpack(self, s):
        if not isinstance(s, _Save):
            return s
        if s.back is None:
            self._fetch(s)
            self.stats["on_demand"] += 1
        out, done = s.back
        s.left -= 1
        if s.left == 0:  # its last user has it: a second backward copies it back again
            s.back, s.left, s.done = None, s.users, True
        for i in range(s.index - 1, max(-1, s.index - 1 - self.prefetch), -1):
            ahead = s.order[i]()
            if ahead is not None and ahead.back is None and not ahead.done:
                self._fetch(ahead)
                self.stats["prefetched"] += 1
        return as_values(self.copies.use(out, done), s.dtype, s.shape)


def offload_saved(min_bytes: int = MIN_BYTES, prefetch: int = PREFETCH,
                  in_flight: int = IN_FLIGHT, copies=None) -> Offload:
    """A context that offloads what forward saves for backward to pinned host memory (see the
    module doc). Reusable across steps (its pinned buffers are kept for the next)."""
    return Offload(copies, min_bytes, prefetch, in_flight)


def round_trip_seconds(t: torch.Tensor, copies=None) -> float:
    """Seconds to copy a device tensor to pinned host memory and back (the best of three,
    after one to pin the buffer); 0.0 for a tensor off any GPU."""
    if not t.is_cuda:
        return 0.0
    copies = copies if copies is not None else CudaCopies()
    host = copies.host_buffer(t.numel() * t.element_size())[:t.numel() * t.element_size()]
    best = float("inf")
    for _ in range(4):
        torch.cuda.synchronize(t.device)
        t0 = time.perf_counter()
        copies.to_host(t, host)
        out, done = copies.to_device(host, t.device)
        copies.use(out, done)
        torch.cuda.synchronize(t.device)
        best = min(best, time.perf_counter() - t0)
    return best
