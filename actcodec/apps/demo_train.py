"""One worker of ``python -m actcodec demo``: one configuration trained in this (fresh) process,
in named pieces: the task's data and model, a warm-up (and a budget's size), the training
loop, the evaluation, and the counting pass that gives the saved bytes. `run` puts them
together and returns the worker's JSON-ready result."""
from __future__ import annotations

import contextlib
import copy
import gc
import hashlib
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import actcodec
from actcodec.torch import CountSaved, Policy, allocator, compress_saved, count_saved

from . import configs, demo_digits, demo_text
from .process_memory import peak_rss, reset_peak, rss


def loss_of(logits, y):
    """Cross-entropy per image, or per byte of every window."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _context(policy):
    """A step's context under a preset, or none (plain)."""
    return contextlib.nullcontext() if policy is None else compress_saved(policy)


# ---- data and model ----

def task(name: str, s: dict, data: str, seed: int):
    """(x_train, y_train, x_test, y_test, model) of the settings' task; the model checkpoints
    its blocks under "checkpoint"."""
    checkpointed = name == "checkpoint"
    if s["task"] == "text":
        x_train, y_train, x_test, y_test = demo_text.data(data)
        model = demo_text.model(s["width"], s["size"], checkpointed, seed)
    else:
        x_train, y_train, x_test, y_test = demo_digits.data(data, s["size"])
        model = demo_digits.model(s["width"], use_checkpoint=checkpointed, seed=seed)
    return x_train, y_train, x_test, y_test, model


def optimizer(model, total_steps: int):
    """SGD with Nesterov momentum under a one-cycle schedule."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4,
                          nesterov=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=total_steps,
                                                pct_start=0.25)
    return opt, sched


def warm_up(name: str, policy, model, x_train, y_train, batch: int):
    """Warm up the libraries' lazy state (thread pools, kernels) on a throwaway copy of the
    model, so the floor is what the process holds before training; the real model is not
    touched. For a budget: the budget context, at 1/N of what plain fp32 saves for a training
    batch (counted on the copy, as the counting pass: a batch of its own), or at what a preset
    holds for one (budget/2bit); else None."""
    budgeted = name.startswith("budget/")
    warm = copy.deepcopy(model)
    with _context(Policy() if budgeted else policy and configs.policy(name)):
        loss = loss_of(warm(x_train[:2]), y_train[:2])
    loss.backward()
    del loss
    budgeted_ctx = None
    if budgeted and configs.budget_preset(name):  # what the preset holds for a training batch
        with compress_saved(configs.policy(configs.budget_preset(name)), model=warm) as c:
            loss = loss_of(warm(x_train[:batch].clone()), y_train[:batch])
        loss.backward()
        del loss
        budgeted_ctx = compress_saved(model=model, budget=c.stats.peak_stored_bytes)
    elif budgeted:
        fp32 = count_saved(lambda m=warm: m(x_train[:batch].clone()))
        budgeted_ctx = compress_saved(model=model, budget=fp32 // configs.budget_fraction(name))
    del warm
    gc.collect()
    return budgeted_ctx


# ---- the training loop ----

@dataclass
class Training:
    """What the training loop saw, step by step."""
    step_seconds: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    compressed: list = field(default_factory=list)  # a preset's bytes per step
    original: list = field(default_factory=list)
    codecs: dict = field(default_factory=dict)
    held: list = field(default_factory=list)  # a budget's peak held per step, and the budget
    budgets: list = field(default_factory=list)
    reencoded: int = 0
    paged_out: int = 0
    diverged: int | None = None  # the step whose loss or activations were no longer finite

    def note(self, ctx, policy, budgeted: bool) -> None:
        """The step's numbers from its context."""
        if budgeted:
            self.held.append(ctx.stats.peak_stored_bytes)
            self.budgets.append(ctx.budget)
            self.reencoded += ctx.stats.reencoded
            self.paged_out += ctx.stats.spilled
        elif policy is not None:
            self.compressed.append(ctx.stats.compressed_bytes)
            self.original.append(ctx.stats.original_bytes)
            for k, v in ctx.stats.codecs.items():
                self.codecs[k] = self.codecs.get(k, 0) + v


