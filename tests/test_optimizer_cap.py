"""The optimizer's step after a Step under a limit, on a meter whose allocator can be capped
(CUDA's memory fraction): it runs under the cap, once per training step, instead of the
allocator's cache being emptied before it. Checked on the CPU with a meter that records its
cap; the process's own meter (no cap) keeps making room before the optimizer's step."""
import copy
import pickle

import pytest
import torch

import actcodec.torch as act
from actcodec.torch.limit import meter as meters
from actcodec.torch.limit import step as step_mod


class CappingMeter(meters.ProcessMeter):
    """The process's meter, with a cap it records: `log` has ("enter"|"exit", limit)."""

    can_cap = True

    def __init__(self, log):
        self.log = log

    def capped(self, limit):
        meter = self

        class Cap:
            def __enter__(self):
                meter.log.append(("enter", limit))

            def __exit__(self, *exc):
                meter.log.append(("exit", limit))

        return Cap()


class Recording(torch.optim.AdamW):
    """AdamW that notes whether its step ran under the cap."""

    def __init__(self, params, log):
        super().__init__(params)
        self.log, self.fail = log, False

    def step(self, closure=None):
        self.log.append("optimizer step")
        if self.fail:
            raise RuntimeError("the optimizer's step failed (stand-in)")
        return super().step(closure)


def assert_capped_step(opt, log, limit):
    """The optimizer's step, run now, under the cap of `limit` and nothing else."""
    log.clear()
    opt.step()
    assert log == [("enter", limit), "optimizer step", ("exit", limit)]


def assert_no_hooks(opt):
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks


def mse(m, b):
    return m(b).pow(2).mean()


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


@pytest.fixture
def capping(monkeypatch):
    log = []
    monkeypatch.setattr(meters, "meter_for", lambda m, cuda=None: CappingMeter(log))
    made_room = []
    monkeypatch.setattr(step_mod, "_room_for_the_optimizer",
                        lambda *args: made_room.append(args))
    return log, made_room


def test_the_optimizer_step_after_a_step_runs_under_the_cap_once(capping):
    log, made_room = capping
    m = model()
    opt = Recording(m.parameters(), log)
    x = torch.randn(16, 32)
    with act.Step(m, limit="4GiB", loss_fn=mse, optimizer=opt) as step:
        step(x)
        limit = step.stats.limit
        log.clear()
        opt.step()
        assert log == [("enter", limit), "optimizer step", ("exit", limit)]
        log.clear()
        opt.step()  # a second optimizer step without a training step: not capped
        assert log == ["optimizer step"]
        assert not made_room  # the cache was not emptied for it
    log.clear()
    opt.step()  # closed: the hooks are off
    assert log == ["optimizer step"]


def test_an_optimizer_step_that_raises_leaves_the_cap_until_the_next_step(capping):
    log, _ = capping
    m = model()
    opt = Recording(m.parameters(), log)
    x = torch.randn(16, 32)
    step = act.Step(m, limit="4GiB", loss_fn=mse, optimizer=opt)
    step(x)
    limit = step.stats.limit
    opt.fail = True
    log.clear()
    with pytest.raises(RuntimeError, match="stand-in"):
        opt.step()
    assert log == [("enter", limit), "optimizer step"]
    opt.fail = False
    log.clear()
    step(x)  # closes it first, then the step's own cap around the step
    assert log == [("exit", limit), ("enter", limit), ("exit", limit)]
    opt.step()
    assert log[-3:] == [("enter", limit), "optimizer step", ("exit", limit)]
    step(x)
    opt.fail = True
    with pytest.raises(RuntimeError):
        opt.step()  # capped, raised: open
    assert log[-2:] == [("enter", limit), "optimizer step"]
    step.close()  # closes it
    assert log[-1] == ("exit", limit)


def test_without_a_cap_the_step_makes_room_before_the_optimizer(monkeypatch):
    made_room = []
    monkeypatch.setattr(step_mod, "_room_for_the_optimizer",
                        lambda *args: made_room.append(args))
    m = model()
    opt = torch.optim.AdamW(m.parameters())
    step = act.Step(m, limit="4GiB", loss_fn=mse, optimizer=opt)
    step(torch.randn(16, 32))
    assert len(made_room) == 1
    step.close()


def test_an_optimizer_with_the_hooks_pickles_and_copies(capping):
    log, _ = capping
    m = model()
    opt = torch.optim.AdamW(m.parameters())
    step = act.Step(m, limit="4GiB", loss_fn=mse, optimizer=opt)
    step(torch.randn(16, 32))
    opt.step()
    state = pickle.loads(pickle.dumps(opt.state_dict()))
    copied = copy.deepcopy(opt)
    assert not copied._optimizer_step_pre_hooks and not copied._optimizer_step_post_hooks
    assert set(state) == {"state", "param_groups"}
    step.close()
    assert_no_hooks(opt)


def test_steps_sharing_an_optimizer_share_its_cap_and_the_last_step_arms_it(capping):
    log, _ = capping
    m = model()
    opt = Recording(m.parameters(), log)
    x = torch.randn(16, 32)
    a = act.Step(m, limit="1GiB", loss_fn=mse, optimizer=opt)
    b = act.Step(m, limit="4GiB", loss_fn=mse, optimizer=opt)
    assert a._optimizer_cap is b._optimizer_cap and len(opt._optimizer_step_pre_hooks) == 1
    a(x)
    b(x)  # disarms what a armed
    assert_capped_step(opt, log, 4 << 30)
    a.close()  # b still uses the hooks
    b(x)
    assert_capped_step(opt, log, 4 << 30)
    b.close()
    assert_no_hooks(opt)


def test_a_pinned_plan_under_a_limit_caps_the_optimizer_step_after_it(capping):
    log, _ = capping
    m = model()
    opt = Recording(m.parameters(), log)
    with act.Step(m, limit="4GiB", loss_fn=mse, optimizer=opt,
                  plan={"micro_batches": 1}) as step:
        step(torch.randn(16, 32))
        assert_capped_step(opt, log, 4 << 30)


def test_a_step_collected_inside_the_optimizers_hook_does_not_wait_for_itself(monkeypatch):
    # a Step in a reference cycle, finalized by the cyclic collector while the optimizer's
    # pre-hook holds the cap's lock in the same thread
    import gc

    log = []

    class Collecting(CappingMeter):
        def capped(self, limit):
            gc.collect()
            return super().capped(limit)

    monkeypatch.setattr(meters, "meter_for", lambda m, cuda=None: Collecting(log))
    monkeypatch.setattr(step_mod, "_room_for_the_optimizer", lambda *args: None)
    m = model()
    opt = torch.optim.AdamW(m.parameters())
    step = act.Step(m, limit="4GiB", loss_fn=mse, optimizer=opt)
    step(torch.randn(16, 32))
    step.cycle = step
    del step
    log.clear()
    # finishes (a thread, so that a lock waiting for itself fails the test, not hangs it):
    # the cap it entered is closed again, the hooks are off
    import threading
    worker = threading.Thread(target=opt.step, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "the optimizer's step waits for a lock its thread holds"
    assert log == [("enter", 4 << 30), ("exit", 4 << 30)]
    assert not opt._optimizer_step_pre_hooks
