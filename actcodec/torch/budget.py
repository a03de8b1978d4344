"""A byte budget for what a training step holds for backward (DAF 3.4, Sage, Melon).

`compress_saved(budget=...)` replaces the choice of bits by a budget: at no moment does the
step hold more bytes for backward than the budget (`stats.peak_stored_bytes`).

- **Importance.** Each save is a *site* (its op, layer, shape and dtype, and how many such
  saves came before it in the step). The min/max pass the quantizer runs anyway gives each
  group's range, so the noise energy each choice (bits and group size, CHOICES) would add is
  known once the site has been encoded: at k bits it is that of 1 bit over (2^k - 1)^2, and
  coarser groups' ranges follow from finer ones'. It is taken relative to the tensor's energy
  and weighted by how the op's backward amplifies it (normalisation inputs, softmax outputs,
  the model's input: AMPLIFY). Lossless costs no error.
- **Plan.** At each step's start the sites the last steps learned get their choices greedily
  by error removed per byte (DAF 3.4.1), each up the lower convex hull of its (bytes, error)
  choices: all start at the fewest bytes, and the step up with the best ratio is taken while
  the total fits the budget, less what is held at sizes no choice changes (kept tensors,
  masks, integers) and a margin for payloads whose size follows the data. The plan is kept
  while the budget, the sites and the last step's fit stay the same. A site the plan does not
  know (the first step, a new shape) starts at 8 bits in groups of 64 (POLICY).
- **Making room.** A save that does not fit is made to: the live saves (itself included)
  that lose least per byte freed are re-encoded a step down, to MIN_BITS at most; when that is
  not enough, the least important per byte are paged out to a temporary file and read back in
  backward (PORT/POET-style paging). Lowering `ctx.budget`, from any thread, makes room at
  once the same way. A budget of 0 holds nothing in memory: every save is paged out as it
  comes, at the policy's bits (fewer bits would free no memory).

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

# What a save may be stored as: (bits, group size) or None (lossless). Groups of 64 cost a bit
# per element more than groups of 256. 2 bits come in groups of 64 only: the noise model
# underrates 2-bit groups of 256 (with them a ResNet-18's gradient cosine at the 2-bit preset's
# bytes fell from 0.84 to 0.58, bench/budget_fidelity.py); 1 bit leaves cosines near 0.3.
CHOICES = ((2, 64), (4, 256), (4, 64), (8, 256), (8, 64), None)
GROUPS = (64, 256)  # each a multiple of the one before: finer stats give the coarser exactly
MIN_BITS = 2  # what making room re-encodes down to before it pages out
# Saves whose op amplifies error (AMPLIFY) take at least this many bits, in the plan and when
# making room: below it, what does not fit is paged out instead. All at 2 bits, a byte-level
# language model's LayerNorm and softmax saves made its training diverge (the demo's text task).
SENSITIVE_MIN_BITS = 4
# A budget without a policy starts unknown saves at 8 bits in groups of 64: the stats of the
# finest group size give every coarser one's noise exactly.
POLICY = {"bits": 8, "group_size": GROUPS[0]}
MARGIN = 0.03  # of the budget the plan leaves for payloads whose size follows the data
AMPLIFY = {"batch_norm": 64.0, "layer_norm": 64.0, "group_norm": 64.0, "softmax": 64.0,
           "input": 64.0}

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 10**3, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40,
          "tb": 10**12, "tib": 1 << 40}


def parse_bytes(budget) -> int | None:
    """A budget as bytes: an int, or a string such as "256MiB", "1.5 GB", "4096"; None: none;
    0: nothing held in memory."""
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
    if value < 0:
        raise ValueError(f"budget must be 0 or more bytes, got {budget!r}")
    return value


@dataclass
class Site:
    """What a step learned about one save: its element count, nonzeros and element size, and
    per group size its weighted noise at 1 bit relative to its energy (0: no error)."""

    n: int
    nnz: int
    esize: int
    noise1: dict
    min_bits: int = MIN_BITS

    def _sizes(self, c) -> dict:
        bits, group = c if c is not None else (None, None)
        return choice.sizes_from_counts(self.n, self.nnz, self.esize, bits, group)

    def nbytes(self, c) -> int:
        sizes = self._sizes(c)
        return sizes[choice.smallest(sizes)]

    def error(self, c) -> float:
        if c is None or choice.smallest(self._sizes(c)) not in choice.LOSSY:
            return 0.0
        bits, group = c
        return self.noise1[group] / float((1 << bits) - 1) ** 2

    def ladder(self) -> list:
        """The choices worth taking, fewest bytes first: the lower convex hull of (bytes,
        error), so each step up removes less error per byte than the one before."""
        points = sorted(((self.nbytes(c), self.error(c), i) for i, c in enumerate(CHOICES)
                         if c is None or (c[1] in self.noise1 and c[0] >= self.min_bits)))
        hull: list = []
        for b, e, i in points:
            if hull and e >= hull[-1][1]:
                continue  # more bytes for no less error
            while len(hull) >= 2:
                (b1, e1, _), (b2, e2, _) = hull[-2], hull[-1]
                if (e1 - e2) * (b - b2) <= (e2 - e) * (b2 - b1):  # the middle one gains less
                    hull.pop()
                else:
                    break
            hull.append((b, e, i))
        return [CHOICES[i] for _, _, i in hull]


def plan(sites: dict, budget: int) -> dict:
    """{site key: choice} within `budget` bytes in all: greedy by error removed per byte."""
    keys = list(sites)
    ladders = [sites[k].ladder() for k in keys]
    at = [0] * len(keys)
    total = sum(sites[k].nbytes(lad[0]) for k, lad in zip(keys, ladders))
    heap: list = []

    def push(i):
        lad, site = ladders[i], sites[keys[i]]
        if at[i] + 1 < len(lad):
            now, nxt = lad[at[i]], lad[at[i] + 1]
            cost = site.nbytes(nxt) - site.nbytes(now)
            gain = site.error(now) - site.error(nxt)
            heapq.heappush(heap, (-(gain / cost) if cost > 0 else -math.inf, i, cost))

    for i in range(len(keys)):
        push(i)
    while heap:
        _, i, cost = heapq.heappop(heap)
        if total + cost <= budget:
            total += cost
            at[i] += 1
            push(i)
    return {k: lad[a] for k, lad, a in zip(keys, ladders, at)}


def noise_at_one_bit(t: torch.Tensor, enc, op: str) -> dict:
    """Per group size, the weighted relative noise energy 1-bit quantization of t would add:
    from the group minima and step sizes of its encoding `enc` (quant or bitmap_quant; group
    sizes its own and coarser), else from t's own min/max per group."""
    energy = float(torch.linalg.vector_norm(t.detach(), dtype=torch.float32)) ** 2
    if energy == 0 or not math.isfinite(energy):
        return {g: 0.0 for g in GROUPS}
    if enc is not None and enc.codec in choice.LOSSY and enc.params["group_size"] in GROUPS:
        bits, group = enc.params["bits"], enc.params["group_size"]
        mins, scales = (_floats(b) for b in enc.buffers[-2:])  # the last two: stats per group
        lo, hi = mins, mins + scales * ((1 << bits) - 1)
    else:
        group = GROUPS[0]
        flat = t.detach().reshape(-1).float()
        whole = flat.numel() // group * group
        if whole == 0:
            return {g: 0.0 for g in GROUPS}
        lo, hi = torch.aminmax(flat[:whole].view(-1, group), dim=1)
        lo, hi = lo.double(), hi.double()
    out = {}
    for g in GROUPS:
        if g % group:
            continue
        k = g // group
        m = lo.numel() // k * k
        if m == 0:
            continue
        glo = lo[:m].view(-1, k).amin(dim=1)
        ghi = hi[:m].view(-1, k).amax(dim=1)
        out[g] = AMPLIFY.get(op, 1.0) * float(((ghi - glo) ** 2).sum()) * g / 12.0 / energy
    return out


