"""A byte budget for what a training step holds for backward (DAF 3.4, Sage, Melon).

`compress_saved(budget=...)` replaces the choice of bits by a budget: at no moment does the
step hold more bytes for backward than the budget (`stats.peak_stored_bytes`).

- **Importance.** Each save is a *site* (its op, layer, shape and dtype, and how many such
  saves came before it in the step). The min/max pass the quantizer runs anyway gives each
  group's range, so the noise energy each choice (bits and group size, CHOICES) would add is
  known once the site has been encoded: at k bits it is that of 1 bit over (2^k - 1)^2, and
  coarser groups' ranges follow from finer ones'. How much of that noise, relative to the
  tensor's energy, becomes error in the parameters' gradients is the site's gain, measured in
  backward on profile steps (actcodec.torch.sensitivity: summed over the parameters, and the
  most any one gets); until a site's kind is measured, AMPLIFY's weight for its op stands in.
  Lossless costs no error.
- **Plan.** At each step's start the sites the last steps learned get their choices: first
  all are raised to the lowest worst-parameter error the budget holds for all, then the bytes
  left go greedily by error removed per byte (DAF 3.4.1), each up the lower convex hull of its
  (bytes, error) choices, while the total fits the budget, less what is held at sizes no choice
  changes (kept tensors, masks, integers) and a margin for payloads whose size follows the
  data. The plan is kept while the budget, the sites, the gains and the last step's fit stay
  the same. A site the plan does not know (the first step, a new shape) starts at 8 bits in
  groups of 64 (POLICY).
- **Making room.** A save that does not fit is made to: the live saves (itself included)
  that lose least per byte freed are re-encoded a step down, to MIN_BITS at most; when that is
  not enough, the least important per byte are paged out to a temporary file and read back in
  backward (PORT/POET-style paging). Lowering `ctx.budget`, from any thread, makes room at
  once the same way; `ctx.request_budget` leaves that to the thread that saves, at its next
  save (Step's limit setter does so). A budget of 0 holds nothing in memory: every save is paged out as it
  comes, at the policy's bits (fewer bits would free no memory).

Tensors kept as they are (smaller than the policy's `min_bytes`, or a kind no codec takes)
count toward the budget but are neither re-encoded nor paged out; `stats.over_budget` counts
the saves a budget below them could not hold.
"""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import torch

from ... import choice
from . import noise
from . import planner
from . import sensitivity
from .keeper import Keeper
from ..codecs.packed import FLOATS
from .planner import GROUPS, MARGIN, Site
from ..save.policy import SIGN_READ

# A budget without a policy starts unknown saves at 8 bits in groups of 64: the stats of the
# finest group size give every coarser one's noise exactly.
POLICY = {"bits": 8, "group_size": GROUPS[0]}

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


