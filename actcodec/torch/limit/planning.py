"""What a Step knows of its model's memory, and the plan it makes from that at each step:
profiles measured per batch shape, the peaks measured per plan, the margins the limit keeps.
Numbers in, a plan out (no torch): the solver is limit_plan's; measuring and running are
the Step's (actcodec.torch.limit.step).
"""
from __future__ import annotations

import dataclasses

from . import limit_plan

MiB = 1 << 20
# What the plan leaves free of the room above the floor: a share for what no measurement
# covers (a noisy peak, the heap's drift) plus a constant for small buffers.
SAFETY, SAFETY_BYTES = 0.02, 16 * MiB
# Before any step has run, a plan is trusted to the model's peak times 1 + CAUTION: the
# probes are small, and a step on a new plan lays out its memory first fit (the store learns
# lifetimes from the step before). Steps run then calibrate it (limit_plan.Measured.learn).
CAUTION = 0.25
# A plan that fits by its measured peak gives way to one not yet run only where the model
# makes that one this many times faster.
SWITCH_GAIN = 1.10
UNBOUNDED = 1 << 60  # a budget that holds everything (then every save stays exact)


# What a refusal names is a limit a fresh Step accepts too, in another process: its floor
# and its probes differ from this one's (the free heap resident as a probe starts moves its
# peak by tens of MiB from one process to the next), so the name carries a share of the
# room beyond this Step's smallest.
NAMED_SHARE, NAMED_BYTES = 0.05, 4 * MiB


def available(room: float) -> float:
    """Bytes a plan may add above the floor, of `room` (limit - floor), margins kept."""
    return room * (1 - SAFETY) - SAFETY_BYTES


def limit_for(least: float, floor: int) -> int:
    """The smallest limit under which a plan peaking `least` above `floor` is accepted."""
    return int(floor + (least + SAFETY_BYTES) / (1 - SAFETY)) + 1


def to_name(limit: int, floor: int) -> int:
    """The limit a refusal names for `limit`, the smallest this Step accepts from `floor`."""
    return int(limit + max(NAMED_BYTES, NAMED_SHARE * (limit - floor)))


def stay(plan, last, profile: limit_plan.Profile, room_left: float,
         measured: limit_plan.Measured):
    """The plan run last where it still fits by its measured peak and `plan` is one not yet
    run that the model makes less than SWITCH_GAIN faster: a new plan's first step is where
    the model errs (its layout first fit, an error the calibration has not seen)."""
    if plan is None or last is None or last == plan or last.peak <= 0:
        return plan
    if last.micro_batches > 1 and not profile.split:
        return plan  # batch norm trains now: micro-batches are no longer allowed
    key = lambda p: limit_plan.memory_key(profile, p.micro_batches, p.recompute, p.storage,
                                          p.chunks)
    if key(last) not in measured.peaks or key(plan) in measured.peaks \
            or measured.peaks[key(last)] > room_left:
        return plan
    storage = next((s for s in profile.storages if s.name == last.storage), None)
    if storage is None:
        return plan
    if last.chunks not in limit_plan.chunk_counts(profile):
        return plan
    kept = limit_plan.predict(profile, last.micro_batches, last.recompute, storage, measured,
                              last.chunks)
    return plan if plan.seconds * SWITCH_GAIN < kept.seconds else kept


def covers(measured: str, unit: str) -> bool:
    """Whether a profile per `measured` unit (actcodec.torch.limit.shape.sequence_unit) serves
    batches of `unit`: the same unit, or, along sequences of several lengths (an
    encoder-decoder's source and labels), one of the same sequences whose every share of
    the longest is at least as large (such a batch holds no more per token of its longest:
    labels of a fifth of the source are planned from a profile of a quarter, not probed
    again for each proportion a dataset has)."""
    if measured == unit:
        return True
    have, want = _shares(measured), _shares(unit)
    return have is not None and want is not None and len(have) == len(want) and \
        all(a >= b for a, b in zip(have, want))


def _shares(unit: str):
    """The sequences' shares of the longest in a unit of several lengths; None otherwise."""
    kind, _, shares = unit.partition(" ")
    if kind != "token" or not shares:
        return None
    try:
        return tuple(float(x) for x in shares.split(":"))
    except ValueError:
        return None


