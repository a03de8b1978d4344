"""A model's step measured for the memory limit's solver (Melon's profile): small probe
steps of one and two samples, run within the limit and leaving nothing behind (gradients
are computed and dropped, buffers such as batch norm's running statistics restored). Each
probe counts the bytes saved for backward per repeated block and outside them, the bytes of
each block's inputs, the forward seconds of each block, its own peak RSS above the floor and
its seconds; the storages' ratios come from the codecs' size model applied to the probe's
saves, their seconds from encoding a tensor of the same kind.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time

import torch

from ... import choice
from . import block_alone
from . import blocks as blocks_mod
from . import limit_plan
from . import meter as meters
from ..save import offload
from ..codecs.backend import decode, encode

MIN_BYTES = 4096  # saves smaller than this stay as they are under every storage
LOSSY = {"8bit": (8, 256), "4bit": (4, 256), "2bit": (2, 64)}  # Policy presets' bits, groups
OFF_DEVICE = ("paged", "offload")  # storages that hold nothing where the step runs


class Moments:
    """A probe's peaks of live bytes (above `base`) told apart by moment: each recomputed
    block's in backward, from its forward run again to its input's gradient (`blocks`, by
    index), and everything else's (`outside`: forward, the head and loss, what backward does
    beyond the blocks). Marked by the blocks' hooks (blocks.Running.moments). Live bytes,
    not RSS: RSS keeps the pages of what a moment freed, so the next would read the same."""

    def __init__(self, meter, base: int):
        """`meter`: one whose live_peak() is a context (not None)."""
        self.meter, self.base = meter, base
        self.blocks: dict = {}
        self.outside = 0
        self._open = None  # (block index or None, its LivePeak)

    def _switch(self, index) -> None:
        if self._open is not None:
            i, peak = self._open
            nbytes = max(0, peak.nbytes - self.base)
            peak.__exit__(None, None, None)
            if i is None:
                self.outside = max(self.outside, nbytes)
            else:
                self.blocks[i] = max(self.blocks.get(i, 0), nbytes)
        self._open = None
        if index is not False:
            peak = self.meter.live_peak()
            peak.__enter__()
            self._open = (index, peak)

    def start(self) -> None:
        self._switch(None)

    def begin(self, index: int) -> None:
        self._switch(index)

    def end(self, index: int) -> None:
        if self._open is not None and self._open[0] == index:
            self._switch(None)

    def stop(self) -> None:
        self._switch(False)


class Probe:
    """One probe step's counts."""

    def __init__(self, samples: int, recompute=()):
        self.samples = samples
        self.saved: dict = {}  # block index (None: outside all) -> bytes
        self.local: dict = {}  # block index -> bytes its position-wise children saved
        self.widest: dict = {}  # block index -> the largest of those saves, bytes
        self.surveys: list = []  # (elements, nonzeros, element size) of float saves
        self.other = 0  # bytes saved that no storage changes
        # block index -> bytes of its saves with two dimensions of the probe's length (along
        # a sequence: scores over every pair of positions, which grow as its square)
        self.square: dict = {}
        self.peak = 0
        self.seconds = 0.0
        self.state = blocks_mod.Running(recompute, profile=True)
        self.moments: Moments | None = None


