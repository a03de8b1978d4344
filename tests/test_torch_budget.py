"""compress_saved(budget=...): what a step holds for backward never exceeds the budget, through
re-encoding at fewer bits and paging out; budgets changed between steps and from another thread
during one; shapes that change; paged-out payloads come back exactly."""
import gc
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the torch extra; CI installs it
nn = torch.nn

from actcodec.torch import Accounting, Policy, compress_saved, convert, record  # noqa: E402
from actcodec.torch.budget import budget as budgets  # noqa: E402
from actcodec.torch.budget import planner  # noqa: E402

from test_torch_hooks import MODELS, cnn, grads  # noqa: E402


@pytest.mark.parametrize("text,nbytes", [
    ("256MiB", 256 << 20), ("1.5GB", 1_500_000_000), ("512 KiB", 512 << 10), ("4096", 4096),
    ("2g", 2 << 30), (4096, 4096), (np.int64(7), 7), ("0", 0), (None, None)])
def test_budgets_read_as_bytes(text, nbytes):
    assert budgets.parse_bytes(text) == nbytes


@pytest.mark.parametrize("bad,error", [
    ("lots", ValueError), ("12 parsecs", ValueError), ("-5MiB", ValueError), (-1, ValueError),
    (True, TypeError), (1.5, TypeError), ([1], TypeError)])
def test_bad_budgets_are_refused(bad, error):
    with pytest.raises(error, match="budget"):
        budgets.parse_bytes(bad)
    with pytest.raises(error, match="budget"):
        compress_saved(budget=bad)


def _held_8bit(model, x) -> int:
    with compress_saved(Policy(bits=8, min_bytes=0)) as c:
        loss = model(x).square().mean()
    held = c.stats.peak_stored_bytes
    loss.backward()
    return held


def _cosine(a, b) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0))


@pytest.mark.parametrize("make,inputs", MODELS, ids=["cnn", "transformer"])
@pytest.mark.parametrize("fraction", [1.0, 0.5, 0.25, 0.1])
def test_a_step_never_holds_more_than_its_budget(make, inputs, fraction):
    model, x = make(), inputs()
    exact = grads(model, x)
    budget = int(_held_8bit(model, x) * fraction)
    ctx = compress_saved(Policy(bits=8, min_bytes=0), budget=budget)
    for _ in range(3):  # the first step profiles, the later ones plan
        g = grads(model, x, ctx)
        assert ctx.stats.peak_stored_bytes <= budget
        assert ctx.stats.over_budget == 0
        assert torch.isfinite(g).all()
        assert ctx.stats.stored_bytes == 0  # backward freed the graph
    if fraction == 1.0:
        assert ctx.stats.spilled == 0 and _cosine(g, exact) > 0.999
    if fraction <= 0.25:
        assert ctx.stats.reencoded + ctx.stats.spilled > 0


def test_the_plan_learns_from_the_first_step():
    model, x = cnn(), torch.randn(8, 3, 32, 32)
    budget = _held_8bit(model, x) // 3
    ctx = compress_saved(Policy(bits=8, min_bytes=0), budget=budget)
    grads(model, x, ctx)
    first = ctx.stats.reencoded
    grads(model, x, ctx)
    assert first > 0 and ctx.stats.reencoded < first  # planned bits, fewer fixes
    assert set(ctx.limit.plan.values()) <= set(planner.CHOICES)


def test_paged_out_payloads_come_back_exactly(monkeypatch):
    # Nothing may be re-encoded, so a small budget pages every payload out; lossless
    # gradients must still equal plain PyTorch's bit for bit.
    monkeypatch.setattr(planner, "MIN_BITS", 99)
    model, x = cnn(), torch.randn(8, 3, 32, 32)
    exact = grads(model, x)
    ctx = compress_saved(Policy(bits=None, min_bytes=0), budget=1)
    with ctx:
        loss = model(x).square().mean()
    assert ctx.stats.spilled > 0 and ctx.stats.stored_bytes <= 1
    assert ctx.limit.keeper.spill.live > 0
    model.zero_grad()
    loss.backward()
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert torch.equal(got, exact)
    del loss
    gc.collect()
    assert ctx.limit.keeper.spill.live == 0 and ctx.limit.keeper.spill.end == 0  # the file emptied
    # close() closes the file; entered again, the context pages out to a new one, and its
    # step is the one a context left open makes
    assert ctx.limit.keeper.spill.file is not None
    ctx.close()
    assert ctx.limit.keeper.spill.file is None
    kept = compress_saved(Policy(bits=None, min_bytes=0), budget=1)
    grads(model, x, kept)  # the same first step
    want = grads(model, x, kept)
    assert torch.equal(grads(model, x, ctx), want)
    assert ctx.stats.spilled > 0 and ctx.limit.keeper.spill.file is not None
    ctx.close()
    kept.close()


@pytest.mark.parametrize("make,inputs", MODELS, ids=["cnn", "transformer"])
def test_a_budget_of_zero_holds_nothing_and_changes_no_bits(make, inputs):
    # Every save is paged out at the policy's bits as it comes: nothing re-encoded, nothing
    # held, and the gradients those of the same policy without a budget, bit for bit.
    model, x = make(), inputs()
    policy = Policy(bits=8, min_bytes=0)
    unbudgeted = grads(model, x, compress_saved(policy))
    ctx = compress_saved(policy, budget=0)
    for _ in range(2):
        got = grads(model, x, ctx)
        assert ctx.stats.peak_stored_bytes == 0 and ctx.stats.over_budget == 0
        assert ctx.stats.reencoded == 0 and ctx.stats.spilled > 0
        assert torch.equal(got, unbudgeted)


