"""The configurations the apps (and bench/) train under, by name, and the context each step of
one runs in:

- ``fp32``, ``checkpoint`` (PLAIN): torch saves what it saves, no compress_saved;
- a `Policy.preset` name: ``compress_saved(Policy.preset(name), model=model)``; with
  ``@stochastic`` (``2bit@stochastic``), the preset with stochastic rounding;
- ``budget/N``: ``compress_saved(model=model, budget=...)`` at 1/N of the bytes plain fp32
  saves (the demo's ``budget/N-halved`` halves it half-way through training); ``offload``
  (OFFLOAD): a budget of 0, every save paged out.

- ``limit=SIZE`` (e.g. ``limit=700MiB``): ``actcodec.torch.Step(model, limit=SIZE)`` runs each
  step (its plan: micro-batches, recomputation, storage) on the model's batch.

A suffix is the caller's to split off: ``+store`` installs actcodec's torch allocator by hand
(plain runs too), ``+heap`` keeps torch's (``compress_saved(allocator=False)``); without one,
compress_saved installs it on first use, as it does for every user.
"""
from __future__ import annotations

import contextlib

PLAIN = ("fp32", "checkpoint")  # torch saves what it saves; no compress_saved
OFFLOAD = "offload"  # a budget of 0: every save paged out, nothing held in memory for backward


ROUNDING = "@stochastic"  # a preset name's modifier: the preset with stochastic rounding


def policy(name: str):
    """The Policy a preset configuration names: `Policy.preset`, or with ROUNDING appended,
    that preset with stochastic rounding. ValueError for an unknown preset."""
    from actcodec.torch import Policy

    if name.endswith(ROUNDING):
        return Policy.preset(name.removesuffix(ROUNDING), rounding="stochastic")
    return Policy.preset(name)


def budget_divisor(name: str) -> int | None:
    """N of a "budget/N" configuration (a budget of 1/N of what fp32 saves); None if the name
    is not one."""
    n = name[len("budget/"):] if name.startswith("budget/") else ""
    return int(n) if n.isdigit() and int(n) >= 1 else None


def budget_preset(name: str) -> str | None:
    """P of a "budget/P" configuration, a budget of the bytes the preset P holds for a step
    (budget/2bit: the budget at uniform 2-bit's bytes, spent by importance instead); None if
    the name is not one."""
    p = name[len("budget/"):].removesuffix("-halved") if name.startswith("budget/") else ""
    if not p or p.isdigit():
        return None
    try:
        policy(p)
    except ValueError:
        return None
    return p


def budget_fraction(name: str) -> int | None:
    """N of a "budget/N" or "budget/N-halved" (the demo's: the budget halves half-way through
    training) configuration; None if the name is not one."""
    return budget_divisor(name.removesuffix("-halved"))


def is_budget(name: str) -> bool:
    """Whether a configuration runs under a budget: budget/N, or offload (a budget of 0)."""
    return name == OFFLOAD or budget_divisor(name) is not None


SUFFIXES = ("", "store", "heap")


def limit_of(name: str) -> str | None:
    """SIZE of a "limit=SIZE" configuration; None if the name is not one."""
    return name[len("limit="):] if name.startswith("limit=") else None


def check(config: str) -> None:
    """A clear error for a configuration whose name or suffix is none: SystemExit for a bad
    budget/N, limit or suffix, ValueError for an unknown preset."""
    name, _, suffix = config.partition("+")
    if suffix not in SUFFIXES:
        raise SystemExit(f"--configs: {config!r}: the suffix is '+store' or '+heap'")
    if limit_of(name) is not None:
        from actcodec.torch import parse_bytes

        try:
            parse_bytes(limit_of(name))
        except (ValueError, TypeError) as exc:
            raise SystemExit(f"--configs: {config!r}: {exc}") from None
    elif name.startswith("budget/"):
        if budget_divisor(name) is None:
            raise SystemExit(f"--configs: {config!r}: budget/N takes a whole N >= 1")
    elif name not in (*PLAIN, OFFLOAD):
        policy(name)


def new_plain_step(name: str, allocator: bool) -> None:
    """At a step's start: a plain configuration with actcodec's allocator ends the store's
    period itself (actcodec.store.new_step), since no compress_saved does."""
    if allocator and name in PLAIN:
        from actcodec import store

        store.new_step(None)


def budget_context(name: str, model, loss_fn, allocator: bool = True):
    """For a budget configuration: compress_saved with a budget of 1/N of what plain fp32 saves
    for loss_fn(model) ("budget/N"), or of 0 ("offload"), to enter every step (the budget
    learns from the steps before). allocator: compress_saved's."""
    import actcodec.torch as act

    if name == OFFLOAD:
        budget = 0
    else:
        budget = act.count_saved(lambda: loss_fn(model)) // budget_divisor(name)
    return act.compress_saved(model=model, budget=budget, allocator=allocator)


def step_contexts(name: str, model, loss_fn, allocator: bool = True):
    """A function giving the context each step of configuration `name` (no suffix) runs in:
    a null context for the plain ones; one budget context, made now, for every step of a
    budget (it learns from the steps before); a fresh compress_saved of the preset per call
    for a preset."""
    if name in PLAIN:
        return contextlib.nullcontext
    if is_budget(name):
        ctx = budget_context(name, model, loss_fn, allocator)
        return lambda: ctx
    import actcodec.torch as act

    named = policy(name)
    return lambda: act.compress_saved(named, model=model, allocator=allocator)
