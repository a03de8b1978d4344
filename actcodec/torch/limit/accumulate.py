"""Gradient accumulation over a plan's micro-batches, all or nothing.

What .grad held before the step is set aside (no copy: the tensors are kept as they are and
.grad starts from None), the micro-batches accumulate into fresh gradients, and at the end
what was set aside is added back. Where anything raises, the fresh gradients are dropped and
.grad is put back to the very tensors it held: a loop that catches the error and skips the
batch applies no part of it.

Each micro-batch's loss is scaled by its share of the batch's loss (limit/loss_weights.py)
or, where the loss function gives a weight with its loss, by its weight over the weights so
far (the gradients accumulated are rescaled as the total grows: the total is not known
before the last forward). A micro-batch whose share or weight is 0 adds nothing: it takes no
backward (its loss may be NaN, as transformers' mean over no target is), and where its share
is known before the forward it is not run at all. Under DistributedDataParallel every
micro-batch but the last one run accumulates without communicating (`no_sync`); the last
takes a backward even at weight 0 (times 0), since DDP reduces the gradients there."""
from __future__ import annotations

import contextlib
import dataclasses
import time

import torch


@dataclasses.dataclass
class Accumulated:
    """The batch's loss (detached: the shares' sum of the micro-batches' losses, as one
    full-batch forward gives it) and the seconds spent in forward and backward."""

    loss: torch.Tensor
    forward: float
    backward: float


def accumulate(run, ranges: list, shares: list, params: list, *, scaler=None,
               no_sync=None) -> Accumulated:
    """Runs the micro-batches into the parameters' .grad.

    run(start, stop): (loss, weight or None) of samples start:stop, forward done;
    ranges: the micro-batches' (start, stop); shares: each one's share of the batch's loss
    where `run` gives no weight; params: the parameters that take gradients; scaler: a
    GradScaler; no_sync: the model's `no_sync` (DistributedDataParallel), or None."""
    if len(shares) != len(ranges):
        raise ValueError(f"{len(shares)} shares for {len(ranges)} micro-batches")
    # the last one run: the last of a nonzero share (a trailing micro-batch without a
    # target is skipped), so that DDP reduces after a real backward where there is one
    final = max((j for j, s in enumerate(shares) if s > 0), default=len(ranges) - 1)
    kept = _set_aside(params)
    total, weights, weighted = None, 0.0, None
    forward = backward = 0.0
    done = 0
    j = 0
    try:
        for j, (start, stop) in enumerate(ranges[:final + 1]):
            last = j == final
            if shares[j] == 0 and not last:
                continue  # adds nothing, known before its forward
            sync = contextlib.nullcontext() if last or no_sync is None else no_sync()
            with sync:
                t0 = time.perf_counter()
                loss, weight = run(start, stop)
                t1 = time.perf_counter()
                if weighted is None:
                    weighted = weight is not None
                elif weighted != (weight is not None):
                    raise ValueError("loss_fn returned a weight for some micro-batches and "
                                     "not for others: return (loss, weight) for every one")
                if weighted:
                    before, weights = weights, weights + weight
                    if before > 0 and weights > before:  # the mean so far, reweighted
                        with torch.no_grad():
                            for p in params:
                                if p.grad is not None:
                                    p.grad.mul_(before / weights)
                    scale = weight / weights if weights > 0 else 0.0
                else:
                    scale = shares[j]
                if scale > 0 or (last and no_sync is not None):
                    scaled = loss * scale
                    if scaler is not None:
                        scaled = scaler.scale(scaled)
                    scaled.backward()
                    del scaled
                forward += t1 - t0
                backward += time.perf_counter() - t1
            if scale > 0:
                part = loss.detach() * scale
                total = part if total is None else (
                    total * (1 - scale) + part if weighted else total + part)
            elif total is None and last:  # no micro-batch had a target: NaN, as one forward
                total = loss.detach()
            done += 1
            del loss
    except BaseException as exc:
        _put_back(params, kept)
        if hasattr(exc, "add_note"):
            exc.add_note(f"actcodec.torch.Step: raised in micro-batch {j + 1} of "
                         f"{len(ranges)}; .grad is as it was before the step (what the "
                         f"{done} micro-batch(es) run before added was taken back)")
        raise
    _add_back(params, kept)
    return Accumulated(loss=total, forward=forward, backward=backward)


def _set_aside(params: list) -> list:
    """What .grad holds, kept aside (the tensors themselves, not copies); .grad then None."""
    kept = [p.grad for p in params]
    for p in params:
        p.grad = None
    return kept


def _put_back(params: list, kept: list) -> None:
    """.grad exactly as it was: the step's gradients dropped."""
    for p, g in zip(params, kept):
        p.grad = g


def _add_back(params: list, kept: list) -> None:
    """What .grad held before the step plus what the step added, in the tensors it held."""
    with torch.no_grad():
        for p, g in zip(params, kept):
            if g is None:
                continue
            if p.grad is not None:
                g.add_(p.grad)
            p.grad = g
