"""The keeper: the live saves of a context under its budget, and what makes room for a save
that does not fit: the live saves (itself included) that lose least per byte freed are
re-encoded a step down, to MIN_BITS at most; when that is not enough, the least important per
byte are paged out to a temporary file (actcodec.torch.budget.spill) and read back in
backward (PORT/POET-style paging).
Both go through Packed's own methods (actcodec.torch.packed), under the keeper's lock."""
from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass

from ..save import save
from . import planner
from .spill import Spill
from .planner import Site, with_choice
from ..save.policy import Setting


@dataclass
class Entry:
    """A live save under the budget: the Packed, what accounting counts for it, what the
    plan knows of its site, and how it was encoded."""

    packed: weakref.ref
    held: object  # accounting.Held, once held
    site: Site | None
    setting: Setting
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
        self.made_room = 0  # saves re-encoded, paged out or not held since the last step began

    def admit(self, packed, site: Site | None, setting, store, budget: int) -> None:
        """Holds `packed` (just encoded at `setting`) for backward, first making room for it."""
        with self.lock:
            entry = Entry(weakref.ref(packed), None, site, setting, store)
            packed.lock = self.lock
            self._fit(budget, entry)
            entry.held = save.hold(self.stats, packed, packed.nbytes)
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
                self.made_room += 1
                return

    def _reencode_one(self, pool) -> bool:
        """Re-encodes, one step down its ladder, the save that loses least per byte freed."""
        best, best_ratio, best_choice = None, math.inf, None
        for e in pool:
            p = e.packed()
            if e.site is None or p.enc is None or p.spill is not None:
                continue
            now = p.nbytes
            lower = [c for c in e.site.ladder() if c is not None and c[0] >= planner.MIN_BITS
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
        p.reencode(setting, best.store)
        best.setting = setting
        if best.held is not None:
            save.resize(self.stats, best.held, p.nbytes)
        self.stats.reencoded += 1
        self.made_room += 1
        return True

    def _page_out_one(self, pool) -> bool:
        """Pages out the save of least importance per byte: a CPU payload, or an integer
        tensor narrowed into memory of its own."""
        best, best_ratio = None, math.inf
        for e in pool:
            p = e.packed()
            if not p.pageable:
                continue
            importance = e.site.error(e.choice) if e.site is not None else 0.0
            ratio = -1.0 / p.nbytes if importance == 0 else importance / p.nbytes
            if ratio < best_ratio:
                best, best_ratio = e, ratio
        if best is None:
            return False
        p = best.packed()
        nbytes = p.nbytes
        p.page_out(self.spill)
        if best.held is not None:
            save.resize(self.stats, best.held, 0)
        weakref.finalize(p, self.spill.release)  # the file empties when no paged save is left
        self.stats.spilled += 1
        self.stats.spilled_bytes += nbytes
        self.made_room += 1
        return True

    def close(self) -> None:
        self.spill.close()