def test_shapes_that_change_stay_within_the_budget():
    model = cnn()
    budget = _held_8bit(model, torch.randn(8, 3, 32, 32)) // 4
    ctx = compress_saved(Policy(bits=8, min_bytes=0), budget=budget)
    for batch, size in [(8, 32), (4, 32), (16, 32), (2, 32), (8, 32)]:
        g = grads(model, torch.randn(batch, 3, size, size), ctx)
        assert ctx.stats.peak_stored_bytes <= budget and torch.isfinite(g).all()


def test_a_budget_changed_between_steps():
    model, x = cnn(), torch.randn(8, 3, 32, 32)
    full = _held_8bit(model, x)
    ctx = compress_saved(Policy(bits=8, min_bytes=0), budget=full)
    for budget in (full, full // 2, full // 8, "1 KiB", full):
        ctx.budget = budget
        grads(model, x, ctx)
        assert ctx.stats.peak_stored_bytes <= budgets.parse_bytes(budget)
        assert ctx.stats.budget == budgets.parse_bytes(budget)


def test_a_budget_lowered_from_another_thread_during_a_step():
    model, x = cnn(), torch.randn(8, 3, 32, 32)
    full = _held_8bit(model, x)
    ctx = compress_saved(Policy(bits=8, min_bytes=0), budget=full)
    grads(model, x, ctx)
    lower = full // 6
    held_after = []

    def lower_it(module, args, out):
        t = threading.Thread(target=setattr, args=(ctx, "budget", lower))
        t.start()
        t.join()
        held_after.append(ctx.stats.stored_bytes)
        ctx.stats.peak_stored_bytes = ctx.stats.stored_bytes  # the peak from here on

    handle = model[5].register_forward_hook(lower_it)  # the second batch norm
    try:
        with ctx:
            loss = model(x).square().mean()
    finally:
        handle.remove()
    assert held_after and held_after[0] <= lower
    assert ctx.stats.peak_stored_bytes <= lower
    loss.backward()
    assert ctx.budget == lower


def test_threads_stepping_under_one_budget_each():
    budget_of, errors = {}, []

    def worker(i):
        try:
            model, x = cnn(), torch.randn(4, 3, 32, 32)
            budget = _held_8bit(model, x) // (2 + i)
            ctx = compress_saved(Policy(bits=8, min_bytes=0), budget=budget)
            for _ in range(3):
                grads(model, x, ctx)
                assert ctx.stats.peak_stored_bytes <= budget
            budget_of[i] = budget
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(budget_of) == 3


def test_no_budget_changes_nothing():
    model, x = cnn(), torch.randn(8, 3, 32, 32)
    a = grads(model, x, compress_saved(Policy(bits=4)))
    b = grads(model, x, compress_saved(Policy(bits=4), budget=None))
    assert torch.equal(a, b)


def _converted_grads(model, x, rec=None):
    model.zero_grad()
    torch.manual_seed(1)
    if rec is None:
        loss = model(x).square().mean()
    else:
        with rec:
            loss = model(x).square().mean()
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("fraction", [1.0, 0.25, 0.05])
def test_converted_modules_keep_a_budget(fraction):
    model, x = convert(cnn(), Policy(bits=8, min_bytes=0)), torch.randn(8, 3, 32, 32)
    free = Accounting()
    with record(free):
        loss = model(x).square().mean()
    budget = int(free.peak_stored_bytes * fraction)
    loss.backward()
    rec = record(budget=budget)
    acc = rec.stats
    for _ in range(3):
        g = _converted_grads(model, x, rec)
        assert acc.peak_stored_bytes <= budget and torch.isfinite(g).all()
        assert acc.stored_bytes == 0
    if fraction < 0.1:
        assert acc.reencoded + acc.spilled > 0


def test_converted_modules_page_out_exactly(monkeypatch):
    monkeypatch.setattr(planner, "MIN_BITS", 99)
    model, x = convert(cnn(), Policy(bits=None, min_bytes=0)), torch.randn(8, 3, 32, 32)
    exact = _converted_grads(model, x)
    rec = record(budget=1)
    acc = rec.stats
    assert torch.equal(_converted_grads(model, x, rec), exact)
    kept = 2 * (16 + 32) * 4  # the batch norms' saved means and inverse stds, kept as they are
    assert acc.spilled > 0 and acc.peak_stored_bytes <= kept and acc.over_budget > 0


def test_converted_modules_under_a_budget_of_zero_change_no_bits():
    model, x = convert(cnn(), Policy(bits=8, min_bytes=0)), torch.randn(8, 3, 32, 32)
    unbudgeted = _converted_grads(model, x, record())
    rec = record(budget=0)
    acc = rec.stats
    for _ in range(2):
        assert torch.equal(_converted_grads(model, x, rec), unbudgeted)
        kept = 2 * (16 + 32) * 4  # the batch norms' saved means and inverse stds, as they are
        assert acc.reencoded == 0 and acc.spilled > 0 and acc.peak_stored_bytes <= kept
