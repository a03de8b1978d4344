"""A training step within a memory limit for the whole process (Sage, Melon, PORT, DAF):

    step = act.Step(model, limit="1GiB")
    for batch in loader:
        loss = step(batch)          # forward and backward of the whole batch, into .grad
        opt.step(); opt.zero_grad()

The limit is on the memory of where the model lives (meter.py): the process's resident memory
as the system counts it, or, for a model on a CUDA device, the device's memory as PyTorch's
caching allocator reserves it. At each step's start the floor (what is live: parameters,
optimizer state, libraries) is measured; the step adds at most `limit - floor`. The first step profiles the model in small probes
(actcodec.torch.step_profile), then a pure solver (actcodec.torch.limit_plan) picks the
fastest plan that fits: micro-batches (gradient accumulation), recomputation of repeated
blocks (actcodec.torch.blocks), how what the step holds is stored (as it is, lossless,
paged to disk or on CUDA offloaded to pinned host memory, or, on the CPU where lossy saves
are allowed and pay, under a saved-bytes budget that
gives each save its bits by importance, none below `bits`). Each step's measured peak
corrects the model for the next (it only ever grows more careful). A limit lowered while a
budget step runs lowers its budget at once, by how far it went below the limit the step was
planned for; the stepping thread makes room at its next save (see `Step.limit`).

Exact plans are preferred; with exact=True nothing lossy is used. Micro-batches are exact
up to float summation order, and used only where no statistic over the batch would be
taken per micro-batch: no batch-norm layer trains (unless ghost_batchnorm=True), no router
load-balancing loss (a transformers mixture of experts given output_router_logits), none
where split=False says one is (a loss_fn's in-batch negatives); dropout draws its masks per
micro-batch.
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping
import dataclasses
import inspect
import threading
import time
import warnings
import weakref

import torch

from ... import store as stores
from ..save import allocator as allocators
from . import accumulate
from . import blocks as blocks_mod
from . import causal_lm, chunked_loss, masked_lm, seq2seq_lm
from . import limit_plan
from . import loss_weights, meter as meters, mini_sequence
from . import micro_batches as mb
from . import optimizer_cap, optimizer_state, planning, shape, step_profile, wrapped
from ..budget import spill as spills
from ..budget.budget import parse_bytes
from ..save import offload
from ..save.hooks import compress_saved
from ..save.policy import Policy

from .planning import SAFETY, SAFETY_BYTES, SWITCH_GAIN, UNBOUNDED  # noqa: F401

MiB = 1 << 20
LOSSY_BITS = (8, 4, 2)
# The chunked loss's chunk under a limit: this many bytes of float32 logits (128 tokens at a
# 32k vocabulary), or a share of a larger limit up to the standalone default. Its two chunk
# buffers are part of the forward's peak, which a tight limit leaves little room for; a
# quarter of the standalone default costs about 1.1x the loss's own time
# (docs/CHUNKED_LOSS.md), and on a GPU each chunk's kernels must be long enough to hide
# their launches.
STEP_CHUNK_LOGITS_BYTES, STEP_CHUNK_LIMIT_SHARE = 16 << 20, 1 / 128
# A batch of sequences longer than any measured, whose probe the profile so far does not
# let run, is first profiled cut shorter, at most this many times (Step._probe_shorter).
SHORTER_RUNGS = 3


class MemoryLimitError(MemoryError):
    """No plan fits the limit. `needed`: the smallest limit that would, in bytes (None where
    it is not known)."""

    def __init__(self, message: str, needed: int | None = None):
        super().__init__(message)
        self.needed = needed


@dataclasses.dataclass
class StepStats:
    """The last step: its peak RSS (its probes' included) and the floor it started from
    (bytes), the limit it ran under, what the plan predicted, micro-batches run, seconds per
    phase."""

    peak: int = 0
    floor: int = 0
    limit: int | None = None
    predicted: int = 0
    micro_batches: int = 0
    seconds: dict = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        lim = "none" if self.limit is None else f"{self.limit / MiB:.0f} MiB"
        phases = ", ".join(f"{k} {v:.2f}s" for k, v in self.seconds.items())
        return (f"peak {self.peak / MiB:.0f} MiB (floor {self.floor / MiB:.0f}, limit {lim}, "
                f"predicted {self.predicted / MiB:.0f}); {self.micro_batches} micro-batches; "
                f"{phases}")


def _storages(bits: int, exact: bool, cuda: bool = False) -> tuple:
    """Exact: as it is, lossless, paged out (on CUDA: offloaded to pinned host memory). Lossy
    (not on CUDA yet): "budget", a saved-bytes budget over the room the plan leaves, bits
    per save by importance per byte, none below `bits`."""
    if cuda:
        return ("plain", "lossless", "offload")
    return ("plain", "lossless", "paged") + (() if exact else ("budget",))


class Step:
    """The training step under a limit (see the module doc).

    model: a torch module on the CPU or a CUDA device (when a limit is set; elsewhere a
    ValueError at the first step; a torch.compile'd one runs as its eager module, with a
    RuntimeWarning); limit: bytes or a string such as "1GiB", "free" (what the
    device has at each step), None for plain training through the same API; loss_fn(model, micro_batch): the
    micro-batch's mean loss, or (loss, weight) (default for dict batches: model(**b).loss);
    bits: the fewest bits a lossy save may take (8, 4 or 2); exact: no lossy saves; spill_dir:
    where paged saves go (checked here: exists, a directory, writable); ghost_batchnorm:
    allow micro-batches with batch norm in training (statistics per micro-batch); split:
    False where the loss_fn or the model takes a statistic over the whole batch that Step
    cannot see (in-batch negatives, a batch-wide normalization): no micro-batches; batch_size:
    the batch dimension's length where the first tensor does not have it; plan: a Plan (or
    its dict) to run every step instead of solving (numerics then do not change with timing;
    it is not planned for the limit: a step whose peak exceeds a limit raises
    MemoryLimitError after it ran, .grad as it was, so pass limit=None to run a pinned plan
    whatever it takes); scaler: a torch GradScaler;
    allocator: whether a step under a limit may install actcodec's torch allocator (process
    wide, from then on; see actcodec.torch.save.allocator): with limit=None nothing is
    installed, whatever the plan; False never installs it; chunk_loss: under a limit, the
    default loss of a transformers causal LM (or PEFT adapters on one; a dict batch with
    labels) runs its head and
    cross-entropy in chunks of tokens (act.causal_lm_loss: the same loss and gradients up to
    summation order, without the tokens x vocabulary logits), and so does an encoder-decoder
    LM's (T5's and BART's kinds: seq2seq_lm) and a masked LM's (BERT's kinds, on its labelled
    tokens only: masked_lm); False: model(**b).loss always.

    A batch of one sample of at least 64 tokens (token ids of shape (1, T)) is planned along
    its sequence: its probes run on its first quarter and half, and its plan cannot use
    micro-batches (recomputation and storage remain), so a limit one long sample fits in
    is met, not refused.

    The model is left as it was: recomputation is a pair of removable hooks on each repeated
    block (blocks.attach), which deepcopy, pickle and torch.save carry inert (a copy computes
    with its own weights and never recomputes for this Step). `close()`, or leaving
    `with Step(model, ...) as step:`, removes them and releases the Step's contexts; a Step
    garbage-collected unclosed removes them too. Two Steps on one model share the hooks
    (each runs its own plans; the hooks go with the last one closed); a Step on another set
    of blocks of a model that already has one is refused.

    Micro-batches add up to the full batch's gradient: each loss is weighted by what it
    averages over. The default loss of a dict batch with `labels` by its targets (labels
    not -100, after a causal LM's shift by one), or, with `num_items_in_batch` in the batch
    (the loss then a sum over that count), not at all: the micro-batches add; a loss_fn's
    plain loss by its samples (a RuntimeWarning where the labels count targets otherwise:
    return (loss, act.count_targets(model, micro_batch))), its (loss, weight) by the weight.
    A micro-batch without a target adds nothing. An exception in a step leaves .grad as it was before it."""

    def __init__(self, model: torch.nn.Module, limit=None, *, loss_fn=None, bits: int = 8,
                 exact: bool = False, spill_dir: str | None = None,
                 ghost_batchnorm: bool = False, batch_size: int | None = None, plan=None,
                 scaler=None, allocator: bool = True, optimizer=None,
                 chunk_loss: bool = True, split: bool = True):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"Step needs a torch.nn.Module, got {type(model).__name__}")
        if wrapped.compiled(model):
            # the plan's hooks decide per step what each block does (recompute, chunks), in
            # Python a compiled graph would not follow (its guards see none of it)
            warnings.warn("Step runs a torch.compile'd model as its eager module "
                          "(model._orig_mod): its plans change per step what each block "
                          "does, which a compiled graph does not follow", RuntimeWarning,
                          stacklevel=2)
            model = model._orig_mod
        if bits not in LOSSY_BITS:
            raise ValueError(f"bits must be one of {LOSSY_BITS}, got {bits!r}")
        self.model, self.loss_fn = model, loss_fn if loss_fn is not None else mb.default_loss
        # checked now (exists, a directory, writable): a bad one is named here, not mid-step
        spill_dir = spills.check_dir(spill_dir)
        self.bits, self.exact, self.spill_dir = bits, bool(exact), spill_dir
        self.ghost_batchnorm, self.batch_size, self.scaler = ghost_batchnorm, batch_size, scaler
        self.split = bool(split)
        self._lock = threading.Lock()
        self._limit = _parse_limit(limit)
        self._over_capacity = None  # the last limit warned as above what the device has
        self._capacity_seen = None  # (limit, device, capacity) where a meter reads it seldom
        self._lowered = False
        self.plan = None if plan is None else (
            plan if isinstance(plan, limit_plan.Plan) else limit_plan.Plan.from_dict(plan))
        self.frozen = plan is not None
        self.optimizer = optimizer
        self.chunk_loss = bool(chunk_loss)
        optimizer_state.pending_bytes(optimizer)  # a clear error now for what is not one
        self._planning = planning.Planning(self.exact)  # profiles, measured peaks
        self.stats = StepStats()
        # PEFT's prefix tuning hands every layer a cache holding the prefix, which each
        # attention call extends: a layer recomputed in backward would extend it twice
        prefix = wrapped.prompt_learning(model) == "PREFIX_TUNING"
        self.blocks = [] if prefix else blocks_mod.find(model)
        if self.plan is not None and any(i >= len(self.blocks) for i in self.plan.recompute):
            raise ValueError(
                f"the plan recomputes blocks {list(self.plan.recompute)}, but the model has "
                f"{len(self.blocks)} repeated blocks to recompute" +
                (" (PEFT prefix tuning: none, its prefix is a cache that a recomputed layer "
                 "would extend twice)" if prefix else ""))
        # recomputation as removable hooks on the blocks (shared with another Step on the
        # same blocks); close(), or the Step's garbage collection, takes them off
        attachment = blocks_mod.attach(self.blocks)
        local = mini_sequence.attach(self.blocks)  # position-wise children, in chunks
        # the optimizer's step after a step under a limit, kept to it by the allocator
        # where the meter can (CUDA): hooks on the optimizer, taken off with the blocks'
        self._optimizer_cap = None if optimizer is None else \
            optimizer_cap.OptimizerCap.attach(optimizer)
        self._detach = weakref.finalize(self, _release, attachment, local,
                                        *filter(None, [self._optimizer_cap]))
        self._detach.atexit = False
        self._closed = False
        self._running = 0  # steps running now (any thread): close() waits for none
        self._contexts: dict = {}
        self._period_samples = 0  # samples of the micro-batch run last (see _run)
        self._weights_warned = False  # _check_weights warned already
        self._loss_checked: dict = {}  # _holds's answers, by the batch's keys
        self._clocked = None  # (the device's clock of the last step, its plan): see _run
        self._in_flight = None  # the budget context of the step running now, if any
        # (the limit, the budget) that step was planned for; with _limit, changed together
        # under _lock only, so its budget always follows the limit (_in_flight_budget)
        self._planned = None
        if spill_dir is not None and step_profile.memory_backed(spill_dir):
            warnings.warn(f"spill_dir {spill_dir!r} is memory-backed (tmpfs): what the step "
                          f"pages out there still takes the machine's memory", RuntimeWarning,
                          stacklevel=2)
        self.allocator = bool(allocator)  # installed at the first step under a limit

    # -- the limit ---------------------------------------------------------------------------
    @property
    def limit(self) -> int | None:
        """The memory limit in bytes (None: none; "free": at each step, what the device
        has, meter.capacity()) on where the model lives: the process's resident memory, or
        a CUDA device's reserved memory. Settable at any time, from any thread; the next step
        is planned for it. A limit above what there is is planned as what there is, with a
        RuntimeWarning.

        A budget step running meanwhile has its saved-bytes budget follow at once: the
        plan's budget less how far the limit now is below the limit the step was planned
        for (raising it never cuts; setting it back gives the plan's budget again, which
        fitted that limit). The setter only records both, together under the lock: the
        stepping thread makes room (re-encodes down to `bits`, then pages out) at its next
        save, and an error doing so (a full spill_dir) is raised there, in the step, which
        leaves .grad as it was. A step planned without a limit keeps its budget."""
        return self._limit

    @limit.setter
    def limit(self, value) -> None:
        value = _parse_limit(value)
        with self._lock:
            if value is not None and (not isinstance(self._limit, int) or
                                      not isinstance(value, int) or value < self._limit):
                self._lowered = True
            self._limit = value
            if self._in_flight is not None:
                self._in_flight.request_budget(self._in_flight_budget())

    def _in_flight_budget(self) -> int:
        """The running budget step's budget under the current limit (called under _lock):
        its plan's, less how far the limit is below the one it was planned for."""
        planned_limit, planned_budget = self._planned
        if planned_limit is None or not isinstance(self._limit, int):
            return planned_budget
        return max(0, planned_budget - max(0, planned_limit - self._limit))

    @property
    def profile(self) -> limit_plan.Profile | None:
        """The last planned step's profile (at its batch and shape); None before one."""
        return self._planning.profile

    def freeze(self) -> limit_plan.Plan | None:
        """Keep the current plan from now on (it no longer follows timing or the limit)."""
        self.frozen = True
        return self.plan

    # -- the model left as it was -----------------------------------------------------------
    def close(self) -> None:
        """Removes what the Step put on the model (its blocks' hooks, unless another Step on
        the same blocks still uses them) and releases its contexts. A second close does
        nothing; a step after it raises RuntimeError."""
        with self._lock:
            if self._running:
                raise RuntimeError("Step.close() while a step is running: close it after")
            self._closed = True
        self._detach()
        for ctx in self._contexts.values():
            if callable(getattr(ctx, "close", None)):
                ctx.close()  # a budget's spill file
        self._contexts.clear()

    def __enter__(self) -> "Step":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- one step ----------------------------------------------------------------------------
    def __call__(self, batch):
        with self._lock:
            if self._closed:
                raise RuntimeError("this Step was closed (close() removed its hooks from the "
                                   "model); make a new Step to train on")
            self._running += 1
        try:
            return self._step(batch)
        finally:
            with self._lock:
                self._running -= 1

    def _step(self, batch):
        if self._optimizer_cap is not None:  # armed by the step before, for its optimizer
            self._optimizer_cap.disarm()
        size = mb.batch_size(batch, self.batch_size)
        with self._lock:
            limit, lowered, self._lowered = self._limit, self._lowered, False
        meter = self._meter(strict=limit is not None)
        if limit is not None:
            limit = self._within_capacity(limit, meter)
            if self.allocator and isinstance(meter, meters.ProcessMeter):
                allocators.ensure()  # before the floor: its first install trims the heap
            _give_back_free(meter, limit)
            try:
                with meter.capped(limit):
                    return self._within(batch, size, limit, lowered, meter)
            except torch.cuda.OutOfMemoryError as exc:
                self._capacity_seen = None  # the device may have less now: read it again
                plan = self.plan
                if plan is not None and self._planning.profile is not None:
                    # judged as peaking just past the room it had (more is not known): the
                    # next step plans another. Not a calibration: the device may have had
                    # less than the limit (another process), and a room far above the
                    # model's peak would read as the model erring on every plan that much
                    self._planning.learn(plan, max(0, limit - self._floor(meter)) + 1,
                                         calibrate=False)
                needed = self.smallest_limit()
                smallest = "" if needed is None else \
                    f"; the smallest limit a plan now fits is about {needed / MiB:.0f} MiB"
                raise MemoryLimitError(
                    f"the step needed more than the limit of {limit / MiB:.0f} MiB on "
                    f"{meter.device} (the caching allocator was kept to it); .grad is as "
                    f"it was, and the next step plans with what this one measured{smallest}",
                    needed) from exc
        return self._within(batch, size, limit, lowered, meter)

    def _within(self, batch, size, limit, lowered, meter):
        """The step, its probes and plan under `limit` (None: plain, through the same path)."""
        clocked, self._clocked = self._clocked, None
        if clocked is not None:  # the step before, as the device ran it (by now, mostly)
            times = clocked[0].read()
            if times is not None:
                self._planning.learn_times(clocked[1], times)
        seconds = {}
        batch = _no_cache(self.model, batch)
        # the micro-batches' shares need the batch's targets (and a loss_fn's, until
        # _check_weights has warned): counted now, read after planning, without a wait
        counted = loss_weights.start_counting(
            self.model, batch, size, self.loss_fn is mb.default_loss or not self._weights_warned)
        tokens = shape.sequence_length(batch, size)
        key = (shape.sequence_unit(batch, size), tokens) if tokens is not None else \
            ("sample", shape.units_per_sample(batch, size))
        with meter.peak() as before:  # the probes' peak: the limit holds for them too
            floor = self._floor(meter)
            if limit is not None and not self.frozen and \
                    self._planning.needs_probes(key, limit - floor):
                # before any forward: the chunked loss's check on a prefix, then the probes
                self._refuse_without_room(limit, floor)
            loss_fn = self._loss_fn(batch, limit)
            if limit is not None and not self.frozen:
                t0, probed = time.perf_counter(), False
                if tokens is None:
                    floor, probed = self._probe_shorter(batch, size, key, loss_fn, limit, floor,
                                                        meter)
                if self._planning.needs_probes(key, limit - floor):
                    floor, probed = self._probe(batch, size, key, tokens, loss_fn, limit, floor,
                                                meter), True
                if probed:
                    seconds["profile"] = time.perf_counter() - t0
            last = self.plan
            plan = self._plan_for(size, key, limit, floor, batch)
            if lowered or plan != last:  # give back the pages a larger plan or probes kept
                meter.give_back()
        probes = before.nbytes if "profile" in seconds else 0
        if self.frozen and limit is not None:
            loss = self._run_pinned(batch, size, plan, limit, floor, seconds, loss_fn, meter,
                                    counted)
        else:
            loss = self._run(batch, size, plan, limit, floor, seconds, probes, loss_fn, meter,
                             counted)
        if limit is not None:
            if self._optimizer_cap is not None and meter.can_cap:
                self._optimizer_cap.arm(meter, limit)
            else:
                _room_for_the_optimizer(meter, self.optimizer, limit)
        return loss

    def _probe(self, batch, size, key, tokens, loss_fn, limit, floor, meter) -> int:
        """Profiles the model at this batch's shape (step_profile.measure) within the limit;
        returns the floor after it."""
        self._refuse_without_room(limit, floor)  # before a probe takes it over
        uncut = loss_weights.uncut_labels(batch, size) if tokens is None else None
        if uncut is not None:
            raise ValueError(
                f"Step plans a step under a limit from probes of the batch's first samples, "
                f"but {uncut}; give labels of one row per sample, or run it with limit=None "
                f"(or a pinned plan=act.Plan())")
        if tokens is None:
            run, count, split, first = (
                lambda n: self._loss(mb.take(batch, size, 0, n), loss_fn)[0],
                size, self._split(batch, size), None)
        else:  # one sample along its tokens: probes on its first n
            run, count, split, first = (
                lambda n: self._loss(shape.first_tokens(batch, tokens, n), loss_fn)[0],
                tokens, False, tokens // 4)
            sequences = set(shape.token_lengths(batch, size))
            lengths = lambda n: {shape.cut_length(t, tokens, n) for t in sequences}
        cuda = isinstance(meter, meters.CudaMeter)
        # the probes draw no random numbers of the step's: its dropout masks (and every later
        # step's) are those of plain training, whose gradient a plain plan then gives
        devices = [p.device for p in self.model.parameters() if p.device.type == "cuda"][:1]
        with torch.random.fork_rng(devices=devices):
            measured = step_profile.measure(
                run, self.model, self.blocks, count, _storages(self.bits, self.exact, cuda),
                split, self.spill_dir, room=planning.available(limit - floor),
                paged=self._context("offload" if cuda else "paged"), bits=self.bits,
                budgeted=None if self.exact or cuda else self._context("budget"),
                lossless=self._context("lossless"), first=first,
                fixed_bytes=self._loss_buffers(batch, limit), meter=meter,
                lengths=None if tokens is None else lengths)
        self._planning.add(key, measured)
        # the probes' lazy state (libraries, caches) stays; what the allocators kept free of
        # theirs goes back first, or the floor would count it, and the peaks measured from it
        # would judge the plan by less than it holds
        meter.give_back()
        meter.trim()
        return self._floor(meter)

    def _probe_shorter(self, batch, size, key, loss_fn, limit, floor, meter) -> tuple:
        """A batch of token sequences longer than any measured, whose probe the profile so
        far does not let run (scaled up as the square of the length: an upper bound) is
        first profiled on its own samples cut shorter: each rung as long as that bound lets
        its probe run, so that the next bound starts from a measured length nearer the
        batch's (at most SHORTER_RUNGS rungs, each at most a factor of two shorter than the
        batch, a factor of sqrt(2) apart). Only a dict batch under the default loss, which
        takes any length (a loss_fn of the user's may not). Returns (the floor after, whether
        a rung ran)."""
        length = shape.token_length(batch, size)
        known = self._planning.largest("sample")
        if length is None or known is None or key[1] <= known or \
                self.loss_fn is not mb.default_loss or not isinstance(batch, Mapping):
            return floor, False
        probed = False
        for _ in range(SHORTER_RUNGS):
            if self._planning.probe_fits(key, limit - floor):
                break
            rung = None
            for j in range(1, 3):
                cut = shape.first_tokens(batch, length, int(length * 2 ** (-j / 2)), size)
                cut_key = ("sample", shape.units_per_sample(cut, size))
                if cut_key[1] <= self._planning.largest("sample"):
                    break
                if self._planning.probe_fits(cut_key, limit - floor):
                    rung = cut, cut_key
                    break
            if rung is None:
                break
            floor, probed = self._probe(rung[0], size, rung[1], None, loss_fn, limit, floor,
                                        meter), True
        return floor, probed

    def _meter(self, strict: bool):
        """The meter of where the model is now (a model may move between steps). strict: a
        device no meter covers is a ValueError; else (no limit: only the stats read it) the
        process's."""
        try:
            return meters.meter_for(self.model)
        except ValueError:
            if strict:
                raise
            return meters.ProcessMeter()

    def _within_capacity(self, limit, meter) -> int:
        """The limit this step plans for: "free" is what the device has now; a limit above
        that is planned as it, with a RuntimeWarning (once per limit)."""
        seen = self._capacity_seen
        if limit != "free" and not meter.capacity_each_step and seen is not None and \
                seen[:2] == (limit, meter.device):
            capacity = seen[2]
        else:
            capacity = meter.capacity()
            self._capacity_seen = (limit, meter.device, capacity)
        if limit == "free":
            if capacity is None:
                raise ValueError("limit='free': how much memory this process may use is not "
                                 "known here (no /proc/meminfo, no cgroup limit); pass bytes")
            return capacity
        if capacity is not None and limit > capacity:
            if self._over_capacity != limit:
                self._over_capacity = limit
                warnings.warn(f"the limit of {limit / MiB:.0f} MiB is above what "
                              f"{meter.device} has ({capacity / MiB:.0f} MiB with what this "
                              f"process holds): planned as {capacity / MiB:.0f} MiB",
                              RuntimeWarning, stacklevel=4)
            return capacity
        return limit

    def _loss_fn(self, batch, limit):
        """The loss this step runs: the chunked head and loss for the default loss of a
        covered causal LM or encoder-decoder under a limit (see chunk_loss), else the Step's
        loss_fn."""
        chunked = self._chunked(batch, limit)
        if chunked is None:
            return self.loss_fn
        kind, chunk = chunked
        if kind is causal_lm:
            return _checked_once(chunk)
        if kind is masked_lm:
            return lambda model, b: masked_lm.masked_lm_loss(model, b, chunk_tokens=chunk,
                                                             checked=True)
        return lambda model, b: seq2seq_lm.seq2seq_lm_loss(model, b, chunk_tokens=chunk,
                                                           checked=True)

    def _chunked(self, batch, limit):
        """(the module whose chunked loss this step runs, causal_lm, seq2seq_lm or masked_lm,
        its chunk in tokens) where it runs one, else None."""
        if limit is None or not self.chunk_loss or self.loss_fn is not mb.default_loss or \
                not isinstance(batch, Mapping) or batch.get("labels") is None:
            return None
        kind = _chunked_kind(self.model, batch)
        if kind is None or not self._holds(kind, batch):
            return None
        vocab = kind.head(self.model).out_features
        logits = min(max(STEP_CHUNK_LOGITS_BYTES, int(limit * STEP_CHUNK_LIMIT_SHARE)),
                     chunked_loss.CHUNK_LOGITS_BYTES)
        return kind, chunked_loss.default_chunk_tokens(vocab, logits)

    def _holds(self, kind, batch) -> bool:
        """Whether the chunked loss gives the model's: checked on the prefix of the first batch
        of each set of keys (a key the model's loss reads, absent before, can make the two
        differ), by `kind.check`, not inside the loss, where a probe's hooks, and the block
        measured alone, would take the prefix's forward for the step's; where they differ,
        the model's own loss runs, with a RuntimeWarning."""
        keys = frozenset(k for k, v in batch.items() if v is not None)
        if keys not in self._loss_checked:
            try:
                kind.check(self.model, batch)
                self._loss_checked[keys] = True
            except Exception as exc:  # noqa: BLE001 (a forward that fails on the prefix too)
                warnings.warn(f"the chunked loss does not cover {type(self.model).__name__} "
                              f"({type(exc).__name__}: {exc}); its own loss runs whole",
                              RuntimeWarning, stacklevel=5)
                self._loss_checked[keys] = False
        return self._loss_checked[keys]

    def _loss_buffers(self, batch, limit) -> int:
        """The chunked loss's two float32 chunk x vocabulary buffers (0 where it does not
        run): held by every step at least a chunk long, whatever its length."""
        chunked = self._chunked(batch, limit)
        if chunked is None:
            return 0
        kind, chunk = chunked
        return 2 * 4 * chunk * kind.head(self.model).out_features

    def _run_pinned(self, batch, size, plan, limit: int, floor: int, seconds, loss_fn, meter,
                    counted=None):
        """A pinned (or frozen) plan under a limit: not planned for it, so its peak is held
        against the limit after it ran; above it, MemoryLimitError and .grad put back as it
        was (what it held is set aside around the step, as accumulate does in it)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        kept = accumulate._set_aside(params)
        try:
            loss = self._run(batch, size, plan, limit, floor, seconds, 0, loss_fn, meter,
                             counted)
            if self.stats.peak > limit:
                raise MemoryLimitError(
                    f"the pinned plan ({self.describe()}) peaked at "
                    f"{self.stats.peak / MiB:.0f} MiB, above the limit of {limit / MiB:.1f} "
                    f"MiB: a pinned plan is not planned for the limit (pass limit=None to run "
                    f"it whatever it takes, or no plan= to have each step planned); nothing "
                    f"was added to .grad", self.stats.peak)
        except BaseException:
            accumulate._put_back(params, kept)
            raise
        accumulate._add_back(params, kept)
        return loss

    def _split(self, batch=None, size: int = 0) -> bool:
        return self._unsplit(batch, size) is None

    def _unsplit(self, batch=None, size: int = 0) -> str | None:
        """Why micro-batches would not add up to the batch's gradient now (None: they do): a
        statistic over the whole batch in the forward or the loss, or, of `batch` (where
        given, of `size` samples), means over two counts in its loss or targets that cannot
        be shared among micro-batches."""
        if not self.split:
            return "split=False: the loss or the model takes a statistic over the whole batch"
        aux = loss_weights.batch_level_term(self.model, batch)
        if aux is None and batch is not None:
            aux = loss_weights.mixed_means(self.model, batch) or \
                loss_weights.whole_batch_targets(batch, size)
        if aux is not None:
            return aux
        if not self.ghost_batchnorm and any(
                isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training
                for m in self.model.modules()):
            return ("batch norm is in training mode: its statistics would be per micro-batch "
                    "(pass ghost_batchnorm=True to accept that)")
        return None

    def _floor(self, meter) -> int:
        """The floor the step plans from: what is live where the model is now, plus the state
        the optimizer's next step will create (the whole loop must fit, not this step
        alone)."""
        return meter.live() + optimizer_state.pending_bytes(self.optimizer)

    def _plan_for(self, size, key, limit, floor, batch) -> limit_plan.Plan:
        if self.frozen and self.plan is not None:
            self._check_pinned(self.plan, size, limit, floor, batch)
            return self.plan
        if limit is None:
            self.plan = limit_plan.Plan()
            return self.plan
        plan = self._planning.plan(size, key, self._split(batch, size), limit - floor,
                                     self.plan)
        after = optimizer_state.step_bytes(self.optimizer)
        if plan is not None and planning.available(limit - floor) < after:
            plan = None  # the step would fit, the optimizer's step after it would not
        if plan is None:
            needed = self._planning.needed(floor)
            stepping = planning.limit_for(after, floor)
            named = planning.to_name(max(needed, stepping), floor)
            bound = "" if self._planning.measured_for(key) else (
                ", or less (from the profile of smaller samples scaled up, an upper bound: "
                "its probes at this size did not fit)")
            what = (f"the smallest plan for a batch of {size} needs about "
                    f"{-(-named // MiB)} MiB in all{bound}" if needed >= stepping else
                    f"the optimizer's step after it needs about {-(-named // MiB)} MiB in "
                    f"all (the gradients and its temporaries)")
            raise MemoryLimitError(
                f"no plan fits a limit of {limit / MiB:.1f} MiB: {self._held(floor)}, and "
                f"{what}; nothing was added to .grad{self._optimizer_hint()}", named)
        self.plan = plan
        return plan

    def _refuse_without_room(self, limit: int, floor: int) -> None:
        """MemoryLimitError, before any probe, where the limit leaves no room for a step above
        the floor and the optimizer's step after it: a probe would take the process past
        the limit only to learn that (its first sample cannot be predicted, whatever the
        limit). The error says the least that is known to be needed, not a limit that fits
        (`needed` is None): a step under limit="free" probes, and smallest_limit() names one."""
        after = optimizer_state.step_bytes(self.optimizer)
        if planning.available(limit - floor) > after:
            return
        least = planning.limit_for(after, floor)
        raise MemoryLimitError(
            f"no plan fits a limit of {limit / MiB:.1f} MiB: {self._held(floor)}, which "
            f"leaves no room for the step (it needs more than {-(-least // MiB)} MiB in all; "
            f"a step under limit='free' probes the model, and then step.smallest_limit() "
            f"names the least it needs); nothing was added to .grad"
            f"{self._optimizer_hint()}", None)

    def _held(self, floor: int) -> str:
        state = optimizer_state.pending_bytes(self.optimizer)
        return (f"the process holds {(floor - state) / MiB:.0f} MiB before the step and the "
                f"optimizer's first step will add {state / MiB:.0f} MiB" if state else
                f"the process holds {floor / MiB:.0f} MiB before the step")

    def _optimizer_hint(self) -> str:
        return "" if self.optimizer is not None else (
            " (pass optimizer= to Step so that the first step plans for the state the "
            "optimizer creates)")

    def _check_pinned(self, plan, size: int, limit, floor: int, batch) -> None:
        """A pinned plan's refusals before it runs: micro-batches where they would not add up
        (_unsplit), a limit the process is already above."""
        why = self._unsplit(batch, size)
        if plan.micro_batches > 1 and size > 1 and why is not None:
            raise ValueError(f"the pinned plan has {plan.micro_batches} micro-batches, but "
                             f"{why}; pin micro_batches=1")
        if limit is not None and floor >= limit:
            raise MemoryLimitError(
                f"the process holds {floor / MiB:.0f} MiB before the step, at or above the "
                f"limit of {limit / MiB:.1f} MiB, and the pinned plan is not planned for it "
                f"(pass limit=None to run it whatever it takes); nothing was added to .grad",
                None)

    def smallest_limit(self) -> int | None:
        """The smallest limit the next step would accept, from the process's floor now (the
        optimizer's state included, once it exists) and what the steps so far measured; None
        before the first step under a limit has profiled the model. It is this Step's: a new
        Step's first step probes the model again, and its probes may need more than the
        plan they choose (the first step's `stats.peak` counts its probes)."""
        # planned for the model's training mode now (batch norm training: one micro-batch)
        floor = self._floor(self._meter(strict=False))
        needed = self._planning.needed(floor, split=self._split())
        if needed is None:
            return None
        return max(needed, planning.limit_for(optimizer_state.step_bytes(self.optimizer), floor))

    def _loss(self, micro_batch, loss_fn):
        return mb.loss_and_weight(loss_fn(self.model, micro_batch))

    def _context(self, storage: str):
        if storage == "plain":
            return contextlib.nullcontext()
        if storage not in self._contexts:
            # the allocator is the Step's to install, under a limit only (see _step)
            if storage == "offload":
                ctx = offload.offload_saved()
            elif storage == "paged":
                ctx = compress_saved(Policy.preset("lossless"), model=self.model, budget=0,
                                     spill_dir=self.spill_dir, allocator=False)
            elif storage == "budget":
                ctx = compress_saved(model=self.model, budget=UNBOUNDED,
                                     spill_dir=self.spill_dir, min_bits=self.bits,
                                     allocator=False)
            else:
                ctx = compress_saved(Policy.preset(storage), model=self.model,
                                     allocator=False)
            self._contexts[storage] = ctx
        return self._contexts[storage]

    def _run(self, batch, size, plan, limit, floor, seconds, probes: int, loss_fn, meter,
             counted=None):
        """One step of `plan`; `counted`: the batch's targets per sample on their way to the
        host (loss_weights.start_counting)."""
        ranges = mb.slices(size, plan.micro_batches)
        if plan.storage == "budget":
            ctx = self._context("budget")
            planned = (limit, self._planning.held_allowance(
                plan, size, None if limit is None else limit - floor))
            with self._lock:  # the limit may have moved since the plan: follow it
                self._in_flight, self._planned = ctx, planned
                ctx.request_budget(self._in_flight_budget())
        params = [p for p in self.model.parameters() if p.requires_grad]
        state = blocks_mod.Running(plan.recompute, chunks=plan.chunks)
        storage = self._context(plan.storage)
        # where probes mistime a step (a GPU's), the step's own clock: the next step learns
        # from it (planning.learn_times)
        clock = None if limit is None or self.frozen or self._planning.profile is None \
            else meter.step_clock()
        state.clock = clock

        def run(start: int, stop: int):
            if plan.storage == "plain":  # compress_saved ends a period itself
                # a period of the store per micro-batch. The store lays a period out as it
                # planned from the one before, which fits a micro-batch as large or smaller
                # (largest first: mb.slices); a larger one (the first of a step after the
                # uneven last of the one before) starts without a plan, first fit over the
                # pages held, instead of around the plan of the smaller one
                if stop - start > self._period_samples:
                    stores.new_larger_step(None)
                else:
                    stores.new_step(None)
                self._period_samples = stop - start
            with blocks_mod.running(state), storage:
                loss, weight = self._loss(mb.take(batch, size, start, stop), loss_fn)
            if weight is None:
                unweighted.append(start)
            return loss, weight

        unweighted = []

        t_all = time.perf_counter()
        try:
            shares = loss_weights.shares(batch, size, ranges, self.loss_fn is mb.default_loss,
                                         counted, self.model)
            if clock is not None:
                clock.begin("step")
            with meter.peak() as peak:
                done = accumulate.accumulate(run, ranges, shares, params, scaler=self.scaler,
                                             no_sync=getattr(self.model, "no_sync", None))
            if clock is not None:
                clock.end("step")
                self._clocked = (clock, plan)
        finally:
            with self._lock:
                self._in_flight = self._planned = None
        if unweighted and len(ranges) > 1 and self.loss_fn is not mb.default_loss:
            self._check_weights(size, ranges, counted)
        seconds.update(forward=done.forward, backward=done.backward,
                       total=time.perf_counter() - t_all + seconds.get("profile", 0.0))
        # what the step itself added: above the floor as it is resident (the optimizer state
        # the floor counts ahead, before its first step, does not exist during this one)
        measured = max(0, peak.nbytes - (floor - optimizer_state.pending_bytes(self.optimizer)))
        self.stats = StepStats(peak=max(peak.nbytes, probes), floor=floor, limit=limit,
                               predicted=int(floor + plan.peak), micro_batches=len(ranges),
                               seconds=seconds)
        if not self.frozen:
            self._planning.learn(plan, measured)
        return done.loss

    def _check_weights(self, size: int, ranges: list, counted) -> None:
        """Warns, once, where a loss_fn's plain loss was weighted by samples while the
        batch's labels are padded unevenly across the micro-batches (`counted`, their targets
        per sample: loss_weights.start_counting): a mean over targets (as transformers' and
        torch's cross entropy take it) then gets another gradient than one forward of the
        whole batch."""
        if self._weights_warned or not loss_weights.uneven(counted, size, ranges):
            return
        self._weights_warned = True
        warnings.warn(
            f"loss_fn returned a loss without a weight, so Step weighted its {len(ranges)} "
            f"micro-batches by their samples, but this batch's labels hold their targets "
            f"unevenly (padding of -100): for a loss that is a mean over targets the "
            f"gradient is not the whole batch's. Return (loss, act.count_targets(model, "
            f"micro_batch)) from loss_fn, or use the default loss (wrap the step in "
            f"torch.autocast rather than the loss)", RuntimeWarning, stacklevel=4)

    def describe(self) -> str:
        """The current plan in words."""
        plan = self.plan
        if plan is None:
            return "no plan yet (planned at the first step)"
        names = sorted({type(self.blocks[i]).__name__ for i in plan.recompute})
        rec = (f"recompute {len(plan.recompute)} of {len(self.blocks)} blocks "
               f"({', '.join(names)})" if plan.recompute else "no recomputation")
        split = "" if plan.micro_batches == 1 or not self.ghost_batchnorm else \
            " (ghost batch norm: statistics per micro-batch)"
        chunks = "" if plan.chunks == 1 else \
            f"; position-wise layers in {plan.chunks} chunks of the sequence"
        return (f"{plan.micro_batches} micro-batch(es){split}; {rec}{chunks}; saves "
                f"{plan.storage}; predicted peak {plan.peak / MiB:.0f} MiB above the floor")


def _release(*attachments) -> None:
    for attachment in attachments:
        attachment.release()


def _chunked_kind(model, batch):
    """The module whose chunked loss covers this model and batch: causal_lm, seq2seq_lm (a
    batch of the keys it passes on) or masked_lm; None where none does."""
    if causal_lm.covers(model):
        return causal_lm
    if seq2seq_lm.covers(model) and set(batch) <= seq2seq_lm.KEYS:
        return seq2seq_lm
    if masked_lm.covers(model):
        return masked_lm
    return None


def _no_cache(model, batch):
    """A dict batch for a model whose forward takes `use_cache` (transformers' language
    models, and vision-language models, whose forward passes it on in its keywords) runs
    with use_cache=False unless it says otherwise: training needs no cache, and
    a block recomputed in backward would append its keys to the cache a second time (as
    transformers does under gradient checkpointing). A wrapper's forward (DistributedDataParallel,
    a PEFT model) takes what its model's takes (wrapped.receiver)."""
    if not isinstance(batch, Mapping) or "use_cache" in batch:
        return batch
    receiver = wrapped.receiver(model)
    try:
        parameters = inspect.signature(receiver.forward).parameters
    except (TypeError, ValueError):
        return batch
    takes = "use_cache" in parameters or (
        # a forward that passes its keywords on to a language model inside it (LLaVA's)
        any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()) and
        _text_model_caches(getattr(receiver, "config", None)))
    return {**batch, "use_cache": False} if takes else batch  # (a BatchEncoding: a dict)


def _text_model_caches(config) -> bool:
    """Whether a transformers config's text model keeps a cache (`use_cache` in its text
    config: a vision-language model's language model)."""
    get_text_config = getattr(config, "get_text_config", None)
    if get_text_config is None:
        return False
    try:
        return getattr(get_text_config(), "use_cache", None) is not None
    except Exception:  # noqa: BLE001 (a config of several text models: not one to name)
        return False


def _checked_once(chunk: int):
    """A step's causal LM loss (one per step: its probes and micro-batches), comparing the
    model's last logits with the head it applies at the first call only: each comparison is
    a read from the device, and the head is the same model's in every micro-batch."""
    checked = False

    def loss(model, batch):
        nonlocal checked
        out = causal_lm.causal_lm_loss(model, batch, chunk_tokens=chunk, check_head=not checked)
        checked = True
        return out
    return loss


def _give_back_free(meter, limit: int) -> None:
    """The plan counts on what the allocators hold free being reused, but it is held (the
    limit counts it): where what is held is at the limit before the step starts (pages the
    store kept from an evaluation's or the user's own tensors since freed; a CUDA cache of
    blocks), what they hold free goes back first. So it does where it fills more than half
    the room above what is live (the optimizer's temporaries, say): a step that fits inside
    it never raises what is held, so its peak would measure it, not what the step needs,
    and the next plan would be judged by it. The heap's free pages go back every time (a
    few milliseconds): the optimizer's small temporaries leave them resident, where a
    step's small tensors do not reuse them all, and its peak carried them (a GPT-2 layout's
    second step peaked 14 MiB above its first). (A CUDA cache is kept unless the limit needs
    it: the allocator reuses it best fit, and what is reserved again after emptying it
    costs a device allocation per block, every step.)"""
    held, live = meter.held(), meter.live()
    if held > limit - SAFETY_BYTES or (isinstance(meter, meters.ProcessMeter) and
                                       held - live > (limit - live) / 2):
        meter.give_back()
    meter.trim()


def _room_for_the_optimizer(meter, optimizer, limit: int) -> None:
    """The allocators keep the step's free memory for the next (the store its pages, the heap
    its free chunks, CUDA its cached blocks); where the optimizer's temporaries would take
    what is held over the limit on top of it, it goes back now (the store's or the cache
    first, the heap's if that is not enough)."""
    temporaries = optimizer_state.step_parts(optimizer)[1]
    if temporaries and meter.held() + temporaries > limit - SAFETY_BYTES:
        meter.give_back()
        if meter.held() + temporaries > limit - SAFETY_BYTES:
            meter.trim()


def _parse_limit(value):
    """bytes, a string such as "1GiB", None, or "free" (kept as it is: resolved per step)."""
    if isinstance(value, str) and value.strip().lower() == "free":
        return "free"
    return parse_bytes(value)
