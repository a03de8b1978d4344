"""The memory of where a model lives, as a limit on it counts it: one small interface for the
process's resident memory (a model on the CPU) and a CUDA device's caching allocator (a model
on a GPU), so that a Step, its probes and its solver work the same on both.

- `held()`: what the limit is on, now: the process's RSS; on CUDA the bytes the caching
  allocator reserves (what runs out: a reservation that cannot grow is an out-of-memory
  error, whatever of it is free inside).
- `live()`: what is in use: RSS less what the allocators hold free (actcodec.resident.live);
  the allocated bytes. A step starts from it (its floor): the rest of `held()` is reused.
- `live_peak()`: a context whose `nbytes` is the block's peak of `live()`, where the meter
  can tell it (the allocated bytes' own counter; on the CPU, the store's under the step's
  allocator), else None: a probe's moments in backward are told apart by it.
- `peak()`: a context whose `nbytes` is the block's peak of `held()` (nesting, threads).
- `give_back()`: what the allocators hold free goes back (the store's kept pages;
  `torch.cuda.empty_cache`); `trim()`: glibc's free heap (nothing on a device).
- `start_probe(fresh)`: before a probe of the step's profile: the process's store ends a
  period (and, fresh, gives its kept pages back); a CUDA cache is always emptied, since the
  reservation only grows while it is kept and a probe would measure the probes before it.
- `capped(limit)`: a context in which the allocator itself keeps what is held under the
  limit (CUDA: the caching allocator's memory fraction; nothing on the CPU); `can_cap`:
  whether it does.
- `cold_probes`: whether a probe's allocations are served otherwise than a step's (CUDA's
  emptied cache), so that its seconds are taken from a second run; `step_clock()`: where a
  probe's seconds are not a step's, a clock of the step's own (DeviceClock; None on the CPU).
- `heap_below`: the bytes under which a tensor goes to the C heap (the CPU; 0 on CUDA).
- `synchronize()`: waits for the device's queued work (CUDA runs asynchronously; a probe's
  seconds must be its work's, not its launches').
- `capacity()`: the most `held()` could reach now (what is held and what is free:
  MemAvailable, or a cgroup's memory.max where lower; the device's free memory), for
  `limit="free"` and for a limit above what there is; `capacity_each_step`: whether a limit
  in bytes is held against it at every step (else when the limit is set and after an
  out-of-memory error: a driver call on CUDA).

`meter_for(model)` picks one from where the model's parameters are; a device other than the
CPU and CUDA gets a ValueError naming what is supported.
"""
from __future__ import annotations

import contextlib
import threading

import torch

from ... import resident
from ... import store as stores
from ..save import allocator


class ProcessMeter:
    """The process's resident memory (a model on the CPU)."""

    device = torch.device("cpu")
    cold_probes = False  # a probe's allocations are served as a step's are
    capacity_each_step = True  # /proc and the cgroup: cheap, and other processes move it
    # tensors smaller than this go to the C heap, whose holes a peak carries; larger ones to
    # actcodec's allocator, which a Step under a limit installs
    heap_below = allocator.THRESHOLD
    can_cap = False

    def capped(self, limit: int):
        return contextlib.nullcontext()

    def step_clock(self):
        return None  # the probes' seconds are a step's (see cold_probes)

    def held(self) -> int:
        return resident.rss()

    def live_peak(self):
        """A context whose `nbytes` is the peak of live bytes inside it (LivePeak), where
        the step's allocator puts the large tensors in the store; else None (RSS keeps the
        pages of what was freed, so a moment's peak is not told from the one before)."""
        if not allocator.installed() or not stores.made():
            return None
        return LivePeak(stores.made()[0])

    def live(self) -> int:
        return resident.live()

    def peak(self) -> resident.Peak:
        return resident.Peak()

    def give_back(self) -> None:
        # the store keeps the pages of the step before for one period: two periods end; a
        # period's end gives back only the pages above its highest live block, and the
        # gradients, made late in backward, sit above what the step freed: those go too
        stores.new_step(None)
        stores.new_step(None)
        for store in stores.made():
            store.give_back_free()

    def trim(self) -> int:
        return resident.trim_heap()

    def start_probe(self, fresh: bool) -> None:
        stores.new_step(None)
        if fresh:  # the store's pages kept from the probe before go back first
            stores.new_step(None)
            for store in stores.made():
                store.give_back_free()

    def synchronize(self) -> None:
        pass

    def capacity(self) -> int | None:
        available = resident.proc_kib("MemAvailable", "/proc/meminfo")
        most = None if available is None else resident.rss() + available * 1024
        cgroup = _cgroup_max()
        if cgroup is not None:
            most = cgroup if most is None else min(most, cgroup)
        return most