def train(name: str, policy, budgeted_ctx, model, opt, sched, x_train, y_train, batch: int,
          epochs: int, seed: int) -> Training:
    """`epochs` epochs of whole batches in a seeded order (the same batches in every
    configuration); a "-halved" budget halves half-way through and training carries on."""
    from tqdm import tqdm

    budgeted = budgeted_ctx is not None
    budget = budgeted_ctx.budget if budgeted else None
    recomputes = name == "checkpoint"
    steps_per_epoch = len(y_train) // batch  # drop the last partial batch: equal steps
    total_steps = steps_per_epoch * epochs
    gen = torch.Generator().manual_seed(seed)
    t = Training()
    model.train()
    bar = tqdm(total=total_steps, desc=f"{name:>10}", leave=False, disable=None, unit="step",
               dynamic_ncols=True)
    for _ in range(epochs):
        if t.diverged is not None:
            break
        order = torch.randperm(len(y_train), generator=gen)
        for i in range(steps_per_epoch):
            idx = order[i * batch:(i + 1) * batch]
            xb, yb = x_train[idx], y_train[idx]
            t0 = time.perf_counter()
            if budgeted and name.endswith("-halved") and len(t.losses) == total_steps // 2:
                budgeted_ctx.budget = budget // 2  # and training carries on
            # each entry is a new step of the policy
            ctx = budgeted_ctx if budgeted else _context(policy)
            try:
                with ctx:
                    loss = loss_of(model(xb), yb)
            except actcodec.NonFiniteError:  # the activations blew up: training diverged
                t.diverged = len(t.losses)
                break
            if not torch.isfinite(loss):
                t.diverged = len(t.losses)
                break
            opt.zero_grad(set_to_none=True)
            if recomputes:
                # The recomputation in backward runs BatchNorm in training mode a second time:
                # keep the running statistics the forward left.
                buffers = [b.clone() for b in model.buffers()]
            loss.backward()
            if recomputes:
                with torch.no_grad():
                    for b, kept in zip(model.buffers(), buffers):
                        b.copy_(kept)
            opt.step()
            sched.step()
            t.step_seconds.append(time.perf_counter() - t0)
            t.note(ctx, policy, budgeted)
            t.losses.append(loss.item())
            del loss, ctx
            bar.update()
            bar.set_postfix(loss=f"{t.losses[-1]:.3f}", refresh=False)
    bar.close()
    return t


# ---- evaluation and the saved bytes ----

def evaluate(model, x_test, y_test) -> tuple[float, float]:
    """(accuracy, mean loss) on the test set, in batches of 256."""
    model.eval()
    correct, test_loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(y_test), 256):
            logits, y = model(x_test[i:i + 256]), y_test[i:i + 256]
            correct += int((logits.argmax(-1) == y).sum())
            test_loss += float(loss_of(logits, y)) * y.numel()
    return correct / y_test.numel(), test_loss / y_test.numel()


def weights_sha256(model) -> str:
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
    return digest.hexdigest()


def saved_bytes(model, xb, t: Training, policy, budgeted: bool) -> dict:
    """The saved bytes per step (mean, min, max). The counting pass runs after everything
    measured (it runs BatchNorm in training mode) on a batch of its own, as in training."""
    model.train()
    with CountSaved() as counted:
        out = model(xb.clone())
    del out
    if budgeted and t.held:  # what the step held at its peak, kept tensors included
        saved, saved_min, saved_max = statistics.mean(t.held), min(t.held), max(t.held)
        kept = 0
    elif policy is None:
        saved = saved_min = saved_max = counted.nbytes
        kept = 0
    else:
        kept = max(0, counted.nbytes - statistics.mean(t.original))
        saved = statistics.mean(t.compressed) + kept
        saved_min, saved_max = min(t.compressed) + kept, max(t.compressed) + kept
    return {"saved_bytes": saved, "saved_bytes_min": saved_min, "saved_bytes_max": saved_max,
            "counted_bytes": counted.nbytes, "kept_bytes": kept}


# ---- the worker ----

def run(name: str, s: dict, data: str, seed: int = 0) -> dict:
    """Configuration `name` with settings `s` on the parent's split `data`, training seed
    `seed`: the worker's result."""
    t_start = time.perf_counter()
    torch.set_num_threads(s["threads"])
    actcodec.set_num_threads(s["threads"])
    if s["allocator"] == "store":
        allocator.install()
    budgeted = name.startswith("budget/")
    policy = None if name in configs.PLAIN or budgeted else configs.policy(name)

    x_train, y_train, x_test, y_test, model = task(name, s, data, seed)
    batch = min(s["batch_size"], len(y_train))
    total_steps = len(y_train) // batch * s["epochs"]
    opt, sched = optimizer(model, total_steps)
    budgeted_ctx = warm_up(name, policy, model, x_train, y_train, batch)

    floor = rss()
    lifetime_before = peak_rss()
    reset = reset_peak()
    t = train(name, policy, budgeted_ctx, model, opt, sched, x_train, y_train, batch,
              s["epochs"], seed)
    train_seconds = time.perf_counter() - t_start
    peak = peak_rss()

    accuracy, test_loss = evaluate(model, x_test, y_test)
    digest = weights_sha256(model)
    saved = saved_bytes(model, x_train[:batch], t, policy, budgeted)
    return {
        "config": name, "seed": seed, "settings": s, "test_accuracy": accuracy,
        "test_loss": test_loss, "test_images": len(y_test),
        "train_images": len(y_train), "steps": total_steps,
        "final_loss": t.losses[-1] if t.losses else None,
        **saved,
        "original_bytes": statistics.mean(t.original) if t.original else None,
        "compressed_bytes": statistics.mean(t.compressed) if t.compressed else None,
        "codecs": t.codecs, "floor_rss": floor, "peak_rss": max(peak, lifetime_before),
        "peak_above_floor": peak - floor, "peak_reset": reset,
        "step_ms": statistics.median(t.step_seconds) * 1e3 if t.step_seconds else float("nan"),
        "seconds": train_seconds,
        "weights_sha256": digest, "torch": torch.__version__,
        "allocator": s["allocator"],
        "actcodec": actcodec.__version__,
        "budget_bytes": t.budgets or None, "held_bytes": t.held or None,
        "within_budget": all(h <= b for h, b in zip(t.held, t.budgets)) if budgeted else None,
        "reencoded": t.reencoded, "paged_out": t.paged_out, "diverged_at_step": t.diverged,
    }
