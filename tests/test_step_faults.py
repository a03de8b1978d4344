"""Faults are clear, early and in the right thread (issue 32, items 6 and 8): a bad spill_dir
is named when Step or compress_saved is built; a full spill directory raises an OSError with
ENOSPC and the directory, leaves .grad and the model as they were, and the next step runs; a
limit changed from a real second thread while a budget step runs never pages out in that
thread, never leaves `step.limit` and the step's budget out of step, and moves the budget by
how far the limit went below the one the step was planned for."""
import errno
import gc
import os
import re
import subprocess
import threading

import pytest
import torch
from torch import nn
import torch.nn.functional as F

import actcodec.torch as act
from actcodec import resident
from actcodec.torch import compress_saved, record, Policy

MiB = 1 << 20
WAIT = 60  # seconds any thread waits for the other before the test fails (no deadlock)


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 4 * width), \
            nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, width=64, depth=4):
        super().__init__()
        self.stem = nn.Linear(8, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        h = self.stem(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h).squeeze(-1)


def mse(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


def data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randn(n, generator=g)


def net(seed=0, **kw):
    torch.manual_seed(seed)
    return Net(**kw)


def plain_grads(batch, **kw):
    m = net(**kw)
    mse(m, batch).backward()
    return [p.grad for p in m.parameters()]


def snapshot(m):
    """The model's state and its .grad, copied."""
    return ({k: v.clone() for k, v in m.state_dict().items()},
            [None if p.grad is None else p.grad.clone() for p in m.parameters()])


def same(a, b) -> bool:
    (state_a, grad_a), (state_b, grad_b) = a, b
    return state_a.keys() == state_b.keys() and \
        all(torch.equal(state_a[k], state_b[k]) for k in state_a) and \
        all((x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
            for x, y in zip(grad_a, grad_b))


def _mount(directory, options: str) -> str | None:
    """Mounts a tmpfs at `directory`; None where that works, else why not."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"mount could not run: {e}"
    return None if done.returncode == 0 else f"mount refused: {done.stderr.strip()}"


def _unmount(directory) -> None:
    # lazily: a context's spill file may still be open (it lives as long as the context)
    subprocess.run(["umount", "-l", str(directory)], check=True, timeout=30)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 16 MiB tmpfs (as root where mount works; skipped with the reason elsewhere)."""
    directory = tmp_path / "small"
    directory.mkdir()
    why = _mount(directory, "size=16m")
    if why is not None:
        pytest.skip(f"no small tmpfs for a full spill directory: {why}")
    try:
        yield directory
    finally:
        _unmount(directory)


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory no file can be created in: mode 0500 for a user; for root, whom modes do
    not stop, a read-only tmpfs (skipped where mount does not work)."""
    directory = tmp_path / "read-only"
    directory.mkdir()
    if os.geteuid() != 0:
        directory.chmod(0o500)
        try:
            yield directory
        finally:
            directory.chmod(0o700)
        return
    why = _mount(directory, "ro,size=64k")
    if why is not None:
        pytest.skip(f"as root no mode makes a directory read-only and {why}")
    try:
        yield directory
    finally:
        _unmount(directory)


def fill(directory, leave: int):
    """A file that leaves about `leave` bytes free in `directory`."""
    stat = os.statvfs(directory)
    free = stat.f_bavail * stat.f_frsize
    path = directory / "filler"
    with open(path, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return path


# -- spill_dir checked at construction ------------------------------------------------------

def constructions(spill_dir):
    """Everything that takes a spill_dir, built with this one."""
    s = str(spill_dir)
    return [lambda: act.Step(net(), spill_dir=s, loss_fn=mse),
            lambda: act.Step(net(), limit="1GiB", spill_dir=s, loss_fn=mse),
            lambda: compress_saved(spill_dir=s),
            lambda: compress_saved(budget="1MiB", spill_dir=s),
            lambda: record(budget="1MiB", spill_dir=s)]


def test_a_missing_spill_dir_is_named_at_construction(tmp_path):
    missing = tmp_path / "no such directory"
    for build in constructions(missing):
        with pytest.raises(FileNotFoundError) as err:
            build()
        assert err.value.errno == errno.ENOENT and err.value.filename == str(missing)
        assert "spill_dir" in str(err.value)


def test_a_spill_dir_that_is_a_file_is_named_at_construction(tmp_path):
    a_file = tmp_path / "a file"
    a_file.write_text("not a directory")
    for build in constructions(a_file):
        with pytest.raises(NotADirectoryError) as err:
            build()
        assert err.value.errno == errno.ENOTDIR and err.value.filename == str(a_file)


def test_a_read_only_spill_dir_is_named_at_construction(read_only_dir):
    for build in constructions(read_only_dir):
        with pytest.raises(PermissionError) as err:
            build()
        assert err.value.filename == str(read_only_dir) and "not writable" in str(err.value)
    assert os.listdir(read_only_dir) == []


def test_a_spill_dir_removed_after_construction_is_named_when_paging(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    ctx = compress_saved(Policy(bits=None, min_bytes=0), budget=0, spill_dir=str(gone))
    gone.rmdir()
    x = torch.randn(64, 1024, requires_grad=True)
    with pytest.raises(FileNotFoundError) as err:
        with ctx:
            (x * 1.0).exp().sum()
    assert err.value.errno == errno.ENOENT and err.value.filename == str(gone)
    gone.mkdir()
    with ctx:
        loss = (x * 1.0).exp().sum()
    loss.backward()
    assert ctx.stats.spilled >= 1 and torch.equal(x.grad, (x * 1.0).exp())


# -- a full spill directory -----------------------------------------------------------------

def test_a_full_spill_dir_raises_enospc_naming_it_from_compress_saved(small_tmpfs):
    x = torch.randn(256, 1024, requires_grad=True)  # 1 MiB a save; two saves (sin reads exp's)
    ctx = compress_saved(Policy(bits=None, min_bytes=0), budget=0, spill_dir=str(small_tmpfs))
    filler = fill(small_tmpfs, leave=1536 * 1024)
    with pytest.raises(OSError) as err:
        with ctx:
            (x * 1.0).exp().sin().cos().sum()
    e = err.value
    assert e.errno == errno.ENOSPC and e.filename == str(small_tmpfs), e
    assert re.search(r"wrote \d+ of \d+ bytes", str(e)), e
    assert x.grad is None
    del e, err
    gc.collect()
    filler.unlink()
    with ctx:
        loss = (x * 1.0).exp().sin().cos().sum()
    loss.backward()
    y = x.detach().clone().requires_grad_()
    y.exp().sin().cos().sum().backward()
    assert ctx.stats.spilled >= 2 and torch.equal(x.grad, y.grad)


def test_a_full_spill_dir_raises_enospc_from_step_and_the_next_step_runs(small_tmpfs, tmp_path):
    batch = data(96)
    # what the paged plan writes, measured in a directory with room
    probe = act.Step(net(width=128), loss_fn=mse, spill_dir=str(tmp_path),
                     plan={"micro_batches": 1, "storage": "paged"})
    probe(batch)
    paged = probe._contexts["paged"].stats.spilled_bytes
    assert paged > MiB

    m = net(width=128)
    for p in m.parameters():
        p.grad = torch.full_like(p, 0.5)  # what the loop's earlier steps left there
    with pytest.warns(RuntimeWarning, match="memory-backed"):
        step = act.Step(m, loss_fn=mse, spill_dir=str(small_tmpfs),
                        plan={"micro_batches": 1, "storage": "paged"})
    before = snapshot(m)
    filler = fill(small_tmpfs, leave=paged // 2)
    with pytest.raises(OSError) as err:
        step(batch)
    e = err.value
    assert e.errno == errno.ENOSPC and e.filename == str(small_tmpfs), e
    assert same(snapshot(m), before)  # .grad and the model as they were
    del e, err  # as a loop that skips the batch would: its traceback held the saves
    gc.collect()
    filler.unlink()
    step(batch)  # room again: the same Step runs
    want = plain_grads(batch, width=128)
    assert all(torch.allclose(p.grad, g + 0.5, rtol=1e-5, atol=1e-6)
               for p, g in zip(m.parameters(), want))


# -- a limit changed from a real second thread ----------------------------------------------

class Stepping:
    """A budget step (pinned plan: one micro-batch, saves under a saved-bytes budget) whose
    forward stops after its second block until a second thread, a real one that runs
    alongside, has changed the limit `changes(step, planned_budget)` times."""

    def __init__(self, spill_dir, width=128):
        self.floor = resident.live()
        self.planned = self.floor + 1024 * MiB
        self.model = net(width=width)
        self.step = act.Step(self.model, limit=self.planned, loss_fn=mse, spill_dir=spill_dir,
                             plan={"micro_batches": 1, "storage": "budget"})
        self.in_forward, self.changed = threading.Event(), threading.Event()
        self.budgets: list = []  # the in-flight budget each forward saw before the changes
        self.model.layers[1].register_forward_hook(self._pause)

    def _pause(self, module, args, out):
        self.budgets.append(self.step._in_flight.budget)
        self.in_forward.set()
        assert self.changed.wait(WAIT), "the second thread did not change the limit"
        self.changed.clear()

    def alongside(self, steps: int, changes):
        """Starts the second thread: at each of `steps` forwards it runs changes(step,
        planned budget). Returns (thread, errors raised in it)."""
        errors = []

        def run():
            try:
                for _ in range(steps):
                    assert self.in_forward.wait(WAIT), "the step did not reach its forward"
                    self.in_forward.clear()
                    try:
                        changes(self.step, self.budgets[-1])
                    finally:
                        self.changed.set()
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)
                self.changed.set()

        thread = threading.Thread(target=run, name="sets the limit")
        thread.start()
        return thread, errors


def _in_step(stepping, value, planned_budget):
    """The limit is what was set, and the running step's budget follows it at once:
    the plan's budget less how far the limit is below the one the step was planned for."""
    step = stepping.step
    assert step.limit == value
    assert step._in_flight.budget == max(0, planned_budget - max(0, stepping.planned - value))


def test_a_limit_lowered_from_a_second_thread_pages_out_in_the_stepping_thread(
        tmp_path, monkeypatch):
    stepping = Stepping(str(tmp_path))
    batch = data(256)
    cuts = (100 * MiB, 600 * MiB, 1023 * MiB)  # the last leaves the step's budget at 0

    def lower(step, planned_budget):
        for cut in cuts:
            step.limit = stepping.planned - cut  # only recorded: no paging in this thread
            _in_step(stepping, stepping.planned - cut, planned_budget)

    setter, errors = stepping.alongside(3, lower)
    written = []
    real = os.pwrite

    def full_on_the_second_step(fd, data_, offset):
        written.append(threading.current_thread().name)
        if len(stepping.budgets) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data_, offset)

    monkeypatch.setattr(os, "pwrite", full_on_the_second_step)
    try:
        ctx = None
        for i in range(3):
            before = snapshot(stepping.model)
            stepping.step.limit = stepping.planned  # back to the plan between steps
            if i == 1:
                with pytest.raises(OSError) as err:
                    stepping.step(batch)
                assert err.value.errno == errno.ENOSPC
                assert err.value.filename == str(tmp_path)
                assert same(snapshot(stepping.model), before)
            else:
                stepping.step(batch)
            ctx = stepping.step._contexts["budget"]
            assert ctx.budget == 0 and stepping.step.limit == stepping.planned - cuts[-1]
            assert stepping.step._in_flight is None
    finally:
        setter.join(WAIT)
    assert not setter.is_alive(), "the second thread is stuck"
    assert not errors, errors  # nothing was raised in the thread that set the limit
    assert written and set(written) == {threading.main_thread().name}
    assert ctx.stats.spilled > 0
    # two steps ran, .grad holds both
    want = plain_grads(batch, width=128)
    got = torch.cat([p.grad.flatten() for p in stepping.model.parameters()])
    assert F.cosine_similarity(got, torch.cat([2 * g.flatten() for g in want]), dim=0) > 0.999


def test_raising_and_restoring_the_limit_mid_step_keeps_the_plans_budget(tmp_path):
    stepping = Stepping(str(tmp_path))
    planned = stepping.planned

    def moves(step, planned_budget):
        for value in (planned + 500 * MiB, planned, planned - 100 * MiB, planned + 500 * MiB,
                      planned - 300 * MiB, planned):
            step.limit = value
            _in_step(stepping, value, planned_budget)
        step.limit = None  # no limit: the plan's budget
        assert step._in_flight.budget == planned_budget

    setter, errors = stepping.alongside(1, moves)
    try:
        stepping.step(data(64))
    finally:
        setter.join(WAIT)
    assert not setter.is_alive() and not errors, errors
    assert stepping.budgets[0] > 500 * MiB
    assert stepping.step._contexts["budget"].budget == stepping.budgets[0]
    assert stepping.step.limit is None
