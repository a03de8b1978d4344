"""One repeated block run on its own at a long sample's whole length.

Along a sequence the probes run on a quarter and a half of it at most, and every per-token
cost is a line through those lengths. A block that saves tensors over every pair of
positions (eager attention's heads x T x T scores, Bloom's ALiBi) grows as the square of the
length, in its saves and in its backward's working memory, so the line under-measures both at
the whole length (a Bloom at 1 x 2048 peaked 150 MiB above a plan predicted from probes of
512 and 1024 tokens). Such a block is measured where it peaks, alone: its inputs as the model
gives them at the whole length (the model's forward run without gradients up to it), then
its forward and backward. It is run at doubling lengths from the probes' longest, each only
where the square of the one before says it fits in the room; where the whole length does
not, the longest measured scaled as the square stands for it (a bound where the bytes grow
as a polynomial of degree two in the length).
"""
from __future__ import annotations

import contextlib
import dataclasses
import warnings

import torch

from . import shape


class _Seen(Exception):
    """Raised by the capturing hook: the model's forward stops at the block."""


@dataclasses.dataclass(frozen=True)
class Alone:
    """A block measured alone at `tokens`: bytes its forward left live beyond its outputs (its
    saves), its forward and backward's peak of live bytes above what was live as it started,
    and `reach`, how far the meter's peak rose above what it held as it started (on the CPU,
    resident memory: what the allocators held free was taken first); `bound`: scaled as the
    square from a shorter length (not measured at this one)."""

    tokens: int
    saves: float
    peak: float
    reach: float
    bound: bool = False


def inputs_at(run_loss, block: torch.nn.Module, tokens: int):
    """(args, kwargs) the model calls `block` with on its first `tokens` tokens (run without
    gradients, up to the block only); None where it is not called."""
    seen = {}

    def capture(module, args, kwargs):
        seen["call"] = (args, kwargs)
        raise _Seen

    handle = block.register_forward_pre_hook(capture, with_kwargs=True, prepend=True)
    try:
        with torch.no_grad():
            run_loss(tokens)
    except _Seen:
        pass
    finally:
        handle.remove()
    return seen.get("call")


def run_alone(block: torch.nn.Module, call, meter, tokens: int) -> Alone | None:
    """The block's forward and backward on `call` (inputs_at's), the gradient taken for its
    floating-point positional inputs and `hidden_states` (the sequence it transforms; masks
    and position tables given as keywords stay constants), its parameters' left out (the
    step counts those in its gradients). None where no input or output carries a gradient."""
    args, kwargs = call
    args = tuple(a.detach().requires_grad_() if isinstance(a, torch.Tensor) and
                 a.is_floating_point() else a for a in args)
    hidden = kwargs.get("hidden_states")
    if isinstance(hidden, torch.Tensor) and hidden.is_floating_point():
        kwargs = {**kwargs, "hidden_states": hidden.detach().requires_grad_()}
    leaves = [t for t in (*args, kwargs.get("hidden_states")) if isinstance(t, torch.Tensor)
              and t.requires_grad]
    if not leaves:
        return None
    meter.start_probe(True)
    base, held = meter.live(), meter.held()
    # live bytes where the meter tells them apart (the moments the block's own part adds to
    # are live bytes too: Block.moment); else its peak
    live = meter.live_peak()
    with meter.peak() as reach, live if live is not None else contextlib.nullcontext() as peak:
        with torch.enable_grad():
            outs = [t for t in shape._tensors(block(*args, **kwargs)) if t.requires_grad]
        meter.synchronize()
        saves = meter.live() - base - sum(t.numel() * t.element_size() for t in outs)
        if not outs:
            return None
        grads = torch.autograd.grad(outs, leaves, [torch.ones_like(t) for t in outs],
                                    allow_unused=True)
        del grads, outs
        meter.synchronize()
    reached = max(0.0, float(reach.nbytes - held))
    return Alone(tokens, max(0.0, float(saves)),
                 float(max(0, reach.nbytes - base)) if peak is None else
                 max(0.0, float(peak.nbytes - base)), reached)


def measure(run_loss, block: torch.nn.Module, start: int, tokens: int, meter, fits):
    """The block alone at `tokens` (Alone), run at `start` and then at doubling lengths up to
    `tokens`, each only where `fits(bytes above what is live)` says the square of the one
    before leaves room for it; where a length does not, the longest measured scaled as the
    square (`bound`). None where the block could not be run alone."""
    done, length = None, start
    while True:
        found = _once(run_loss, block, meter, length)
        if found is None:
            return None if done is None else _squared(done, tokens)
        done = found
        if done.tokens >= tokens:
            return done
        length = min(tokens, 2 * done.tokens)
        # what the meter holds beyond the live bytes is taken first, then new memory
        if not fits(meter.held() - meter.live() + _squared(done, length).reach):
            return _squared(done, tokens)


def _once(run_loss, block: torch.nn.Module, meter, length: int) -> Alone | None:
    """The block alone at `length` (inputs_at, then run_alone); None, with a RuntimeWarning
    where it raised, where it could not be run alone."""
    try:
        call = inputs_at(run_loss, block, length)
        return None if call is None else run_alone(block, call, meter, length)
    except Exception as exc:  # noqa: BLE001 (a block that does not run outside its model)
        warnings.warn(f"{type(block).__name__} could not be run alone ({type(exc).__name__}: "
                      f"{exc}): its saves over every pair of positions are planned from "
                      f"shorter lengths only, which can under-measure them",
                      RuntimeWarning, stacklevel=3)
        return None


def _squared(alone: Alone, tokens: int) -> Alone:
    """A measurement at a shorter length scaled to `tokens` as the square of the length (an
    upper bound where bytes grow as a polynomial of degree two at most)."""
    r = (tokens / alone.tokens) ** 2
    return Alone(tokens, alone.saves * r, alone.peak * r, alone.reach * r,
                 bound=tokens != alone.tokens)


def corrected(found: list, square: dict, index: int, alone: Alone) -> list:
    """The blocks (limit_plan.Block, per token at alone.tokens) with what block `index`
    measured alone added where the probes' lines fell short: its saves, and its moment's own
    part (its saves and backward's working memory, Block.moment_least); every block saving
    square tensors gets the same shortfall (the repeated blocks are alike; a save they share,
    a mask, is counted in the first only, so their square bytes are no measure of theirs).
    `index`: the block with the most square bytes."""
    if index >= len(found) or not square.get(index):
        return found
    tokens, own = alone.tokens, found[index]
    short_saves = max(0.0, alone.saves / tokens - own.saved)
    short_work = max(0.0, alone.peak / tokens - (own.saved + short_saves) - own.moment_least)
    out = []
    for i, block in enumerate(found):
        out.append(dataclasses.replace(block, saved=block.saved + short_saves,
                                       moment_least=block.moment_least + short_work)
                   if square.get(i) else block)
    return out


def working(found: list, index: int, alone: Alone) -> float:
    """Per token, the block's backward's working memory beyond its saves at alone.tokens (what
    no plan peaks below, where backward's moments were not told apart)."""
    return max(0.0, alone.peak / alone.tokens - found[index].saved)

