"""The memory limit's solver: pure functions of numbers. A step's profile (bytes and seconds
per sample, per repeated block) and the bytes it may add in; the fastest plan that fits out.
No torch: actcodec.torch.step measures the profile and runs the plan.

A plan combines (Sage, Melon, PORT, DAF):
- **micro-batches**: the batch in m slices of at most b = ceil(B / m) samples, gradients
  accumulated; what a step holds and works on scales with b;
- **recomputation** of a set R of repeated blocks: such a block holds only its inputs, and its
  saves come back, at full size and one block at a time, during its backward;
- **storage** of what is held: as it is, compressed (lossless or at some bits) or paged out.

The model of the step's peak above the floor, for a plan (a sample is a token where one
long sample is planned along its sequence; see Profile.unit and Profile.flat for the two
phases such a profile tells apart):

    fixed (+ grads where m > 1) + b * max(least, work + S - effect * (S - held)),
    S = rest + sum of saved over all blocks,
    held = storage.ratio * (rest + sum of saved over blocks not in R + sum of inputs over R)
           + max of saved over blocks in R

and of its time: B * (seconds + sum of forward over R + storage.seconds_per_byte * held bytes
at full size) + m * per_micro_batch. Recomputed blocks with the same bytes differ only in
time, so the cheapest of them go first; for a given R and storage the fewest micro-batches
that fit are the fastest. Exact plans are preferred: a lossy storage only where it makes the
step more than `LOSSY_GAIN` faster than the best exact plan, or where no exact plan fits.

Measurement corrects the model (Sage, Melon): a plan already run is judged by the largest
peak measured for it, or for a plan that holds the same bytes (`measured`, keyed by
`memory_key`); any other by the model's peak times (1 + caution), where the caution, a
guess before any step, is then the worst ratio of measured to modelled peak seen (less one)
plus a margin.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field, replace

LOSSY_GAIN = 1.10  # a lossy plan must be this many times faster than the best exact one
MAX_COMBINATIONS = 4096  # sets of recomputed blocks tried exhaustively; beyond, in order
# Once plans have run, one not yet run is trusted to the model's peak times the worst ratio
# of measured to model seen, plus this share (a new plan's first step, a noisy peak).
CALIBRATED_MARGIN = 0.10
# Position-wise sub-modules along a sequence run in at most this many chunks, each of at
# least this many tokens (a smaller chunk saves less than its own overhead costs).
MAX_CHUNKS, MIN_CHUNK_TOKENS = 16, 64


@dataclass(frozen=True)
class Block:
    """A repeated block, per sample: bytes it saves for backward, bytes its checkpoint keeps
    (its inputs) when recomputed, and the seconds of its forward (what recomputing costs);
    and of its position-wise sub-modules (an MLP: actcodec.torch.limit.mini_sequence), the
    bytes they save (`local`, part of `saved`), their inputs, their forward's seconds and the
    bytes of the largest single tensor they save (`local_widest`). `moment`, where measured
    (along a sequence), what its moment in backward peaks at beyond what that moment holds
    per sample (moment_bytes), a constant (the gradients made by then, the loss's buffers),
    and `moment_least`, per sample, what it grows by beyond those bytes (working memory)."""

    saved: float
    inputs: float
    forward: float
    local: float = 0.0
    local_inputs: float = 0.0
    local_forward: float = 0.0
    local_widest: float = 0.0
    moment: float | None = None
    moment_least: float = 0.0

    def chunked(self, chunks: int) -> tuple:
        """(bytes saved, bytes one chunk's recomputation adds in backward) per sample where
        its position-wise sub-modules run in `chunks` chunks of the sequence, each recomputed
        in backward: they keep their inputs only."""
        if chunks <= 1 or self.local <= 0:
            return self.saved, 0.0
        return self.saved - self.local + self.local_inputs, self.local / chunks


@dataclass(frozen=True)
class Storage:
    """How what a step holds is kept: bytes held in memory per byte saved at full size, the
    seconds each such byte costs (encode, decode, disk), whether it is exact, and `extra`,
    bytes per sample its own work adds to the peak beyond what the cut in held bytes gives
    back (a probe measures it)."""

    name: str
    ratio: float
    seconds_per_byte: float
    exact: bool
    extra: float = 0.0


PLAIN = Storage("plain", 1.0, 0.0, True)


@dataclass(frozen=True)
class Profile:
    """A step measured: the batch size B; `fixed`, bytes the step adds whatever the plan
    (gradients, buffers); per sample: `work`, the working set at the peak beyond what is held,
    `rest`, bytes saved outside the blocks, and `seconds`, forward and backward as they are;
    `per_micro_batch`, seconds each micro-batch adds; the blocks and the storages allowed;
    `split`, whether micro-batches are allowed (exact, or ghost batch norm accepted); `effect`,
the share of a cut in what is held that the peak sees (measured: the peak may fall where
less is held, in backward, only in part); `least`, bytes per sample the step peaks at
holding nothing (an op's working set, a save decoded for its backward), which no plan
goes below. `unit`: what `batch` counts, "sample" (per-sample quantities, `units` elements
each), or "token" (one sample planned along its sequence: `batch` is its tokens, every
per-sample quantity is per token, and it cannot be split; "token" and its sequences' shares
of the longest where they differ, an encoder-decoder's source and labels: `batch` is the
longest's tokens, shape.sequence_unit). `grads`: the bytes of the
gradients, which from the second micro-batch on stay for the whole of each (in one
micro-batch they build up during backward, which `fixed` has measured). `flat`: where the
probes told the step's two phases apart (a sequence's profile: at short lengths the peak is
backward's, with the gradients, at long ones the turn from forward's, with every save held),
backward's constant: the peak is then the larger of `fixed` plus what is held at the turn
and `flat` plus, per sample, `least` and the recomputed block's saves (`sample_bytes`).
Where the probes measured each block's moment in backward apart (Block.moment), `flat` and
`least` are the moments' outside the blocks (the head's and loss's backward, the
embedding's gradient), and each block's moment is its own (`phases`).
`chunk_floor`: the bytes from which the step's allocator keeps a tensor out of the C heap
(0: none): a chunk whose position-wise saves are smaller lands them among the heap's small
allocations, whose holes the peak then carries (see chunk_counts)."""

    batch: int
    fixed: float
    work: float
    rest: float
    blocks: tuple = ()
    seconds: float = 0.0
    per_micro_batch: float = 0.0
    storages: tuple = (PLAIN,)
    split: bool = True
    effect: float = 1.0
    least: float = 0.0
    units: float = 1.0
    unit: str = "sample"
    grads: float = 0.0
    flat: float | None = None
    chunk_floor: float = 0.0


def scaled(profile: Profile, units: float) -> Profile:
    """The profile for samples of `units` elements (a batch's shape class: tokens and such,
    actcodec.torch.limit.shape) from one measured at `profile.units`. What a sample costs
    grows with its size, at most as its square (attention's scores over a sequence), and
    may hold a part that does not grow at all, so a smaller sample is planned at the measured
    one's bytes and a larger one at the square's: both bounds from above. (A linear share
    for a smaller sample went 40% under a Llama's measured peak.) Time is scaled linearly.
    Nothing per step (`fixed`, the time a micro-batch adds) changes.

    A token profile (`unit` "token", `units` the sequence length it was measured at) is per
    token: a shorter sequence costs at most as much per token, a longer one at most r times
    as much (attention over r times the positions), and its time per token is kept."""
    if units == profile.units or profile.units <= 0:
        return profile
    r = units / profile.units
    if profile.unit != "sample":
        f, t = max(1.0, r), 1.0
    else:
        f, t = (1.0 if r <= 1 else r * r), r
    return replace(profile, units=units, work=profile.work * f, rest=profile.rest * f,
                   least=profile.least * f, seconds=profile.seconds * t,
                   blocks=tuple(Block(b.saved * f, b.inputs * f, b.forward * t, b.local * f,
                                      b.local_inputs * f, b.local_forward * t,
                                      b.local_widest * f, b.moment, b.moment_least * f)
                                for b in profile.blocks),
                   storages=tuple(replace(s, extra=s.extra * f) for s in profile.storages))


@dataclass(frozen=True)
class Plan:
    """What a step does: micro-batches, the blocks it recomputes (indices into the profile's
    blocks), the storage of what it holds; and what the model predicts for it: bytes above the
    floor at the peak, seconds."""

    micro_batches: int = 1
    recompute: tuple = ()
    storage: str = "plain"
    peak: float = field(default=0.0, compare=False)
    seconds: float = field(default=0.0, compare=False)
    chunks: int = 1

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        return cls(int(d["micro_batches"]), tuple(int(i) for i in d.get("recompute", ())),
                   str(d.get("storage", "plain")), float(d.get("peak", 0.0)),
                   float(d.get("seconds", 0.0)), int(d.get("chunks", 1)))


def phases(profile: Profile, recompute, storage: Storage, samples: int,
           chunks: int = 1) -> float:
    """The peak above the floor of `samples` samples (beyond `fixed` and the gradients a
    micro-batch after the first holds): one phase's per-sample bytes over `fixed`, or, with
    `flat`, the larger of both phases. Where each block's moment in backward was measured
    (moments_known), the turn holds what the plan holds and each block's moment its own
    bytes (moment_bytes); else the turn and backward each count the largest bytes backward
    brings back at once (_transient), wherever that happens."""
    return max(a + samples * c for a, c in peak_lines(profile, recompute, storage, chunks))


def peak_lines(profile: Profile, recompute, storage: Storage, chunks: int = 1) -> list:
    """The moments phases() takes the largest of, each a line in the samples of a
    micro-batch, (bytes at none, bytes per sample): what does not depend on how many."""
    if profile.flat is None:
        return [(profile.fixed, sample_bytes(profile, recompute, storage, chunks))]
    if not moments_known(profile):
        return [(profile.fixed, sample_bytes(profile, recompute, storage, chunks)),
                (profile.flat, profile.least + storage.extra
                 + _transient(profile, recompute, chunks))]
    held = storage.ratio * held_bytes(profile, recompute, chunks)
    # the moments outside the blocks were measured with every block recomputed: a plan
    # holds what it holds beyond that there too (the head's and loss's backward)
    beyond = held - held_bytes(profile, range(len(profile.blocks)))
    lines = [(profile.fixed, profile.work + held + storage.extra),
             (profile.flat, profile.least + storage.extra + beyond)]
    at = moments_bytes(profile.blocks, profile.rest, recompute, chunks, storage.ratio)
    for b, held_then in zip(profile.blocks, at):
        lines.append((b.moment, b.moment_least + storage.extra + held_then))
    return lines


def moments_known(profile: Profile) -> bool:
    """Whether the probes measured each block's moment in backward apart (Block.moment): then
    `flat` and `least` are what backward peaks at outside them."""
    return bool(profile.blocks) and all(b.moment is not None for b in profile.blocks)


def moment_bytes(blocks, rest: float, i: int, recompute, chunks: int = 1,
                 ratio: float = 1.0) -> float:
    """Bytes per sample held at block i's moment in backward (blocks run in order, so
    backward reaches them last to first): what the blocks before it and the saves outside
    all blocks hold (stored at `ratio`), and its own saves at full size (recomputed, or
    brought back for its backward) with one chunk's recomputation."""
    return moments_bytes(blocks[:i + 1], rest, recompute, chunks, ratio)[i]


def moments_bytes(blocks, rest: float, recompute, chunks: int = 1,
                  ratio: float = 1.0) -> list:
    """moment_bytes of every block, in one pass (the solver asks for them per plan)."""
    recompute, out, before = frozenset(recompute), [], 0.0
    for j, b in enumerate(blocks):
        saved, chunk = b.chunked(chunks)
        out.append(ratio * (rest + before) + saved + chunk)
        before += b.inputs if j in recompute else saved
    return out


def _transient(profile: Profile, recompute, chunks: int) -> float:
    """Bytes per sample backward brings back at once: a recomputed block's saves (with its
    position-wise parts in chunks, those it keeps and one chunk's), or one chunk's of a
    block that is not recomputed."""
    out = 0.0
    for i, block in enumerate(profile.blocks):
        saved, chunk = block.chunked(chunks)
        out = max(out, saved + chunk if i in recompute else chunk)
    return out


def sample_bytes(profile: Profile, recompute, storage: Storage, chunks: int = 1) -> float:
    """Bytes per sample at the peak, beyond `fixed`, for a set of recomputed blocks (the
    turn's, where the profile has `flat`)."""
    plain = profile.rest + sum(b.saved for b in profile.blocks)
    held = held_bytes(profile, recompute, chunks)
    cut = plain - (storage.ratio * held + _transient(profile, recompute, chunks))
    at_turn = profile.work + plain - profile.effect * cut + storage.extra
    return at_turn if profile.flat is not None else max(profile.least, at_turn)


def held_bytes(profile: Profile, recompute, chunks: int = 1) -> float:
    """Bytes per sample held for backward at full size, for a set of recomputed blocks (and
    position-wise parts in `chunks` chunks)."""
    return profile.rest + sum(b.inputs if i in recompute else b.chunked(chunks)[0]
                              for i, b in enumerate(profile.blocks))


@dataclass(frozen=True)
class Measured:
    """What steps run so far say: the largest peak measured per plan key, and how far to trust
    the model on a plan not yet run. A micro-batch count and storage no step has used yet
    get `caution` (a share of the model's peak: the caller's guess), or, where worse, the
    worst error any kind has shown plus CALIBRATED_MARGIN; those used get the worst
    ratio of measured to modelled peak seen with them (`worst`, keyed by the first and last
    parts of a plan's key), less one, plus CALIBRATED_MARGIN, and at least `caution` at a
    shape (micro-batch size, elements per sample) no plan has run at. The model errs
    differently for each: a codec's own work beside the gradients, or what does not shrink
    with the micro-batch (a 2-micro-batch plan on the demo's model peaked 1.5x its model
    after 4 micro-batches had measured 1.0x)."""

    peaks: dict = field(default_factory=dict)
    caution: float = 0.0
    worst: dict = field(default_factory=dict)

    @staticmethod
    def kind(key: tuple) -> tuple:
        """What a plan's calibration is kept by: its micro-batch count and storage."""
        return key[0], key[2]

    def peak(self, key: tuple, model: float) -> float:
        if key in self.peaks:
            return self.peaks[key]
        kind = self.kind(key)
        if kind in self.worst:
            factor = max(0.0, self.worst[kind] - 1) + CALIBRATED_MARGIN
            if not any(k[3:6] == key[3:6] for k in self.peaks):
                # a shape no plan has run at (a new longest batch): its first step lays its
                # memory out first fit, as a first step does (a Llama's 2 x 4 x 379 tokens
                # went 42% over the model its calibration trusted), so the guess holds too
                factor = max(factor, self.caution)
            return model * (1 + factor)
        # a kind not yet run: the guess, or the worst error any kind has shown, if worse
        seen = max(self.worst.values(), default=0.0) - 1 + CALIBRATED_MARGIN
        return model * (1 + max(self.caution, seen))

    def learn(self, key: tuple, measured: float, model: float,
              calibrate: bool = True) -> "Measured":
        """These measurements with one more: a plan of `key` whose model peak is `model`
        peaked at `measured` (`calibrate` False: a bound on this plan only, such as "more
        than the room it had" where a device ran out, which says nothing of the model's
        error on other plans)."""
        peaks = {**self.peaks, key: max(measured, self.peaks.get(key, 0))}
        if not calibrate:
            return Measured(peaks, self.caution, self.worst)
        kind = self.kind(key)
        worst = {**self.worst, kind: max(self.worst.get(kind, 0.0), measured / model)}
        return Measured(peaks, self.caution, worst)


NOTHING = Measured()


def timed(profile: Profile, plan: Plan, block_seconds: dict, step_seconds: float):
    """The profile with the times a step of `plan` (at the profile's batch) took where it
    ran: each block's forwards, added up over its micro-batches (`block_seconds`, by
    index), and the whole step. Per sample: each block's forward (its position-wise part in
    the same proportion as before), and `seconds`, what the step took beyond its
    micro-batches' overhead and its recomputation. None where the step does not tell them
    apart (a block without a time, a storage's or chunks' own work in the step)."""
    n = profile.batch
    if n <= 0 or plan.storage != "plain" or plan.chunks != 1 or \
            any(i not in block_seconds for i in range(len(profile.blocks))):
        return None
    forward = [block_seconds[i] / n for i in range(len(profile.blocks))]
    blocks = tuple(replace(b, forward=f, local_forward=b.local_forward * f / b.forward
                           if b.forward > 0 else b.local_forward)
                   for b, f in zip(profile.blocks, forward))
    seconds = (step_seconds - plan.micro_batches * profile.per_micro_batch) / n \
        - sum(forward[i] for i in plan.recompute)
    return replace(profile, blocks=blocks, seconds=max(0.0, seconds))


def memory_key(profile: Profile, micro_batches: int, recompute, storage: str,
               chunks: int = 1) -> tuple:
    """What a plan's memory depends on: its micro-batches, the bytes of the blocks it
    recomputes (blocks with the same bytes are interchangeable), its storage, and the shape
    it runs at: samples per micro-batch and elements per sample (a measured peak holds for
    that shape alone; a batch of another shape is judged by the calibrated model); and the
    chunks its position-wise sub-modules run in."""
    kinds = tuple(sorted(_bytes_of(profile.blocks[i]) for i in recompute))
    return _key(profile, micro_batches, kinds, storage, chunks)


def _key(profile: Profile, micro_batches: int, kinds: tuple, storage: str, chunks: int):
    return (micro_batches, kinds, storage, math.ceil(profile.batch / micro_batches),
            profile.units, profile.unit, chunks)


def chunk_counts(profile: Profile) -> list:
    """The chunk counts a plan may run position-wise sub-modules in: along a sequence (a
    token profile) with such sub-modules, 2 to MAX_CHUNKS, each chunk MIN_CHUNK_TOKENS or
    more, and its widest save at least `chunk_floor` bytes (smaller, the chunks' saves go to
    the C heap, where a GPT-2's MLPs in chunks of 128 tokens peaked 1.7 times their model
    and every step grew the heap); else 1 (whole)."""
    counts = [1]
    if profile.unit != "sample" and any(b.local > 0 for b in profile.blocks):
        widest = max(b.local_widest for b in profile.blocks)
        c = 2
        while c <= MAX_CHUNKS and profile.batch >= c * MIN_CHUNK_TOKENS and \
                profile.batch / c * widest >= profile.chunk_floor:
            counts.append(c)
            c *= 2
    return counts


def predict(profile: Profile, micro_batches: int, recompute, storage: Storage,
            measured: Measured = NOTHING, chunks: int = 1) -> Plan:
    """The plan with its predicted peak (bytes above the floor) and seconds."""
    return Candidate(profile, recompute, storage, chunks).plan(micro_batches, measured)


class Candidate:
    """A set of recomputed blocks, a storage and chunks, at a profile: what its plans share
    whatever their micro-batches (the lines of its peak, its key's bytes, its seconds per
    sample), computed once; `plan(m)` predicts it in m micro-batches (the solver tries
    several m per candidate)."""

    def __init__(self, profile: Profile, recompute, storage: Storage, chunks: int = 1):
        self.profile, self.storage, self.chunks = profile, storage, chunks
        self.recompute = tuple(sorted(recompute))
        self.lines = peak_lines(profile, self.recompute, storage, chunks)
        self.kinds = tuple(sorted(_bytes_of(profile.blocks[i]) for i in self.recompute))
        local = sum(block.local_forward for block in profile.blocks) if chunks > 1 else 0.0
        self.per_sample = (profile.seconds + local
                           + sum(profile.blocks[i].forward for i in self.recompute)
                           + storage.seconds_per_byte * held_bytes(profile, self.recompute,
                                                                   chunks))

    def key(self, micro_batches: int) -> tuple:
        """memory_key of its plan in `micro_batches`."""
        return _key(self.profile, micro_batches, self.kinds, self.storage.name, self.chunks)

    def plan(self, micro_batches: int, measured: Measured = NOTHING) -> Plan:
        p = self.profile
        b = math.ceil(p.batch / micro_batches)
        grads = p.grads if micro_batches > 1 else 0.0
        peak = measured.peak(self.key(micro_batches),
                             grads + max(a + b * c for a, c in self.lines))
        seconds = p.batch * self.per_sample + micro_batches * p.per_micro_batch
        return Plan(micro_batches, self.recompute, self.storage.name, peak, seconds,
                    self.chunks)


def _bytes_of(block: Block) -> tuple:
    """What makes two blocks interchangeable in memory (their seconds aside)."""
    return block.saved, block.inputs, block.local, block.local_inputs


def recompute_sets(blocks) -> list:
    """The sets of recomputed blocks worth trying: blocks with the same bytes differ only in
    time, so of k such blocks the k fastest. Every count per kind of block while that is at
    most MAX_COMBINATIONS sets; beyond, prefixes in order of bytes freed per second."""
    kinds: dict = {}
    for i, b in enumerate(blocks):
        kinds.setdefault(_bytes_of(b), []).append(i)
    groups = [sorted(ix, key=lambda i: (blocks[i].forward, i)) for ix in kinds.values()]
    if math.prod(len(g) + 1 for g in groups) <= MAX_COMBINATIONS:
        return [tuple(sorted(i for g, k in zip(groups, counts) for i in g[:k]))
                for counts in itertools.product(*(range(len(g) + 1) for g in groups))]
    order = sorted(range(len(blocks)), key=lambda i: (
        -(blocks[i].saved - blocks[i].inputs) / max(blocks[i].forward, 1e-12), i))
    return [tuple(sorted(order[:k])) for k in range(len(blocks) + 1)]


def _fewest_micro_batches(candidate: Candidate, available: float,
                          measured: Measured) -> int | None:
    """The fewest micro-batches whose predicted peak fits. The model's peak falls as the
    micro-batches shrink, so a bisection finds where it starts to fit; a measured plan, or one
    whose micro-batch count is calibrated, may fit where the model says not, or the reverse,
    so those are checked one by one."""
    profile = candidate.profile
    counts = _counts(profile.batch) if profile.split else [1]
    model = Measured(caution=measured.caution)  # monotone in m > 1: what bisection needs

    def fits(m, by=measured):
        return candidate.plan(m, by).peak <= available

    if fits(1):  # one micro-batch holds no gradients through the others: checked apart
        return 1
    counts = counts[1:]
    lo, hi = 0, len(counts)
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(counts[mid], model):
            hi = mid
        else:
            lo = mid + 1
    known = sorted({k[0] for k in measured.peaks if k == candidate.key(k[0])}
                   | {m for m, name in measured.worst if name == candidate.storage.name})
    # (a count measured while micro-batches were allowed, in eval mode say, is not one now)
    best = next((m for m in known if (profile.split or m == 1) and fits(m)), None)
    for m in counts[lo:]:  # from where the model fits, unless a measurement says not
        if best is not None and m >= best:
            break
        if fits(m):
            return m
    return best


def _counts(batch: int) -> list:
    """Micro-batch counts that give distinct micro-batch sizes, fewest first."""
    return sorted({math.ceil(batch / b) for b in range(1, batch + 1)})


def _fastest(plans):
    return min(plans, key=lambda p: (p.seconds, p.micro_batches, len(p.recompute), p.chunks),
               default=None)


def solve(profile: Profile, available: float, exact: bool = False,
          measured: Measured = NOTHING) -> Plan | None:
    """The fastest plan whose predicted peak is at most `available` bytes above the floor,
    preferring exact storage (see LOSSY_GAIN); None if none fits."""
    candidates = {True: [], False: []}
    for recompute, storage, chunks in itertools.product(
            recompute_sets(profile.blocks), profile.storages, chunk_counts(profile)):
        if exact and not storage.exact:
            continue
        candidate = Candidate(profile, recompute, storage, chunks)
        m = _fewest_micro_batches(candidate, available, measured)
        if m is not None:
            candidates[storage.exact].append(candidate.plan(m, measured))
    best_exact, best_lossy = _fastest(candidates[True]), _fastest(candidates[False])
    if best_lossy is None:
        return best_exact
    if best_exact is None or best_lossy.seconds * LOSSY_GAIN < best_exact.seconds:
        return best_lossy
    return best_exact


def smallest(profile: Profile, exact: bool = False, measured: Measured = NOTHING) -> float:
    """The smallest peak above the floor any allowed plan predicts."""
    counts = set(_counts(profile.batch) if profile.split else [1])
    counts |= {k[0] for k in measured.peaks if profile.split or k[0] == 1}
    counts |= {m for m, _ in measured.worst if profile.split or m == 1}
    candidates = [Candidate(profile, r, s, c) for r in recompute_sets(profile.blocks)
                  for c in chunk_counts(profile) for s in profile.storages
                  if s.exact or not exact]
    return min(candidate.plan(m, measured).peak for candidate in candidates for m in counts)