# One pair of peak readers per CUDA device (reserved, allocated), as resident has one for the
# process: the device's peak counters are global, and a reset by one reader would erase what
# another's open peaks saw.
_COUNTERS: dict = {}
_COUNTERS_LOCK = threading.Lock()


class LivePeak:
    """The peak of the process's live bytes inside a block (`nbytes`, read inside it): live
    bytes at its start, plus how far the store's bytes in use rose above their start (the
    store's own counter, restarted there), plus what the rest (the heap's small tensors)
    grew by at its end."""

    def __init__(self, store):
        self.store = store

    def __enter__(self) -> "LivePeak":
        self.store.restart_peak()
        self._live, self._used = resident.live(), self.store.stats()["used_bytes"]
        self._end = None
        return self

    def __exit__(self, *exc) -> None:
        self._end = self.nbytes

    @property
    def nbytes(self) -> int:
        if self._end is not None:
            return self._end
        s = self.store.stats()
        rest = max(0, resident.live() - self._live - (s["used_bytes"] - self._used))
        return self._live + max(0, s["peak_used_bytes"] - self._used) + rest


class AllocatorCap:
    """The memory fraction of one device's caching allocator, which is the process's: the
    tightest of the limits of the steps running on it now (threads), and the fraction the
    user had before the first of them, put back when the last ends."""

    def __init__(self, cuda, device):
        self.cuda, self.device = cuda, device
        self.lock = threading.Lock()
        self.limits: list = []
        self.before = 1.0

    def _apply(self) -> None:
        fraction = self.before
        if self.limits:
            total = self.cuda.get_device_properties(self.device).total_memory
            fraction = min(fraction, max(0.0, min(self.limits) / total))
        self.cuda.set_per_process_memory_fraction(float(fraction), self.device)

    def enter(self, limit: int) -> None:
        with self.lock:
            if not self.limits:
                self.before = self.cuda.get_per_process_memory_fraction(self.device)
            self.limits.append(limit)
            self._apply()

    def leave(self, limit: int) -> None:
        with self.lock:
            self.limits.remove(limit)
            self._apply()


_CAPS: dict = {}  # one AllocatorCap per CUDA device, as one peak reader


class CudaMeter:
    """A CUDA device's memory as PyTorch's caching allocator reserves it. `cuda`: the module
    whose counters it reads (torch.cuda; a stand-in in tests)."""

    # a probe starts from an emptied cache (see start_probe): its allocations go to the
    # driver, a step's come from the cache, so a probe's seconds are not a step's
    cold_probes = True
    heap_below = 0  # the caching allocator serves every size alike
    # what the device has free is a driver call (milliseconds on some drivers): a limit in
    # bytes is held against it when it is set and after an out-of-memory error, "free" reads
    # it every step
    capacity_each_step = False

    def __init__(self, device, cuda=None):
        self.device = torch.device(device)
        self.cuda = cuda if cuda is not None else torch.cuda
        if cuda is None:  # the device's counter is the process's: one reader for it
            with _COUNTERS_LOCK:
                if self.device not in _COUNTERS:
                    _COUNTERS[self.device] = self._counters()
                self.counter, self.live_counter = _COUNTERS[self.device]
                self.cap = _CAPS.setdefault(self.device, AllocatorCap(self.cuda, self.device))
        else:
            self.counter, self.live_counter = self._counters()
            self.cap = AllocatorCap(self.cuda, self.device)

    def _counters(self) -> tuple:
        """Readers of the device's peak reserved and peak allocated bytes, which one call
        resets together (so a reset through either folds both)."""
        reserved = resident.PeakCounter(self._max_reserved, self._reset)
        return reserved, resident.PeakCounter(self._max_allocated, self._reset, shares=reserved)

    def _stat(self, name: str, field: str) -> int:
        """One of the caching allocator's counters over all its pools, from its nested
        statistics (torch.cuda.memory_reserved and its kin flatten and sort all of them,
        about 130, in Python at every call: a step reads them a dozen times)."""
        return self.cuda.memory_stats_as_nested_dict(self.device).get(name, {}).get(
            "all", {}).get(field, 0)

    def _max_reserved(self) -> int:
        return self._stat("reserved_bytes", "peak")

    def _max_allocated(self) -> int:
        return self._stat("allocated_bytes", "peak")

    def _reset(self) -> bool:
        self.cuda.reset_peak_memory_stats(self.device)
        return True

    def held(self) -> int:
        return self._stat("reserved_bytes", "current")

    def live_peak(self) -> resident.Peak:
        """The peak of the allocated bytes (live tensors, as the allocator counts them when
        their ops are queued) inside a block."""
        return resident.Peak(counter=self.live_counter, now=self.live)

    def live(self) -> int:
        return self._stat("allocated_bytes", "current")

    def peak(self) -> resident.Peak:
        return resident.Peak(counter=self.counter, now=self.held)

    def give_back(self) -> None:
        self.cuda.empty_cache()

    def trim(self) -> int:
        return 0

    def start_probe(self, fresh: bool) -> None:
        self.give_back()

    def synchronize(self) -> None:
        self.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def capped(self, limit: int):
        """The caching allocator itself kept to `limit` reserved bytes: where a block does not
        fit the blocks cached (fragments of earlier sizes), it frees what is cached and
        tries again before it reserves beyond the limit, where it would otherwise reserve
        more. What live tensors truly need beyond it is an out-of-memory error. An older
        torch, without the fraction's getter, could not have a user's own fraction put back:
        there the allocator is left as it is."""
        if getattr(self.cuda, "get_per_process_memory_fraction", None) is None:
            yield
            return
        self.cap.enter(limit)
        try:
            yield
        finally:
            self.cap.leave(limit)

    @property
    def can_cap(self) -> bool:
        return getattr(self.cuda, "get_per_process_memory_fraction", None) is not None

    def capacity(self) -> int:
        free, _total = self.cuda.mem_get_info(self.device)
        return free + self.held()

    def step_clock(self) -> "DeviceClock":
        return DeviceClock(self.cuda, self.device)