def _floats(buf) -> torch.Tensor:
    """A payload buffer of float32 values as a float64 tensor."""
    if isinstance(buf, torch.Tensor):
        return buf.view(torch.float32).double()
    return torch.from_numpy(np.asarray(buf).view(np.float32)).double()


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
    def choice(self):
        return None if self.setting.bits is None else (self.setting.bits, self.setting.group_size)


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
            # With no room at all, fewer bits cannot make anything fit: page out.
            if not ((budget > 0 and self._reencode_one(pool)) or self._page_out_one(pool)):
                self.stats.over_budget += 1
                return

    def _reencode_one(self, pool) -> bool:
        """Re-encodes, one step down its ladder, the save that loses least per byte freed."""
        best, best_ratio, best_choice = None, math.inf, None
        for e in pool:
            p = e.packed()
            if e.site is None or p.enc is None or p.spill is not None:
                continue
            now = p.nbytes
            lower = [c for c in e.site.ladder() if c is not None and c[0] >= MIN_BITS
                     and c[0] >= e.site.min_bits and e.site.nbytes(c) < now]
            if not lower:
                continue
            fewer = lower[-1]
            ratio = (e.site.error(fewer) - e.site.error(e.choice)) / (now - e.site.nbytes(fewer))
            if ratio < best_ratio:
                best, best_ratio, best_choice = e, ratio, fewer
        if best is None:
            return False
        p = best.packed()
        setting = with_choice(best.setting, best_choice)
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
            importance = e.site.error(e.choice) if e.site is not None else 0.0
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
        weakref.finalize(p, self.spill.release)  # the file empties when no paged save is left
        self.stats.spilled += 1
        self.stats.spilled_bytes += nbytes
        return True

    def close(self) -> None:
        self.spill.close()