class Planning:
    """A Step's knowledge: `profiles` measured, by shape (`(unit, units)`: ("sample",
    elements per sample) or ("token", a single sample's sequence length), see
    actcodec.torch.limit.shape); `measured`, the peaks of plans run and the calibration they
    give; `profile`, the last planned step's (at its shape, batch and training mode);
    `available`, the bytes its plan could add."""

    def __init__(self, exact: bool):
        self.exact = exact
        self.profiles: dict = {}
        self.measured = limit_plan.Measured(caution=CAUTION)
        self.profile: limit_plan.Profile | None = None
        self.available: float | None = None

    def add(self, shape: tuple, profile: limit_plan.Profile) -> None:
        unit, units = shape
        self.profiles[shape] = dataclasses.replace(profile, units=units, unit=unit)

    def at(self, shape: tuple):
        """The profile for this shape: the measured one of the smallest shape of its unit at
        least as large, scaled down (an upper bound); else the largest measured, scaled up
        (limit_plan.scaled: an upper bound for what grows with a sequence's length); None
        before any profile of the unit."""
        unit, units = shape
        known = [(u, sum(_shares(kind) or ()), kind) for kind, u in self.profiles
                 if covers(kind, unit)]
        if not known:
            return None
        larger = [k for k in known if k[0] >= units]
        u, _, kind = min(larger) if larger else max(known, key=lambda k: (k[0], -k[1]))
        # planned, and its peaks kept, as its own unit: a peak measured for samples of
        # shorter labels is no measure of the longer ones this profile was probed on
        return dataclasses.replace(limit_plan.scaled(self.profiles[kind, u], units), unit=unit)

    def measured_for(self, shape: tuple) -> bool:
        """Whether a profile measured at this shape or a larger one serves it (else at()
        scales up a smaller one's: an upper bound)."""
        unit, units = shape
        return any(covers(kind, unit) and u >= units for kind, u in self.profiles)

    def needs_probes(self, shape: tuple, room: float) -> bool:
        """Whether to probe the model at this shape: where no measured shape of its unit is
        as large, and its largest probe is predicted to fit, as it runs (one sample, or half
        the sequence's tokens, stored as they are): probes grow from small to large and stop
        before the limit; what is predicted not to fit is refused by the plan, unprobed."""
        return not self.measured_for(shape) and self.probe_fits(shape, room)

    def probe_fits(self, shape: tuple, room: float) -> bool:
        """Whether the largest probe at this shape is predicted to fit in `room` by the
        profile measured so far (scaled up: an upper bound); True before any of its unit."""
        unit, units = shape
        known = self.at(shape)
        if known is None:
            return True
        probe = dataclasses.replace(known, batch=1 if unit == "sample" else int(units) // 2)
        return limit_plan.predict(probe, 1, (), limit_plan.PLAIN).peak <= available(room)

    def largest(self, unit: str) -> float | None:
        """The largest shape of this unit measured so far (None before one)."""
        return max((u for kind, u in self.profiles if kind == unit), default=None)

    def plan(self, size: int, shape: tuple, split: bool, room: float, last):
        """The plan for a batch of `size` samples of this shape (a token shape: one sample
        of that many tokens, never split), `split` whether micro-batches are allowed now,
        `room` bytes above the floor, `last` the plan run last (kept where it still fits and
        the new one is not clearly faster); None if none fits."""
        unit, units = shape
        batch = size if unit == "sample" else int(units)
        profile = dataclasses.replace(self.at(shape), batch=batch,
                                      split=split and unit == "sample")
        self.profile, self.available = profile, available(room)
        plan = limit_plan.solve(profile, self.available, self.exact, self.measured)
        return stay(plan, last, profile, self.available, self.measured)

    def held_allowance(self, plan, size: int, room: float | None) -> int:
        """A budget plan's bytes held for backward: what the model gives its saves at their
        fewest bits, plus the room the plan leaves (the budget spends it on more bits where
        they matter most). Without a profile (a pinned plan): the room, or everything
        without a limit (room None)."""
        if room is None:
            return UNBOUNDED
        if self.profile is None or self.available is None:
            return int(max(0, available(room)))
        storage = next(s for s in self.profile.storages if s.name == "budget")
        b = -(-size // plan.micro_batches)
        held = b * storage.ratio * limit_plan.held_bytes(self.profile, plan.recompute,
                                                         plan.chunks)
        return int(max(0.0, held + max(0.0, self.available - plan.peak)))

    def needed(self, floor: int, split: bool | None = None) -> int | None:
        """The smallest limit the last step's batch would be accepted under from `floor`,
        with micro-batches allowed or not (`split`; the last step's where None)."""
        if self.profile is None:
            return None
        profile = self.profile if split is None else dataclasses.replace(
            self.profile, split=split and self.profile.unit == "sample")
        return limit_for(limit_plan.smallest(profile, self.exact, self.measured), floor)

    def learn_times(self, plan, times: dict) -> None:
        """A step's times on the device's own clock (`times`: seconds per block index of its
        forwards, and "step"): the profile at that step's shape takes its seconds from them
        from now on (limit_plan.timed). Where the step ran at a shape only scaled from a
        measured one, nothing is learnt."""
        profile = self.profile
        if profile is None or "step" not in times:
            return
        shape = (profile.unit, profile.units)
        if shape not in self.profiles:
            return
        learnt = limit_plan.timed(profile, plan, times, times["step"])
        if learnt is not None:
            self.profiles[shape] = dataclasses.replace(
                self.profiles[shape], blocks=learnt.blocks, seconds=learnt.seconds)

    def learn(self, plan, measured: int, calibrate: bool = True) -> None:
        """The measured peak (bytes above the floor) judges this plan from now on (its
        largest), and, with `calibrate`, how far plans not yet run trust the model."""
        profile = self.profile
        if profile is None or plan.peak <= 0:
            return
        key = limit_plan.memory_key(profile, plan.micro_batches, plan.recompute, plan.storage,
                                    plan.chunks)
        storage = next(s for s in profile.storages if s.name == plan.storage)
        model = limit_plan.predict(profile, plan.micro_batches, plan.recompute, storage,
                                   chunks=plan.chunks).peak
        if model > 0:
            self.measured = self.measured.learn(key, measured, model, calibrate)