def probe(run_loss, params, samples: int, recompute=(), storage=None,
          fresh: bool = False, meter=None, peak_only: bool = False,
          moments: bool = False, length=None) -> Probe:
    """Runs `run_loss(samples)` forward and backward, counting (see module doc); or, given a
    `storage` context (compress_saved), its forward in that context, counting nothing but the
    peak and the seconds. `fresh`: the store's kept pages are released first, so that a probe
    run once measures its own layout, not what the probe before it left kept. `meter`:
    where the memory is measured (actcodec.torch.limit.meter; the process's by default).
    `peak_only`: only the peak is wanted (the saves are neither counted nor surveyed, a
    nonzero count per save being a pass over it; no timed rerun on a cold meter).
    `moments`: its peaks told apart by moment too (Moments; recomputed blocks only).
    `length`: along a sequence, its tokens, or the lengths of its sequences (a set: an
    encoder-decoder's source and labels); the saves of two such dimensions are counted
    apart (Probe.square)."""
    meter = meter if meter is not None else meters.ProcessMeter()
    out = Probe(samples, recompute)
    lengths = {length} if isinstance(length, int) else set(length or ())
    if meter.device.type != "cpu":
        out.state.sync = meter.synchronize
    seen: set = set()

    def pack(t):
        if t.is_leaf and t.requires_grad:  # a parameter: held by the model anyway
            return t
        storage = t.untyped_storage()
        if storage.data_ptr() in seen:
            return t
        seen.add(storage.data_ptr())
        nbytes = storage.nbytes()
        key = out.state.current
        out.saved[key] = out.saved.get(key, 0) + nbytes
        if lengths and sum(d in lengths for d in t.shape) >= 2:
            out.square[key] = out.square.get(key, 0) + nbytes
        if out.state.local is not None:
            out.local[out.state.local] = out.local.get(out.state.local, 0) + nbytes
            out.widest[out.state.local] = max(out.widest.get(out.state.local, 0), nbytes)
        if t.is_floating_point() and nbytes >= MIN_BYTES and t.numel() * t.element_size() == \
                nbytes:
            # the count stays a tensor until the probe ends: reading it here would wait for
            # the device at every save and count that wait as the block's forward
            out.surveys.append((t.numel(), torch.count_nonzero(t), t.element_size()))
        else:
            out.other += nbytes
        return t

    meter.start_probe(fresh)
    base = meter.live()
    context = storage if storage is not None else contextlib.nullcontext() if peak_only \
        else torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with meter.peak() as peak:
        if moments and meter.live_peak() is not None:
            out.moments = out.state.moments = Moments(meter, base)
            out.moments.start()
        try:
            out.seconds = _run_once(run_loss, params, samples, out.state, meter, context)
        finally:
            if out.moments is not None:
                out.moments.stop()
                out.state.moments = None
    out.peak = max(0, peak.nbytes - base)
    out.surveys = [(n, int(nnz), e) for n, nnz, e in out.surveys]  # read after the clock
    if meter.cold_probes and not peak_only:
        # the probe started from an emptied cache, so that its peak is its own: each of its
        # allocations went to the device's driver, which a step's do not. Its seconds come
        # from the same work run again on the cache it left, without the counting hook
        timing = blocks_mod.Running(recompute, profile=True)
        timing.sync = meter.synchronize
        out.seconds = _run_once(run_loss, params, samples, timing, meter,
                                storage if storage is not None else contextlib.nullcontext())
        out.state.seconds, out.state.local_seconds = timing.seconds, timing.local_seconds
    return out


def _run_once(run_loss, params, samples: int, state, meter, forward_context) -> float:
    """Seconds of `run_loss(samples)` forward (in `forward_context`) and backward (its
    gradients dropped), the blocks following `state`, the device's queue drained."""
    t0 = time.perf_counter()
    with blocks_mod.running(state):
        with forward_context:
            loss = run_loss(samples)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        del grads, loss
        meter.synchronize()
    return time.perf_counter() - t0


def storage_ratio(p: Probe, bits: int | None, group: int | None) -> float:
    """Bytes the probe's saves take under a storage, per byte at full size."""
    total = sum(p.saved.values())
    if total <= 0:
        return 1.0
    small = 0
    for n, nnz, esize in p.surveys:
        sizes = choice.sizes_from_counts(n, nnz, esize, bits, group)
        small += sizes[choice.smallest(sizes)]
    return min(1.0, (small + p.other) / total)


