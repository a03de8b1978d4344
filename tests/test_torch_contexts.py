"""The contexts a step runs in: each keeps its own state. Two threads training two models in
their own compress_saved see only their own modules; a budget set later pages out where the
context was told; each entry is one step."""
import threading

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from actcodec.torch import Policy, compress_saved  # noqa: E402
from actcodec.torch.budget import budget as budgets  # noqa: E402

from models import TransformerBlock  # noqa: E402


def cnn():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.GELU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def transformer():
    return nn.Sequential(TransformerBlock(64, 4), nn.LayerNorm(64), nn.Linear(64, 64))


CASES = {"cnn": (cnn, (8, 3, 32, 32)), "transformer": (transformer, (8, 64, 64))}
BUILT: dict = {}


def rows(stats) -> dict:
    """What a step recorded, timing left out."""
    return {key: (r.tensors, r.original_bytes, r.compressed_bytes, dict(r.codecs))
            for key, r in stats.rows.items()}


def build(name):
    """The model and its batch, built before any thread starts (torch's generator is the
    process's: threads seeding it at once would draw each other's numbers)."""
    make, shape = CASES[name]
    torch.manual_seed(0)
    return make(), torch.randn(*shape)


def train(name, steps, barrier=None, out=None):
    model, x = BUILT[name]
    ctx = compress_saved(Policy(bits=4, min_bytes=0), model=model, store=None)
    got = []
    for _ in range(steps):
        if barrier is not None:
            barrier.wait()  # both threads run their forward at the same time
        with ctx:
            loss = model(x).square().mean()
        loss.backward()
        got.append((rows(ctx.stats), ctx.stats.kept, ctx.stats.deduplicated))
        ctx.stats.rows.clear()
    if out is not None:
        out[name] = got
    return got


def test_two_threads_training_two_models_see_only_their_own_modules():
    BUILT.update({name: build(name) for name in CASES})
    alone = {name: train(name, 3) for name in CASES}
    assert {op for (_, op) in alone["cnn"][0][0]} >= {"conv", "batch_norm", "relu"}
    assert {op for (_, op) in alone["transformer"][0][0]} >= {"layer_norm", "linear"}
    BUILT.update({name: build(name) for name in CASES})  # the same models afresh
    together, errors = {}, []
    barrier = threading.Barrier(len(CASES))

    def worker(name):
        try:
            train(name, 3, barrier, together)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(n,)) for n in CASES]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for name in CASES:
        assert together[name] == alone[name], name


def test_a_budget_set_later_pages_out_where_the_context_was_told(tmp_path):
    missing = tmp_path / "no such directory"
    with pytest.raises(FileNotFoundError, match="no such directory"):  # checked when built
        compress_saved(Policy(bits=None, min_bytes=0), spill_dir=str(missing))
    missing.mkdir()
    ctx = compress_saved(Policy(bits=None, min_bytes=0), spill_dir=str(missing))
    missing.rmdir()
    ctx.budget = 0  # from here every save is paged out: to spill_dir, or nowhere
    x = torch.randn(64, 1024, requires_grad=True)
    with pytest.raises(FileNotFoundError, match="no such directory"):
        with ctx:
            (x * 1.0).exp().sum()
    missing.mkdir()
    with ctx:
        loss = (x * 1.0).exp().sum()
    assert ctx.stats.spilled >= 1 and ctx.stats.stored_bytes == 0
    loss.backward()
    assert torch.equal(x.grad, (x * 1.0).exp())


def test_each_entry_is_one_step(monkeypatch):
    calls = []
    real = budgets.Budget.new_step
    monkeypatch.setattr(budgets.Budget, "new_step", lambda self: calls.append(1) or real(self))
    ctx = compress_saved(budget="1MiB")
    x = torch.randn(64, 1024, requires_grad=True)
    for _ in range(3):
        with ctx:
            loss = (x * 1.0).exp().sum()
        loss.backward()
    assert len(calls) == 3 and ctx.stats.steps == 3


def test_a_full_disk_while_paging_out_raises_and_leaves_the_context_whole(monkeypatch):
    """A write that fails (ENOSPC) while making room raises an OSError from the step; the
    context's accounting stays consistent (nothing counted twice or lost), and the next step,
    with the disk back, pages out and gives exact gradients."""
    import errno
    import gc
    import os

    from actcodec.torch.budget import spill

    x = torch.randn(64, 1024, requires_grad=True)
    ctx = compress_saved(Policy(bits=None, min_bytes=0), budget=0)
    real, calls = os.pwrite, []

    def full(fd, data, offset):
        calls.append(1)
        if len(calls) > 1:  # one save gets out, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(spill.os, "pwrite", full)
    with pytest.raises(OSError, match="No space left"):
        with ctx:
            (x * 1.0).exp().sin().cos().sum()
    gc.collect()
    assert ctx.stats.stored_bytes == 0  # what the failed step held is released with it
    assert ctx.limit.keeper.spill.live == 0  # and the save it paged out before the failure
    monkeypatch.setattr(spill.os, "pwrite", real)
    with ctx:
        loss = (x * 1.0).exp().sin().cos().sum()
    assert ctx.stats.spilled == 2 and ctx.stats.stored_bytes == 0
    loss.backward()
    y = (x.detach() * 1.0).requires_grad_()
    y.exp().sin().cos().sum().backward()
    assert torch.equal(x.grad, y.grad)
