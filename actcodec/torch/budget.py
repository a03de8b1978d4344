"""A byte budget for what a training step holds for backward (DAF 3.4, Sage, Melon).

`compress_saved(budget=...)` replaces the choice of bits by a budget: at no moment does the
step hold more bytes for backward than the budget (`stats.peak_stored_bytes`).

- **Importance.** Each save is a *site* (its op, layer, shape and dtype, and how many such
  saves came before it in the step). The min/max pass the quantizer runs anyway gives each
  group's step size, so the noise energy each bit width would add is known once the site has
  been encoded: at k bits it is that of 1 bit over (2^k - 1)^2. It is taken relative to the
  tensor's energy and weighted by how the op's backward amplifies it (normalisation inputs,
  softmax outputs, the model's input: AMPLIFY). Lossless costs no error.
- **Plan.** At each step's start the sites the last steps learned get bits greedily by error
  removed per byte (DAF 3.4.1): all start at the fewest bits, and the upgrade with the best
  ratio is taken while the total fits the budget, less what is held at sizes no bits change
  (kept tensors, masks, integers) and a margin for payloads whose size follows the data. A
  site the plan does not know (the first step, a new shape) starts at the policy's bits.
- **Making room.** A save that does not fit is made to: the live saves (itself included)
  that lose least per byte freed are re-encoded at fewer bits, down to MIN_BITS; when that is
  not enough, the least important per byte are paged out to a temporary file and read back in
  backward (PORT/POET-style paging). Lowering `ctx.budget`, from any thread, makes room at
  once the same way.

Tensors kept as they are (smaller than the policy's `min_bytes`, or a kind no codec takes)
count toward the budget but are neither re-encoded nor paged out; `stats.over_budget` counts
the saves a budget below them could not hold.
"""
from __future__ import annotations

import heapq
import math
import os
import re
import tempfile
import threading
import weakref
from dataclasses import dataclass, replace

import numpy as np
import torch

from .. import choice
from . import packing

CHOICES = (2, 4, 8, None)  # bits, fewest first; None: lossless. 1 bit: gradient cosines ~0.3
MIN_BITS = 2  # what making room re-encodes down to before it pages out
# A budget without a policy: groups of 64, whose 2-bit gradients are much closer to the exact
# ones than groups of 256 (see policy.PRESETS["2bit"]); the plan counts their bytes.
POLICY = {"group_size": 64}
MARGIN = 0.03  # of the budget the plan leaves for payloads whose size follows the data
AMPLIFY = {"batch_norm": 64.0, "layer_norm": 64.0, "group_norm": 64.0, "softmax": 64.0,
           "input": 64.0}

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 10**3, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40,
          "tb": 10**12, "tib": 1 << 40}


def parse_bytes(budget) -> int | None:
    """A budget as bytes: an int, or a string such as "256MiB", "1.5 GB", "4096"; None: none."""
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer, str)):
        raise TypeError(f"budget must be a number of bytes or a string such as '256MiB', got "
                        f"{type(budget).__name__}")
    if isinstance(budget, str):
        m = re.fullmatch(r"\s*(-?[0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", budget)
        if m is None or m.group(2).lower() not in _UNITS:
            raise ValueError(f"cannot read budget {budget!r}: give bytes, or a number with a "
                             f"unit such as '256MiB', '1.5GB', '512KiB'")
        value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        value = int(budget)
    if value <= 0:
        raise ValueError(f"budget must be positive, got {budget!r}")
    return value


@dataclass
class Site:
    """What a step learned about one save: its element count, nonzeros, element size, group
    size, and its weighted noise at 1 bit relative to its energy (0: no error at any bits)."""

    n: int
    nnz: int
    esize: int
    group: int | None
    noise1: float

    def _sizes(self, bits) -> dict:
        return choice.sizes_from_counts(self.n, self.nnz, self.esize, bits, self.group)

    def nbytes(self, bits) -> int:
        sizes = self._sizes(bits)
        return sizes[choice.smallest(sizes)]

    def error(self, bits) -> float:
        if bits is None or choice.smallest(self._sizes(bits)) not in choice.LOSSY:
            return 0.0
        return self.noise1 / float((1 << bits) - 1) ** 2


