"""The activation store: pages actcodec maps itself for what a training step keeps from its
forward pass to its backward (the payloads of compressed activations), so that those
lifetimes never fragment the process's heap (DAF 3.4). It reserves address space, makes pages
resident as blocks reach them, keeps them for the next step, and at each step's start gives
back the pages the step before did not need (DAF 3.4.4). csrc/store.c has the allocator,
csrc/store_plan.c the plan.

    store = actcodec.store.default()          # the process's store, made on first use
    store.stats()                             # reserved, mapped, used and peak used bytes

The torch adapters use the default store unless told otherwise (`compress_saved(store=...)`;
`store=None` takes payloads from numpy's heap as plain `actcodec.encode` does). The torch
allocator (actcodec.torch.allocator, which compress_saved installs on first use) serves
torch's large tensors from the same store.

A store learns each step: it records when and where its blocks lived and, at the next step's
start, plans where each goes the next time, largest first around what is still live (Melon's
lifetime-aware pool). A training step repeats the last one's requests, so it follows the plan
and fits into its peak of simultaneous use, where first fit (what the first step, and any
request the plan does not know, gets) leaves holes that large tensors do not fit."""
from __future__ import annotations

import threading

from . import _ext
from ._alloc import StoreAlloc  # noqa: F401  (payload blocks from a store)

Store = _ext.Store
_DEFAULT: list = []
_LOCK = threading.Lock()


def default() -> Store:
    """The process's store (made on first use)."""
    if not _DEFAULT:
        with _LOCK:
            if not _DEFAULT:
                _DEFAULT.append(Store())
    return _DEFAULT[0]


def made() -> list:
    """The process's store, if it was made."""
    return list(_DEFAULT)


def new_step(store: Store | None) -> None:
    """A training step begins: `store` and the process's store (if made) end a period (see
    Store.reset_peak)."""
    for s in {id(x): x for x in (store, *_DEFAULT) if x is not None}.values():
        s.reset_peak()


def new_larger_step(store: Store | None) -> None:
    """A step larger than the last begins (a micro-batch of more samples): `store` and the
    process's store end a period without a plan, keeping their pages (Store.forget_plan):
    the plan of the smaller step would place the larger one's requests above itself."""
    for s in {id(x): x for x in (store, *_DEFAULT) if x is not None}.values():
        s.forget_plan()