class DeviceClock:
    """A step's time as the device ran it: events recorded around each repeated block's
    forward (`begin(i)`, `end(i)`; a block run in several micro-batches adds up) and around
    the whole step, read without a host wait once the device has passed them. A probe's
    seconds on such a device are mostly its launches' (one or two samples, a wait around each
    block); a step's, at its size, are its work's."""

    def __init__(self, cuda, device):
        self.cuda, self.device = cuda, device
        self._open: dict = {}
        self._marks: list = []  # (key, start event, end event)

    def _event(self):
        """An event recorded now on the model's device's stream (the current device may be
        another: an event records on the current device's)."""
        event = self.cuda.Event(enable_timing=True)
        event.record(self.cuda.current_stream(self.device))
        return event

    def begin(self, key) -> None:
        self._open.setdefault(key, []).append(self._event())

    def end(self, key) -> None:
        opened = self._open.get(key)
        if not opened:
            return
        self._marks.append((key, opened.pop(), self._event()))

    def read(self) -> dict | None:
        """Seconds per key, or None while the device has not run them all yet (or a
        forward did not end)."""
        if any(self._open.values()) or not self._marks or \
                not all(end.query() for _, _, end in self._marks):
            return None
        out: dict = {}
        for key, start, end in self._marks:
            out[key] = out.get(key, 0.0) + start.elapsed_time(end) / 1e3
        return out


SUPPORTED = "the CPU (the process's resident memory) and CUDA (the caching allocator's)"


def meter_for(model: torch.nn.Module, cuda=None):
    """The meter of where the model's parameters (else buffers) are: ProcessMeter on the CPU,
    a CudaMeter on a CUDA device, the CPU's for a model without either. ValueError for
    another device, or for parameters on several."""
    devices = {t.device for t in (*model.parameters(), *model.buffers())}
    if len(devices) > 1:
        raise ValueError(f"Step(limit=...) plans the memory of one device; this model has "
                         f"parameters or buffers on {sorted(map(str, devices))}")
    device = next(iter(devices), torch.device("cpu"))
    if device.type == "cpu":
        return ProcessMeter()
    if device.type == "cuda":
        index = device.index if device.index is not None else (
            cuda or torch.cuda).current_device()
        return CudaMeter(torch.device("cuda", index), cuda)
    raise ValueError(f"Step(limit=...) plans the memory of {SUPPORTED}; this model is on "
                     f"{device}. Use limit=None there (plain training through the same API)")


def _cgroup_max() -> int | None:
    """The process's cgroup v2 memory.max in bytes (None: unlimited or unknown)."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next((line.split(":", 2)[2].strip() for line in f
                         if line.startswith("0::")), None)
        if path is None:
            return None
        with open(f"/sys/fs/cgroup{path.rstrip('/')}/memory.max") as f:
            value = f.read().strip()
    except (OSError, StopIteration):
        return None
    return None if value == "max" else int(value)