class Budget:
    """The budget of one context, kept across the steps it is entered for: what the steps
    learned about each site, this step's plan, and the live saves with what makes room. The
    hooks (compress_saved) and the converted modules (record) both save through it."""

    def __init__(self, stats, budget, spill_dir: str | None = None, min_bits: int = 0):
        self.stats, self.nbytes = stats, parse_bytes(budget)
        self.min_bits = min_bits  # no save planned or re-encoded below this many bits
        self.keeper = Keeper(stats, spill_dir)
        self.sites: dict = {}
        self.plan: dict = {}
        self.schedule = sensitivity.Schedule()  # profile steps, site keys
        self.fixed_bytes = 0  # held at sizes no choice changes (kept, masks, integers)
        self.planned_for = None  # (budget, site keys, gains seen) the plan was made for
        self.spill_dir = spill_dir
        self.gains: dict = {}  # site key -> (gain, peak) measured in backward
        self.op_gains: dict = {}  # op kind -> median measured (gain, peak), for sites not measured
        self.measured = 0  # profile steps whose gains were taken in

    def set(self, value) -> None:
        """A new budget, from any thread: what is held is made to fit it at once."""
        self.nbytes = parse_bytes(value)
        if self.nbytes is not None:
            self.keeper.shrink(self.nbytes)

    def request(self, value) -> None:
        """A new budget, from any thread, for the thread that saves to make room for: only
        recorded here (one attribute, read once per save), so nothing is re-encoded or paged
        out in the caller's thread and no paging error lands there. The next save or
        reservation fits what is held and itself within it (Keeper._fit)."""
        self.nbytes = parse_bytes(value)

    def new_step(self) -> None:
        """Plans this step from what the last steps learned, unless the last plan still holds
        (same budget and sites, and the last step kept to it without making room): choices
        that stay put keep payload sizes, and so the store's plan, from step to step. The
        keeper's count of room made starts afresh."""
        # each site's noise at 1 bit in the widest group, which every encoding measures anew
        # (a finer group's may be left from a step that encoded it so)
        state = {key: site.noise1[max(site.noise1)] for key, site in self.sites.items()
                 if site.noise1}
        self._take_gains(self.schedule.new_step(profile=bool(self.nbytes), state=state))
        planned_for = (self.nbytes, set(self.sites), self.measured)
        replan = self.keeper.made_room or self.planned_for != planned_for
        self.keeper.made_room = 0
        if replan:
            room = int(self.nbytes * (1 - MARGIN * planner.data_dependent_share(self.sites))) \
                - self.stats.stored_bytes - self.fixed_bytes
            # At 0 every save is paged out: the policy's bits, since fewer free no memory.
            self.plan = planner.plan(self.sites, max(room, 0)) if self.sites and self.nbytes else {}
            self.planned_for = planned_for
        self.fixed_bytes = 0

    @property
    def probe(self):
        """This step's sensitivity.Probe, on a profile step."""
        return self.schedule.probe

    def _take_gains(self, found: dict) -> None:
        """What the last profile step measured becomes the sites' gains."""
        if not found:
            return
        self.gains.update(found)
        by_op: dict = {}
        for site, gains in self.gains.items():
            by_op.setdefault(site[0], []).append(gains)
        self.op_gains = {op: tuple(np.median(np.array(g), axis=0)) for op, g in by_op.items()}
        for key, site in self.sites.items():
            self._judge(key, site)
        self.measured += 1

    def _judge(self, key, site: Site) -> None:
        """Gives a site its gain: measured, else its op kind's median measured gain, else its
        op kind's weight (AMPLIFY); and the fewest bits it may take (planner.min_bits)."""
        op = key[0]
        gain = self.gains.get(key, self.op_gains.get(op))
        if gain is None:
            site.gain = planner.AMPLIFY.get(op, 1.0)
        else:
            site.gain, site.peak = (float(g) for g in gain)
        site.min_bits = max(planner.min_bits(op), self.min_bits)

    def setting_for(self, op: str, layer, t: torch.Tensor, setting):
        """(the setting this save gets, its site key): the plan's choice where it has one."""
        site = self.schedule.site(op, layer, t)
        if site in self.plan:
            setting = planner.with_choice(setting, self.plan[site])
        return setting, site

    def admit(self, t: torch.Tensor, packed, setting, op: str, site, store) -> None:
        """Learns from `packed` (t encoded at `setting`) and holds it within the budget."""
        learned = _learn(t, packed, op)
        if learned is not None:
            before = self.sites.get(site)
            if before is not None:  # group sizes this encoding could not tell: as before
                learned.noise1 = {**before.noise1, **learned.noise1}
            self._judge(site, learned)
            self.sites[site] = learned
            if self.probe is not None:
                self.probe.watch(packed, site, op)
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
    if enc is None or enc.codec == "mask" or t.dtype not in FLOATS:
        return None
    n = t.numel()
    nnz = enc.nnz if enc.nnz is not None else n
    return Site(n, nnz, t.element_size(), noise.noise_at_one_bit(t, enc),
                codec="bitmap_quant" if op in SIGN_READ else None)
