"""One configuration of ``python -m actcodec memory``, in this (fresh) process: a few training
steps after a warm-up, and what they took: the bytes saved for backward per step, the peak
RSS, the peak of live bytes, the floor before the measured steps and the median step time."""
from __future__ import annotations

import statistics
import time

import torch

import actcodec.torch as act

from . import configs, zoo
from .process_memory import Sampler, live, peak_rss, reset_peak, rss


def _measure_from_here(sampler) -> tuple:
    """Starts the measured steps: (RSS now, live bytes now, the warm-up's peak RSS)."""
    warm_up = peak_rss()
    reset_peak()
    sampler.on = True
    return rss(), live(), warm_up


def run(spec: str, config: str, steps: int, sizes: dict, threads: int,
        warm_up: int = 1, threshold: int | None = None) -> dict:
    """Train model `spec` under `config` ("name", "name+store" or "name+heap") for `warm_up` +
    `steps` steps; the measured steps' numbers (a JSON-ready dict)."""
    torch.set_num_threads(threads)
    name, _, suffix = config.partition("+")
    store = suffix == "store"
    if store:
        act.allocator.install(threshold or act.allocator.THRESHOLD)
    model, loss_fn = zoo.build(spec, sizes)
    model.train()
    if name == "checkpoint":
        zoo.enable_checkpointing(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    plain = name in configs.PLAIN
    limit = configs.limit_of(name)
    if limit is not None:
        return _run_limited(model, loss_fn, config, limit, warm_up, steps, suffix != "heap",
                            opt)
    contexts = configs.step_contexts(name, model, loss_fn, allocator=suffix != "heap")
    budget = contexts().budget if configs.is_budget(name) else None  # one context all along
    sampler = Sampler()
    sampler.start()
    times, held = [], []
    floor = floor_live = warm_up_peak = None
    for step in range(warm_up + steps):  # warm-up: lazy state, first allocations, a plan
        t0 = time.perf_counter()
        if plain:
            configs.new_plain_step(name, bool(store))
            if step == warm_up:
                floor, floor_live, warm_up_peak = _measure_from_here(sampler)
            loss = loss_fn(model)
        else:
            with contexts() as ctx:
                if step == warm_up:  # after the store's step boundary gave back pages
                    floor, floor_live, warm_up_peak = _measure_from_here(sampler)
                loss = loss_fn(model)
            held.append(ctx.stats.peak_stored_bytes)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss
        if step >= warm_up:
            times.append(time.perf_counter() - t0)
    sampler.stop.set()
    sampler.join()
    out = {"config": config, "peak_rss": peak_rss(), "floor_rss": floor, "floor_live": floor_live,
           "warm_up_peak_rss": warm_up_peak, "warm_up_steps": warm_up,
           "peak_live": sampler.peak_live, "step_ms": statistics.median(times) * 1e3,
           "budget": budget}
    if plain:
        out["saved_bytes"] = act.count_saved(lambda: loss_fn(model))
    else:
        out["saved_bytes"] = max(held)
    return out


def _run_limited(model, loss_fn, config: str, limit: str, warm_up: int, steps: int,
                 allocator: bool, opt) -> dict:
    """A "limit=SIZE" configuration: every step through actcodec.torch.Step, each step's own
    peak RSS (the first included) against the limit."""
    if getattr(loss_fn, "batch", None) is None:
        raise SystemExit(
            "limit=: Step splits a batch, so the model's loss_fn must carry it: set "
            "loss_fn.batch (a tensor, tuple or dict of tensors) and, unless the batch is a dict "
            "that model(**batch).loss takes, loss_fn.batch_loss(model, batch)")
    step = act.Step(model, limit=limit, loss_fn=getattr(loss_fn, "batch_loss", None),
                    allocator=allocator, optimizer=opt)
    sampler = Sampler(period=0.001, live=False)  # its RSS alone is read
    sampler.start()
    sampler.on = True
    times, peaks, plans = [], [], []
    for i in range(warm_up + steps):
        t0 = time.perf_counter()
        sampler.take_rss()
        try:
            step(loss_fn.batch)
        except act.MemoryLimitError as exc:
            sampler.stop.set()
            return {"config": config, "limit": step.limit, "error": str(exc),
                    "needed": exc.needed, "step_peaks": peaks}
        opt.step()
        opt.zero_grad(set_to_none=True)
        # the step's peak as this process's own sampler read it, the optimizer's step
        # included (not Step's report of itself)
        peaks.append(sampler.take_rss())
        plans.append(step.describe())
        if i >= warm_up:
            times.append(time.perf_counter() - t0)
    sampler.stop.set()
    sampler.join()
    return {"config": config, "limit": step.limit, "peak_rss": max(peaks),
            "floor_rss": step.stats.floor, "peak_live": sampler.peak_live,
            "step_ms": statistics.median(times) * 1e3, "saved_bytes": None,
            "step_peaks": peaks, "plan": plans[-1], "plans": plans,
            "within": all(p <= step.limit for p in peaks)}