def plan(sites: dict, budget: int) -> dict:
    """{site key: bits} within `budget` bytes in all: greedy by error removed per byte."""
    bits = {key: CHOICES[0] for key in sites}
    total = sum(site.nbytes(CHOICES[0]) for site in sites.values())
    heap, order = [], {key: i for i, key in enumerate(sites)}

    def push(key):
        i = CHOICES.index(bits[key])
        if i + 1 < len(CHOICES):
            site, nxt = sites[key], CHOICES[i + 1]
            cost = site.nbytes(nxt) - site.nbytes(bits[key])
            gain = site.error(bits[key]) - site.error(nxt)
            ratio = gain / cost if cost > 0 else math.inf
            heapq.heappush(heap, (-ratio, order[key], nxt, cost))

    keys = list(sites)
    for key in keys:
        push(key)
    while heap:
        _, i, nxt, cost = heapq.heappop(heap)
        if total + cost <= budget:
            total += cost
            bits[keys[i]] = nxt
            push(keys[i])
    return bits


def noise_at_one_bit(t: torch.Tensor, enc, op: str) -> float:
    """The weighted relative noise energy 1-bit quantization of t would add: from the group
    step sizes of its k-bit encoding `enc` (quant or bitmap_quant), else from the tensor's own
    min/max per group of 256."""
    energy = float(torch.linalg.vector_norm(t.detach(), dtype=torch.float32)) ** 2
    if energy == 0 or not math.isfinite(energy):
        return 0.0
    if enc is not None and enc.codec in choice.LOSSY:
        bits, group = enc.params["bits"], enc.params["group_size"] or enc.size
        scales = enc.buffers[3 if enc.codec == "bitmap_quant" else 2]
        scales = (scales.view(torch.float32) if isinstance(scales, torch.Tensor)
                  else torch.from_numpy(np.asarray(scales).view(np.float32)))
        steps1 = scales.double() * ((1 << bits) - 1)
    else:
        flat, group = t.detach().reshape(-1).float(), 256
        whole = flat.numel() // group * group
        if whole == 0:
            return 0.0
        lo, hi = torch.aminmax(flat[:whole].view(-1, group), dim=1)
        steps1 = (hi - lo).double()
    noise = float((steps1 ** 2).sum()) * group / 12.0
    return AMPLIFY.get(op, 1.0) * noise / energy


class Spill:
    """A temporary file that payloads are paged out to and read back from."""

    def __init__(self, directory: str | None = None):
        self.directory, self.file, self.end, self.live = directory, None, 0, 0
        self.lock = threading.Lock()

    def write(self, arrays) -> list:
        """Writes each uint8 array (numpy or CPU tensor); returns where each went."""
        with self.lock:
            if self.file is None:
                self.file = tempfile.TemporaryFile(dir=self.directory)
            where = []
            for a in arrays:
                data = np.ascontiguousarray(a.numpy() if isinstance(a, torch.Tensor) else a)
                written = os.pwrite(self.file.fileno(), memoryview(data).cast("B"), self.end)
                if written != data.nbytes:
                    raise OSError(f"actcodec: paged out {written} of {data.nbytes} bytes")
                where.append((self.end, data.nbytes))
                self.end += data.nbytes
            self.live += 1
            return where

    def read(self, where) -> list:
        """The arrays written at `where`, as uint8 CPU tensors."""
        out = []
        for offset, nbytes in where:
            t = torch.empty(nbytes, dtype=torch.uint8)
            got = os.preadv(self.file.fileno(), [memoryview(t.numpy())], offset) if nbytes else 0
            if got != nbytes:
                raise OSError(f"actcodec: read {got} of {nbytes} paged-out bytes back")
            out.append(t)
        return out

    def release(self) -> None:
        """One paged-out save is gone; the file is emptied when none is left."""
        with self.lock:
            self.live -= 1
            if self.live == 0 and self.file is not None:
                self.file.truncate(0)
                self.end = 0

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


@dataclass
class Entry:
    """A live save under the budget: the Packed, what accounting counts for it, what the
    plan knows of its site, and how it was encoded."""

    packed: weakref.ref
    held: object  # accounting.Held, once held
    site: Site | None
    setting: packing.Setting
    store: object

    @property
    def bits(self):
        return self.setting.bits


