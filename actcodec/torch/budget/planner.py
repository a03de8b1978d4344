"""The budget's planner: pure functions of numbers. Sites' bytes and error per choice, and a
budget, in; a choice per site out. No torch, no locks: the save path feeds it what it learned
(actcodec.torch.budget), the noise model gives the errors (actcodec.torch.noise).

Each save is a *site* (its op, layer, shape and dtype, and how many such saves came before it
in the step). A choice is (bits, group size), or None for lossless; the noise energy a choice
adds is known from the group ranges at 1 bit: at k bits it is that of 1 bit over (2^k - 1)^2,
and a site's gain (measured in backward) turns it into gradient error. `plan` first raises
every site to the lowest worst-parameter error the budget holds for all, then goes greedily
by error removed per byte (DAF 3.4.1), each site up the lower convex hull of its (bytes,
error) choices, taking the step up with the best ratio while the total fits the budget.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace

from ... import choice

# What a save may be stored as: (bits, group size) or None (lossless). Groups of 64 cost a bit
# per element more than groups of 256. 2 bits come in groups of 64 only: the noise model
# underrates 2-bit groups of 256 (with them a ResNet-18's gradient cosine at the 2-bit preset's
# bytes fell from 0.84 to 0.58, bench/budget_fidelity.py); 1 bit leaves cosines near 0.3.
CHOICES = ((2, 64), (4, 256), (4, 64), (8, 256), (8, 64), None)
GROUPS = (64, 256)  # each a multiple of the one before: finer stats give the coarser exactly
MIN_BITS = 2  # what making room re-encodes down to before it pages out
# The fewest bits a save of these kinds takes, in the plan and when making room (below it,
# what does not fit is paged out instead); other kinds MIN_BITS. Measured gains do not lift
# these floors: one step's gradient error at the start of training does not show what few bits
# on norm inputs and softmax outputs do over training. On the convergence benchmark's text task
# (a budget at 2-bit's bytes, 3 seeds) LayerNorm inputs at 2 bits ended +4.8% above fp32's
# held-out loss, at 4 bits +0.24%, at 8 bits (where the 2-bit preset keeps them) +0.00%. Batch
# norm inputs, which the 2-bit preset stores at 2 bits, keep 4. Attention's saves keep 8 as
# the presets' do (policy.py: at 2 bits they alone left a byte GPT-2 +52% over fp32).
FLOORS = {"layer_norm": 8, "group_norm": 8, "softmax": 8, "attention": 8, "batch_norm": 4}
# Of the budget, times the share of saved elements whose payload size follows the data (sparse
# saves, bitmap-based codecs), what the plan leaves unspent; dense quantized saves' sizes are
# exact, and a plan that left room for them held 3% fewer bytes than uniform bits did.
MARGIN = 0.03
# The gain a site gets until its kind is measured (actcodec.torch.sensitivity).
AMPLIFY = {"batch_norm": 64.0, "layer_norm": 64.0, "group_norm": 64.0, "softmax": 64.0,
           "attention": 64.0, "input": 64.0}


@dataclass
class Site:
    """What a step learned about one save: its element count, nonzeros and element size, per
    group size its noise at 1 bit relative to its energy (0: no error), and its gain: how
    much of that relative noise becomes relative error in the gradients of the op reading it
    (measured in backward, actcodec.torch.sensitivity; else AMPLIFY's weight for its op).
    `codec`: the codec its lossy choices are stored with where the policy names one (a ReLU
    output's bitmap_quant), else None (the smallest)."""

    n: int
    nnz: int
    esize: int
    noise1: dict
    min_bits: int = MIN_BITS
    codec: str | None = None
    gain: float = 1.0
    peak: float | None = None  # the part of gain the most affected parameter gets
    # (choice and counts) -> the smallest codec and its bytes: the planner and the keeper ask
    # thousands of times a step, and the answer follows from the counts alone
    _sizes_of: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def worst(self, c) -> float:
        """The relative error choice c gives the one parameter it affects most."""
        error = self.error(c)
        return error if self.peak is None or self.gain <= 0 else error * self.peak / self.gain

    def _smallest(self, c) -> tuple:
        """(codec, payload bytes) of the smallest encoding choice c allows for these counts."""
        key = (c, self.n, self.nnz, self.esize, self.codec)
        got = self._sizes_of.get(key)
        if got is None:
            bits, group = c if c is not None else (None, None)
            sizes = choice.sizes_from_counts(self.n, self.nnz, self.esize, bits, group)
            if c is not None and self.codec in sizes:
                sizes = {self.codec: sizes[self.codec]}
            best = choice.smallest(sizes)
            got = self._sizes_of[key] = (best, sizes[best])
        return got

    def nbytes(self, c) -> int:
        return self._smallest(c)[1]

    def error(self, c) -> float:
        if c is None or self._smallest(c)[0] not in choice.LOSSY:
            return 0.0
        bits, group = c
        return self.gain * at_bits(self.noise1[group], bits)

    def ladder(self) -> list:
        """The choices worth taking, fewest bytes first: the lower convex hull of (bytes,
        error), so each step up removes less error per byte than the one before."""
        points = sorted(((self.nbytes(c), self.error(c), i) for i, c in enumerate(CHOICES)
                         if c is None or (c[1] in self.noise1 and c[0] >= self.min_bits)))
        hull: list = []
        for b, e, i in points:
            if hull and e >= hull[-1][1] and CHOICES[i] is not None:
                continue  # more bytes for no less error (lossless stays: its 0 is exact)
            while len(hull) >= 2:
                (b1, e1, _), (b2, e2, _) = hull[-2], hull[-1]
                if (e1 - e2) * (b - b2) <= (e2 - e) * (b2 - b1):  # the middle one gains less
                    hull.pop()
                else:
                    break
            hull.append((b, e, i))
        return [CHOICES[i] for _, _, i in hull]


def plan(sites: dict, budget: int) -> dict:
    """{site key: choice} within `budget` bytes in all. First every site is raised to the
    lowest level of error any one parameter gets from it that the budget can hold for all
    (`_floors`: so the worst parameter is as close as the bytes allow); the bytes left go
    greedily by error removed per byte (the sum over parameters). Uniform bits that fit are
    candidates too (`least_error`)."""
    keys = list(sites)
    ladders = [sites[k].ladder() for k in keys]
    at = _floors([sites[k] for k in keys], ladders, budget)
    total = sum(sites[k].nbytes(lad[a]) for k, lad, a in zip(keys, ladders, at))
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
    chosen = {k: lad[a] for k, lad, a in zip(keys, ladders, at)}
    return least_error(sites, [chosen, *(u for c in CHOICES
                                         if (u := uniform(sites, c)) is not None
                                         and nbytes(sites, u) <= budget)])


def uniform(sites: dict, c) -> dict | None:
    """Every site at choice c (at its fewest bits where c has fewer): uniform bits, as a
    preset stores them; None where a site's noise at c's group size is not known."""
    if c is None:
        return dict.fromkeys(sites)
    if any(c[1] not in site.noise1 for site in sites.values()):
        return None
    return {k: (max(c[0], site.min_bits), c[1]) for k, site in sites.items()}


def nbytes(sites: dict, choices: dict) -> int:
    return sum(sites[k].nbytes(c) for k, c in choices.items())


def estimate(sites: dict, choices: dict) -> tuple:
    """What the plan's own model says of a plan: (the worst error one parameter gets, the
    total error)."""
    return (max((sites[k].worst(c) for k, c in choices.items()), default=0.0),
            sum(sites[k].error(c) for k, c in choices.items()))


def least_error(sites: dict, plans: list) -> dict:
    """The first plan, unless a later one is estimated no worse on both the worst parameter
    and the total and better on one: then the first such (the greedy plan must not be one its
    own estimate says a uniform plan beats)."""
    best, best_est = plans[0], estimate(sites, plans[0])
    for p in plans[1:]:
        e = estimate(sites, p)
        if e[0] <= best_est[0] and e[1] <= best_est[1] and e != best_est:
            best, best_est = p, e
    return best


def _floors(sites: list, ladders: list, budget: int) -> list:
    """Per site the first step of its ladder at or under the lowest worst-parameter error
    level whose steps fit the budget together (all at the first step where none does)."""
    def steps(level):
        return [next((j for j, c in enumerate(lad) if site.worst(c) <= level), len(lad) - 1)
                for site, lad in zip(sites, ladders)]

    def cost(at):
        return sum(site.nbytes(lad[j]) for site, lad, j in zip(sites, ladders, at))

    levels = sorted({site.worst(c) for site, lad in zip(sites, ladders) for c in lad})
    best = [0] * len(sites)
    lo, hi = 0, len(levels) - 1
    while lo <= hi:  # cost falls as the level rises
        mid = (lo + hi) // 2
        at = steps(levels[mid])
        if cost(at) <= budget:
            best, hi = at, mid - 1
        else:
            lo = mid + 1
    return best


def at_bits(noise1: float, bits: int) -> float:
    """The relative noise of k-bit codes, from that of 1 bit: a step is 1/(2^k - 1) of it."""
    return noise1 / float((1 << bits) - 1) ** 2


def data_dependent_share(sites: dict) -> float:
    """The share of the sites' elements whose stored size follows their values: sparse ones
    (stored sparse while they stay so) and those stored with a bitmap codec."""
    total = sum(s.n for s in sites.values())
    varying = sum(s.n for s in sites.values() if s.nnz < s.n or s.codec is not None)
    return varying / total if total else 1.0


def min_bits(op: str) -> int:
    """The fewest bits a save by `op` may take."""
    return FLOORS.get(op, MIN_BITS)


def with_choice(setting, c):
    """`setting` as choice `c` says: (bits, group size), or None for lossless."""
    if c is None:
        codec = "auto" if setting.codec in choice.LOSSY else setting.codec
        return replace(setting, bits=None, codec=codec)
    return replace(setting, bits=c[0], group_size=c[1])