def codec_seconds_per_byte(name: str, spill_dir: str | None, meter=None) -> float:
    """Seconds to encode and decode (and, paged, write and read back; offloaded, copy to
    pinned host memory and back) a byte of a normal float32 tensor of 4 MiB under a storage,
    on the meter's device, the best of three."""
    device = meter.device if meter is not None else torch.device("cpu")
    t = torch.randn(1 << 20, generator=torch.Generator().manual_seed(0)).to(device)
    if name == "offload":
        return offload.round_trip_seconds(t) / (t.numel() * t.element_size())
    kwargs = {"bits": LOSSY[name][0], "group_size": LOSSY[name][1]} if name in LOSSY else \
        {"bits": None}
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        enc = encode(t, **kwargs)
        if name == "paged":
            with tempfile.TemporaryFile(dir=spill_dir) as f:
                data = enc.to_bytes() if hasattr(enc, "to_bytes") else bytes(enc.payload)
                f.write(data)
                f.flush()
                f.seek(0)
                f.read()
        decode(enc)
        if meter is not None:
            meter.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best / (t.numel() * t.element_size())


def measure(run_loss, model, blocks: list, batch: int, storages: tuple, split: bool,
            spill_dir: str | None, room: float | None = None, paged=None,
            bits: int = 8, budgeted=None, lossless=None,
            first: int | None = None, fixed_bytes: int = 0,
            meter=None, lengths=None) -> limit_plan.Profile:
    """The step's profile for a batch of `batch` samples: probes of k samples and of 2k
    (where they fit in `room` bytes above the floor), each twice and the second counted (the
    first warms lazy state up and lays memory out first fit), buffers restored after. k is 1
    where micro-batches are allowed (a tight limit may hold little more than one sample);
    else (the whole batch runs at once, so an eighth of it fits wherever a plan can) an eighth
    of the batch, for a clear difference; at least 2 where batch norm trains; or `first`.

    Along a sequence (one sample planned by its tokens), `batch` is its tokens, `run_loss(n)`
    runs its first n, and `first` is a quarter of them: probes of a quarter and a half of
    the sequence (of an eighth and a quarter, or shorter still, where a quarter would not fit
    in the room), so that its per-token costs come from two lengths. There each probe runs
    once after one warm-up, and the paged probes only where recomputing every block would
    not fit by the lean probe (else paging is not offered): the first step, probes
    included, takes about three plain steps. `fixed_bytes`: what a probe there holds beside
    the gradients that does not grow with its tokens (the chunked loss's buffers), so that
    the half is run where it fits. `meter`: where memory is measured (probe); `paged`: the
    context that holds nothing on the device (paged out; on CUDA, offloaded: OFF_DEVICE).
    `lengths(n)`: along a sequence, the lengths of the sequences `run_loss(n)` runs (by
    default n alone)."""
    params = [p for p in model.parameters() if p.requires_grad]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    meter = meter if meter is not None else meters.ProcessMeter()
    start = meter.live()
    lengths = lengths if lengths is not None else (lambda n: {n})

    def fits(peak: float) -> bool:
        # whether a probe peaking `peak` above what is live as it starts stays in the room,
        # which is above what was live before the first: what the probes before it left
        # (lazy state, pages the store or the heap keeps that live() counts as in use) is
        # held as it runs
        return room is None or max(0, meter.live() - start) + peak <= room

    least = 2 if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training
                     for m in model.modules()) else 1
    k = min(batch, least if split else max(least, batch // 8))
    if first is not None:
        k = max(1, min(batch, first))
    every = tuple(range(len(blocks)))
    # where each probe starts from nothing kept (along a sequence; a device whose cache is
    # emptied per probe), two sizes give slopes; on the CPU a probe run twice reuses the
    # pages its first run kept, and a slope between two such peaks is not one
    slopes = first is not None or (meter is not None and meter.cold_probes)
    beyond = False  # a probe went past the room: no larger one runs (see below)
    twice = first is None
    # what a probe's peak holds that does not grow with it: samples, nothing assumed; along a
    # sequence, the gradients (whose size the length does not change)
    fixed_guess = 0 if twice else \
        sum(p.numel() * p.element_size() for p in params) + fixed_bytes

    def counted(size, recompute=(), storage=None, peak_only=False, moments=False):
        if twice:  # the first of each: lazy state warms up, the store learns lifetimes
            probe(run_loss, params, size, recompute, storage, meter=meter, peak_only=True)
            return probe(run_loss, params, size, recompute, storage, meter=meter,
                         peak_only=peak_only, moments=moments)
        return probe(run_loss, params, size, recompute, storage, fresh=True, meter=meter,
                     peak_only=peak_only, moments=moments, length=lengths(size))

    try:
        # lazy state warms up (its size does not matter: along a sequence, a short one)
        warm = probe(run_loss, params, k if twice else max(1, k // 4), meter=meter,
                     peak_only=True)
        if not twice:
            # along a sequence, the first probe is a quarter of it, or shorter where the
            # warm-up's line says a quarter would not fit in the room (halved, not below the
            # warm-up's length): the line counts the warm-up's lazy state as growing with the
            # tokens, an upper bound where the peak grows as a line
            while k // 2 >= warm.samples and not fits(_along(warm, fixed_guess, k)):
                k //= 2
        one = probe(run_loss, params, k, fresh=not twice, meter=meter,  # as the later ones
                    length=None if twice else lengths(k))
        two = one
        # a probe run twice peaks higher on its first run (its layout first fit, before the
        # store learns its lifetimes): the first run of the next size is predicted from it
        first_peak = max(one.peak, warm.peak) if twice else one.peak
        halved = not twice and not fits(one.peak) and k // 2 >= warm.samples
        if halved:
            # along a sequence, k tokens went past the room all the same (grown faster than
            # the line): what they measured stands as the larger size, and half as many are
            # probed for the smaller, rather than one size alone (which counts what does not
            # grow as growing: a smallest limit twice what the step needs)
            two, k = one, k // 2
            one = counted(k)
        if not fits(one.peak):
            # k samples already went past the room: no plan of whole samples fits, and every
            # further probe would go past it again (a process under a cgroup or a phone's
            # memory killer does not survive that), so the profile is what one size says
            beyond = True
        elif halved:
            pass  # two sizes measured
        elif batch >= 2 * k and fits(2 * first_peak - fixed_guess):
            two = counted(2 * k)
        elif batch >= 2 * k and k // 2 >= least:
            # 2k samples would not fit: k/2 and k instead (one size alone would count what
            # does not grow with the batch as growing, and the fixed part as nothing)
            k //= 2
            one = counted(k)
        if not beyond and not fits(one.peak):
            beyond = True  # what the probes left leaves no room for another of k samples
        lean = None
        if every and not beyond:  # every block recomputed: how much of a cut in what is
            lean = counted(k, every, peak_only=True, moments=not twice)  # held the peak sees
        lean_two = None  # what recomputing every block holds per sample, from a second size
        if slopes and every and not beyond and two.samples > k and fits(
                2 * lean.peak - min(lean.peak, one.peak)):
            lean_two = counted(two.samples, every, peak_only=True, moments=not twice)
        # along a sequence, a third length below the two: whether the lean peak grows faster
        # than its line (scores over every pair of positions, where attention keeps them)
        curve = 0.0
        if not twice and lean_two is not None and k >= 2:
            low = counted(k // 2, every, peak_only=True, moments=True)
            curve = _curve(low, lean, lean_two, batch)
            if all(p.moments is not None for p in (low, lean, lean_two)):
                # the peaks' noise (a few MiB of layout) at such short lengths reads as a
                # square many times over at the whole length (a LoRA Llama's 64, 66 and 71
                # MiB at 128, 256 and 512 tokens: 50 MiB at 2048, where its live bytes grow
                # as a line): no more than the live bytes' largest moment curves
                curve = min(curve, _curve(*(_largest_moment(p) for p in (low, lean, lean_two)),
                                          batch))
        # along a sequence, a block whose saves grow as the square of the length at both
        # sizes is run alone at the whole length (block_alone): the lines under-measure it
        square = {i: b for i, b in two.square.items() if i is not None and one.square.get(i)}
        alone = alone_at = None
        if not twice and not beyond and square and two.samples > k:
            alone_at = max(sorted(square), key=square.get)
            alone = block_alone.measure(run_loss, blocks[alone_at], two.samples, batch, meter,
                                        fits)
        bare = []  # everything paged out: what the step needs whatever it holds
        if not twice and lean_two is not None and room is not None and lean_two.peak + (
                batch - two.samples) * max(0.0, lean_two.peak - lean.peak) / (
                two.samples - k) + curve <= room:
            paged = None  # recomputation fits: paging is not needed (nor offered)
            storages = tuple(name for name in storages if name not in OFF_DEVICE)
        if paged is not None and not beyond:
            for size in sorted({k, two.samples}):
                bare.append(counted(size, storage=paged))
        timed = {}  # storages whose cost a probe measures: beside the codec, their bookkeeping
        if bare:
            timed.update({name: bare[0].seconds for name in OFF_DEVICE})
        budget_probe = None
        if budgeted is not None and not beyond:  # a budget of half the full size
            budgeted.budget = sum(one.saved.values()) // 2
            budget_probe = counted(k, storage=budgeted)
            timed["budget"] = budget_probe.seconds
        lossless_probe = None
        if lossless is not None and not beyond and storage_ratio(one, None, None) <= 0.97:
            # the lossless codec's own work (decoding beside the gradients), as the budget's
            lossless_probe = counted(k, storage=lossless)
            timed["lossless"] = lossless_probe.seconds
    finally:
        with torch.no_grad():
            for b, value in buffers:
                b.copy_(value)
    n = two.samples
    # Per sample: what grows from k samples to 2k (what does not grow is fixed: buffers,
    # the parameters' own gradients, saves of a batch-independent size)
    def per_sample(a: float, b: float) -> float:
        return max(0.0, (b - a) / (n - k)) if n > k else b / n

    slope = per_sample(one.peak, two.peak)
    saved = {key: per_sample(one.saved.get(key, 0), two.saved.get(key, 0))
             for key in {*one.saved, *two.saved}}
    work = max(0.0, slope - sum(saved.values()))
    least = per_sample(bare[0].peak, bare[-1].peak) if bare else 0.0
    if beyond:  # nothing below what k samples peaked at was measured: no plan is trusted
        least = per_sample(one.peak, two.peak)  # to go below it
    # From the second micro-batch on, the gradients the first left in .grad stay for the
    # whole of each (in a probe they only build up during backward, as in a single
    # micro-batch). A step's gradients are always new: what .grad held before is set aside,
    # not added to (limit/accumulate.py)
    grads = sum(p.numel() * p.element_size() for p in params)
    fixed = max(0.0, one.peak - slope * k)
    found = [limit_plan.Block(saved=saved.get(i, 0.0),
                              inputs=per_sample(one.state.inputs.get(i, 0),
                                                two.state.inputs.get(i, 0)),
                              forward=two.state.seconds.get(i, 0.0) / n,
                              local=min(saved.get(i, 0.0), per_sample(
                                  one.local.get(i, 0), two.local.get(i, 0))),
                              local_inputs=per_sample(one.state.local_inputs.get(i, 0),
                                                      two.state.local_inputs.get(i, 0)),
                              local_forward=two.state.local_seconds.get(i, 0.0) / n,
                              local_widest=max(one.widest.get(i, 0) / k,
                                               two.widest.get(i, 0) / n))
             for i in every]
    # t(n) = overhead + n * per sample: two sizes give the overhead a micro-batch adds
    per_micro_batch = max(0.0, (n * one.seconds - k * two.seconds) / (n - k)) if n > k \
        else 0.0
    effect = 1.0
    lean_slope = None if lean_two is None else per_sample(lean.peak, lean_two.peak)
    if found and not beyond:
        cut = sum(b.saved - b.inputs for b in found) - max(b.saved for b in found)
        if cut > 0 and lean_slope is not None:
            # from the slopes: what a probe holds that does not grow with it differs between
            # the two (the plain probe peaks as backward starts, the lean one where the
            # gradients have built up), and would count as a cut that is not
            effect = min(1.0, max(0.1, (slope - lean_slope) / cut))
        elif cut > 0:
            effect = min(1.0, max(0.1, (one.peak - lean.peak) / (k * cut)))
    flat = None
    if not twice and beyond:  # along a sequence, what a quarter of it holds beyond the
        fixed = min(one.peak, fixed_guess)  # gradients grows with it
        least = (one.peak - fixed) / k
    if not twice and not beyond and n > k:
        # Along a sequence, two phases (limit_plan.Profile.flat): at the turn, every save held
        # over what does not grow (bounded by each probe: the turn is at most its peak); in
        # backward, the gradients and, per token, what the probes that recompute every block
        # grew by beyond the recomputed block's saves (or the plain probes' growth)
        fixed = max(0.0, min(one.peak - k * sum(saved.values()),
                             two.peak - n * sum(saved.values())))
        work, effect = 0.0, 1.0
        moments = _moment_lines(found, saved.get(None, 0.0), lean, lean_two)
        if moments is not None:
            # backward's moments apart: each block's, and the rest (the head and loss, the
            # embedding's gradient), each a line through the two lean probes
            found, (flat, outside) = moments
            least = max(least, outside)
        elif lean_slope is not None and found:
            least = max(least, lean_slope - max(b.saved for b in found))
            flat = max(0.0, lean.peak - k * lean_slope)
        else:
            least, flat = max(least, slope), max(0.0, one.peak - k * slope)
        # no plan peaks below the lean one (every block recomputed) at the whole sequence:
        # its line, and what it grows by beyond it (a block measured alone says that for
        # its blocks, below: the curve of three short peaks, then, only over-measures it);
        # with one lean length (the second did not fit), at least its growth per token above
        # what does not grow, which a peak growing faster than a line only exceeds
        if lean_two is not None:
            lean_at = lean_two.peak + (batch - n) * lean_slope + (curve if alone is None else 0.0)
        elif lean is not None:
            lean_at = lean.peak + (batch - k) * max(0.0, lean.peak - fixed_guess) / k
        else:
            lean_at = 0.0
        least = max(least, (lean_at - flat) / batch)
        if alone is not None:
            found = block_alone.corrected(found, square, alone_at, alone)
            if moments is None:
                least = max(least, block_alone.working(found, alone_at, alone))
    made = []
    for name in storages:
        if name == "plain":
            made.append(limit_plan.PLAIN)
            continue
        # a budget's fewest bytes: every save at its fewest bits (`bits`)
        codec = f"{bits}bit" if name == "budget" else name
        k_bits, group = LOSSY.get(codec, (None, None))
        ratio = 0.0 if name in OFF_DEVICE else storage_ratio(two, k_bits, group)
        if name == "lossless" and ratio > 0.97:
            continue  # nothing sparse enough to gain from
        seconds = codec_seconds_per_byte(codec, spill_dir, meter)
        if name in timed and sum(one.saved.values()):
            seconds = max(seconds, (timed[name] - one.seconds) / sum(one.saved.values()))
        extra = 0.0
        if name == "budget" and budget_probe is not None:
            # the model's peak for the probe (half its saves held) against the measured one:
            # encoding beside the original, decoding beside the gradients
            expected = one.peak - effect * sum(one.saved.values()) / 2
            extra = max(0.0, (budget_probe.peak - expected) / k)
        if name == "lossless" and lossless_probe is not None:
            expected = one.peak - effect * (1 - storage_ratio(one, None, None)) * sum(
                one.saved.values())
            extra = max(0.0, (lossless_probe.peak - expected) / k)
        made.append(limit_plan.Storage(name, ratio, seconds, exact=codec not in LOSSY,
                                       extra=extra))
    return limit_plan.Profile(batch=batch, fixed=fixed, work=work,
                              rest=saved.get(None, 0.0), blocks=tuple(found),
                              seconds=two.seconds / n, per_micro_batch=per_micro_batch,
                              storages=tuple(made), split=split, effect=effect,
                              least=least, grads=grads, flat=flat,
                              chunk_floor=(meter or meters.ProcessMeter).heap_below)


def _along(p: Probe, fixed: float, tokens: int) -> float:
    """Along a sequence, the peak at `tokens` by the line through what does not grow with
    them (`fixed`) and the probe's peak at its own tokens."""
    return fixed + max(0.0, p.peak - fixed) * tokens / p.samples


def _largest_moment(p: Probe) -> Probe:
    """A probe whose peak is its largest moment's live bytes (Moments), for _curve."""
    out = Probe(p.samples)
    out.peak = max(p.moments.outside, *p.moments.blocks.values())
    return out


def _curve(low: Probe, mid: Probe, high: Probe, size: int) -> float:
    """Bytes a peak growing as the square of the length (the second difference of three
    probes' peaks) adds at `size` beyond the line through the two larger ones; 0 where it
    grows no faster than a line, and where a shorter probe peaked above a longer one: there
    the peaks differ by less than their noise (a layout, a lazy buffer), which the square,
    read at a length many times theirs, would multiply (a BART's at 1 x 2048 tokens, from
    probes of 64, 128 and 256 peaking 6 MiB out of order, added 4.6 GiB)."""
    x0, x1, x2 = low.samples, mid.samples, high.samples
    if not x0 < x1 < x2 < size or not low.peak <= mid.peak <= high.peak:
        return 0.0
    square = ((high.peak - mid.peak) / (x2 - x1) - (mid.peak - low.peak) / (x1 - x0)) / (x2 - x0)
    return max(0.0, square * (size - x1) * (size - x2))


def _line(low: Probe, high: Probe, small: float, large: float, counted: float = 0.0):
    """(constant, per sample beyond `counted`) of a line through a moment's peaks `small` at
    `low`'s samples and `large` at `high`'s: where it grows by less than the bytes it is
    counted to hold per sample, it is taken to grow by those, through the larger probe's
    peak (what extrapolates up from it is then at least that)."""
    slope = (large - small) / (high.samples - low.samples)
    beyond = max(0.0, slope - counted)
    return max(0.0, large - high.samples * (counted + beyond)), beyond


def _moment_lines(found: list, rest: float, lean: Probe | None, lean_two: Probe | None):
    """The blocks with their moments in backward (Block.moment) and (constant, per sample)
    of the moments outside them, from the two lean probes (every block recomputed); None
    where those did not tell every block's moment apart."""
    if not found or lean is None or lean_two is None or lean.moments is None or \
            lean_two.moments is None or lean_two.samples <= lean.samples:
        return None
    a, b = lean.moments, lean_two.moments
    if any(i not in a.blocks or i not in b.blocks for i in range(len(found))):
        return None
    # the moments are live bytes; what is resident beyond them at a peak (the heap's free
    # chunks, pages a first-fit layout left between blocks) is each probe's peak RSS over
    # its largest moment, the larger of the two added to every moment
    over = max(0.0, *(p.peak - max(p.moments.outside, *p.moments.blocks.values())
                      for p in (lean, lean_two)))
    held = limit_plan.moments_bytes(found, rest, tuple(range(len(found))))
    out = []
    for i, block in enumerate(found):
        moment, least = _line(lean, lean_two, a.blocks[i], b.blocks[i], held[i])
        out.append(dataclasses.replace(block, moment=moment + over, moment_least=least))
    flat, least = _line(lean, lean_two, a.outside, b.outside)
    return out, (flat + over, least)


def memory_backed(path: str | None) -> bool:
    """Whether files in `path` (the temporary directory by default) live in memory (tmpfs,
    ramfs): paging there would not lower the process's footprint on the machine."""
    path = os.path.realpath(path or tempfile.gettempdir())
    best, kind = "", None
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and (path == parts[1] or path.startswith(
                        parts[1].rstrip("/") + "/")) and len(parts[1]) >= len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        return False
    return kind in ("tmpfs", "ramfs")