class Keeper:
    """The live saves of a compress_saved context under its budget, and what makes room."""

    def __init__(self, stats, spill_dir: str | None = None):
        self.stats, self.entries = stats, []
        self.spill = Spill(spill_dir)
        self.lock = threading.RLock()

    def admit(self, packed, site: Site | None, setting, store, budget: int) -> None:
        """Holds `packed` (just encoded at `setting`) for backward, first making room for it."""
        with self.lock:
            entry = Entry(weakref.ref(packed), None, site, setting, store)
            packed.lock = self.lock
            self._fit(budget, entry)
            entry.held = self.stats.hold(packed, packed.nbytes)
            self.entries.append(entry)
            if packed.spill is not None:
                weakref.finalize(packed, self.spill.release)

    def reserve(self, nbytes: int, budget: int) -> None:
        """Makes room for nbytes that are about to be held as they are."""
        with self.lock:
            self._fit(budget - nbytes, None)

    def shrink(self, budget: int) -> None:
        """Makes what is held fit a (lowered) budget now."""
        with self.lock:
            self._fit(budget, None)

    def _fit(self, budget: int, new: Entry | None) -> None:
        self.entries = [e for e in self.entries
                        if e.packed() is not None and e.packed().spill is None]
        while True:
            extra = new.packed().nbytes if new is not None else 0
            if self.stats.stored_bytes + extra <= budget:
                return
            pool = self.entries + ([new] if new is not None else [])
            if not (self._reencode_one(pool) or self._page_out_one(pool)):
                self.stats.over_budget += 1
                return

    def _reencode_one(self, pool) -> bool:
        """Re-encodes, at the next fewer bits, the save that loses least per byte freed."""
        best, best_ratio, best_bits = None, math.inf, None
        for e in pool:
            p = e.packed()
            lower = [b for b in CHOICES[:-1] if b >= MIN_BITS and (e.bits is None or b < e.bits)]
            if e.site is None or p.enc is None or p.spill is not None or not lower:
                continue
            freed = p.nbytes - e.site.nbytes(lower[-1])
            if freed <= 0:
                continue
            ratio = (e.site.error(lower[-1]) - e.site.error(e.bits)) / freed
            if ratio < best_ratio:
                best, best_ratio, best_bits = e, ratio, lower[-1]
        if best is None:
            return False
        p = best.packed()
        setting = replace(best.setting, bits=best_bits)
        fresh = packing.pack(p._restore(), setting, best.store, keep_dense=False)
        p.enc, p.layout = fresh.enc, fresh.layout
        best.setting = setting
        if best.held is not None:
            self.stats.resize(best.held, p.nbytes)
        self.stats.reencoded += 1
        return True

    def _page_out_one(self, pool) -> bool:
        """Pages out the save of least importance per byte: a CPU payload, or an integer
        tensor narrowed into memory of its own."""
        best, best_ratio = None, math.inf
        for e in pool:
            p = e.packed()
            if not _pageable(p):
                continue
            importance = e.site.error(e.bits) if e.site is not None else 0.0
            ratio = -1.0 / p.nbytes if importance == 0 else importance / p.nbytes
            if ratio < best_ratio:
                best, best_ratio = e, ratio
        if best is None:
            return False
        p = best.packed()
        nbytes = p.nbytes
        if p.enc is not None:
            where = self.spill.write(p.enc.buffers)
            p.spill, p.enc = (self.spill, where, replace(p.enc, buffers=())), None
        else:
            where = self.spill.write([p.kept.reshape(-1).view(torch.uint8)])
            p.spill, p.kept = (self.spill, where, (p.kept.dtype, tuple(p.kept.shape))), None
            p.version = None  # a copy of its own: nothing else changes it
        if best.held is not None:
            self.stats.resize(best.held, 0)
            weakref.finalize(p, self.spill.release)
        self.stats.spilled += 1
        self.stats.spilled_bytes += nbytes
        return True

    def close(self) -> None:
        self.spill.close()


def _pageable(p) -> bool:
    """Whether paging `p` out frees memory that it alone holds, on the CPU."""
    if p.spill is not None or p.nbytes == 0:
        return False
    if p.enc is not None:
        return all(not isinstance(b, torch.Tensor) or b.device.type == "cpu"
                   for b in p.enc.buffers)
    return p.layout is not None and p.kept.device.type == "cpu" and p.kept.is_contiguous()