def min_bits(op: str) -> int:
    """The fewest bits a save by `op` may take."""
    return SENSITIVE_MIN_BITS if AMPLIFY.get(op, 1.0) > 1.0 else MIN_BITS


def with_choice(setting: packing.Setting, c) -> packing.Setting:
    """`setting` as choice `c` says: (bits, group size), or None for lossless."""
    if c is None:
        codec = "auto" if setting.codec in choice.LOSSY else setting.codec
        return replace(setting, bits=None, codec=codec)
    return replace(setting, bits=c[0], group_size=c[1])


class Budget:
    """The budget of one context, kept across the steps it is entered for: what the steps
    learned about each site, this step's plan, and the live saves with what makes room. The
    hooks (compress_saved) and the converted modules (record) both save through it."""

    def __init__(self, stats, budget, spill_dir: str | None = None):
        self.stats, self.nbytes = stats, parse_bytes(budget)
        self.keeper = Keeper(stats, spill_dir)
        self.sites: dict = {}
        self.plan: dict = {}
        self.ordinals: dict = {}
        self.fixed_bytes = 0  # held at sizes no choice changes (kept, masks, integers)
        self.planned_for = None  # (budget, site keys) the plan was made for
        stats.budget = self.nbytes

    def set(self, value) -> None:
        """A new budget, from any thread: what is held is made to fit it at once."""
        self.nbytes = parse_bytes(value)
        self.stats.budget = self.nbytes
        if self.nbytes is not None:
            self.keeper.shrink(self.nbytes)

    def new_step(self) -> None:
        """Plans this step from what the last steps learned, unless the last plan still holds
        (same budget and sites, and the last step kept to it without making room): choices
        that stay put keep payload sizes, and so the store's plan, from step to step. The
        step's counters start afresh."""
        st = self.stats
        replan = (st.reencoded or st.spilled or st.over_budget
                  or self.planned_for != (self.nbytes, set(self.sites)))
        st.budget, st.reencoded, st.spilled, st.spilled_bytes, st.over_budget = \
            self.nbytes, 0, 0, 0, 0
        st.peak_stored_bytes = st.stored_bytes
        if replan:
            room = int(self.nbytes * (1 - MARGIN)) - st.stored_bytes - self.fixed_bytes
            # At 0 every save is paged out: the policy's bits, since fewer free no memory.
            self.plan = plan(self.sites, max(room, 0)) if self.sites and self.nbytes else {}
            self.planned_for = (self.nbytes, set(self.sites))
        self.ordinals, self.fixed_bytes = {}, 0

    def setting_for(self, op: str, layer, t: torch.Tensor, setting):
        """(the setting this save gets, its site key): the plan's choice where it has one."""
        kind = (op, layer, tuple(t.shape), t.dtype)
        n = self.ordinals.get(kind, 0)
        self.ordinals[kind] = n + 1
        site = (*kind, n)
        if site in self.plan:
            setting = with_choice(setting, self.plan[site])
        return setting, site

    def admit(self, t: torch.Tensor, packed, setting, op: str, site, store) -> None:
        """Learns from `packed` (t encoded at `setting`) and holds it within the budget."""
        learned = _learn(t, packed, op)
        if learned is not None:
            before = self.sites.get(site)
            if before is not None:  # group sizes this encoding could not tell: as before
                learned.noise1 = {**before.noise1, **learned.noise1}
            self.sites[site] = learned
        else:
            self.fixed_bytes += packed.nbytes
        self.keeper.admit(packed, learned, setting, store, self.nbytes)

    def admit_fixed(self, packed) -> None:
        """Holds a save no choice changes (a mask, narrowed integers) within the budget: it
        may still be paged out."""
        self.fixed_bytes += packed.nbytes
        self.keeper.admit(packed, None, None, None, self.nbytes)

    def reserve(self, nbytes: int) -> None:
        """Makes room for nbytes about to be held as they are."""
        self.keeper.reserve(nbytes, self.nbytes)
        self.fixed_bytes += nbytes


def _learn(t: torch.Tensor, packed, op: str) -> Site | None:
    """What the plan knows about this save, or None where no choice applies (masks,
    integers)."""
    enc = packed.enc
    if enc is None or enc.codec == "mask" or t.dtype not in packing.FLOATS:
        return None
    n = t.numel()
    nnz = enc.nnz if enc.nnz is not None else n
    return Site(n, nnz, t.element_size(), noise_at_one_bit(t, enc, op), min_bits(op))


def _pageable(p) -> bool:
    """Whether paging `p` out frees memory that it alone holds, on the CPU."""
    if p.spill is not None or p.nbytes == 0:
        return False
    if p.enc is not None:
        return all(not isinstance(b, torch.Tensor) or b.device.type == "cpu"
                   for b in p.enc.buffers)
    return p.layout is not None and p.kept.device.type == "cpu" and p.kept.is_contiguous()
