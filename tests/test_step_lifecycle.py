"""actcodec.torch.Step leaves no lasting change on the model: recomputation through removable
hooks that deepcopy, pickle and torch.save see through (a copy computes with its own
weights), close() and the context manager, the allocator only under a limit; and what a step
reads anew each time: the model's training mode, a pinned plan held against the limit."""
import copy
import gc
import io
import pickle
import threading

import pytest
import torch
from torch import nn
import torch.nn.functional as F

import actcodec.torch as act
from actcodec import resident
from actcodec.torch.limit import blocks
from actcodec.torch.save import allocator as allocators

MiB = 1 << 20


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 4 * width), \
            nn.Linear(4 * width, width)

    def forward(self, x, scale=1.0):
        return x + scale * self.down(F.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, width=16, depth=3, batchnorm=False, again=False):
        super().__init__()
        self.stem = nn.Linear(8, width)
        self.bn = nn.BatchNorm1d(width) if batchnorm else nn.Identity()
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)
        self.again = again  # the first block runs twice in each forward

    def forward(self, x):
        h = self.bn(self.stem(x))
        for layer in self.layers:
            h = layer(h, scale=0.5)  # a keyword argument reaches the recomputation too
        if self.again:
            h = self.layers[0](h, scale=0.5)
        return self.head(h).squeeze(-1)


def net(seed=0, **kw):
    torch.manual_seed(seed)
    return Net(**kw)


def mse(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


def data(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randn(n, generator=g)


def grads(m):
    return [p.grad.clone() for p in m.parameters()]


def plain_grads(m, batch):
    ref = copy.deepcopy(m)
    ref.zero_grad(set_to_none=True)
    mse(ref, batch).backward()
    return grads(ref)


def close(a, b):
    return len(a) == len(b) and all(torch.allclose(x, y, rtol=1e-5, atol=1e-6)
                                    for x, y in zip(a, b))


def hook_state(model):
    """Per module: its own attributes and the keys of its forward hook dicts."""
    out = {}
    for name, m in model.named_modules():
        out[name] = (sorted(vars(m)), *(tuple(getattr(m, d)) for d in (
            "_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
            "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")))
    return out


class Calls:
    """Counts the calls of the first block's `up` (a recomputed block runs it again in
    backward)."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.layers[0].up.register_forward_hook(self.count)

    def count(self, *_):
        self.n += 1


RECOMPUTE = {"micro_batches": 1, "recompute": [0, 1, 2]}


def perturbed(m):
    """The copy's weights changed, and an independent model with those weights."""
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1)
    twin = net()
    twin.load_state_dict(m.state_dict())
    return twin


def assert_computes_with_its_own_weights(copied, batch):
    twin = perturbed(copied)
    copied.zero_grad(set_to_none=True)
    out = copied(batch[0])
    assert torch.equal(out, twin(batch[0]))
    F.mse_loss(out, batch[1]).backward()
    assert close(grads(copied), plain_grads(twin, batch))


# -- a copy computes with its own weights -------------------------------------------------------

def test_a_deepcopy_made_while_the_step_holds_the_model_computes_with_its_own_weights():
    batch = data()
    m = net()
    step = act.Step(m, loss_fn=mse, plan=RECOMPUTE)
    step(batch)
    copied = copy.deepcopy(m)
    assert_computes_with_its_own_weights(copied, batch)
    # the copy never recomputes for this Step, nor does the original change with it
    calls = Calls(copied)
    m.zero_grad(set_to_none=True)
    with blocks.running(blocks.Running(recompute=(0, 1, 2))):
        mse(copied, batch).backward()
    assert calls.n == 1
    step(batch)
    assert close(grads(m), plain_grads(net(), batch))


def test_a_deepcopy_made_inside_a_step_computes_with_its_own_weights():
    batch = data()
    m = net()
    copies = []

    def loss_fn(model, b):
        if not copies:
            copies.append(copy.deepcopy(model))  # an EMA or teacher copy, mid-step
        return mse(model, b)

    act.Step(m, loss_fn=loss_fn, plan=RECOMPUTE)(batch)
    assert close(grads(m), plain_grads(net(), batch))
    assert_computes_with_its_own_weights(copies[0], batch)


def test_a_deepcopy_made_after_close_computes_with_its_own_weights_and_carries_no_hooks():
    batch = data()
    m = net()
    before = hook_state(m)
    with act.Step(m, loss_fn=mse, plan=RECOMPUTE) as step:
        step(batch)
    copied = copy.deepcopy(m)
    assert hook_state(copied) == before
    assert_computes_with_its_own_weights(copied, batch)


def test_averaged_model_of_a_stepped_model_averages_its_own_copy():
    batch = data()
    m = net()
    step = act.Step(m, loss_fn=mse, plan=RECOMPUTE)
    ema = torch.optim.swa_utils.AveragedModel(m)  # a deepcopy of the stepped model
    step(batch)
    ema.update_parameters(m)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.02)
    ema.update_parameters(m)  # the average of the two: the first weights plus 0.01
    want = net()
    with torch.no_grad():
        for p in want.parameters():
            p.add_(0.01)
    assert torch.allclose(ema(batch[0]), want(batch[0]), rtol=1e-5, atol=1e-6)


# -- pickle and torch.save ----------------------------------------------------------------------

def test_pickle_and_torch_save_round_trip_a_stepped_model():
    batch = data()
    m = net()
    keys = list(m.state_dict())
    step = act.Step(m, loss_fn=mse, plan=RECOMPUTE)
    step(batch)
    assert list(m.state_dict()) == keys
    buffer = io.BytesIO()
    torch.save(m, buffer)
    buffer.seek(0)
    loaded = [pickle.loads(pickle.dumps(m)), torch.load(buffer, weights_only=False)]
    for other in loaded:
        assert list(other.state_dict()) == keys
        assert torch.equal(other(batch[0]), m(batch[0]))
        assert_computes_with_its_own_weights(other, batch)
    # a Step on a loaded copy takes the inert hooks it brought off, and recomputes
    other = loaded[0]
    calls = Calls(other)
    with act.Step(other, loss_fn=mse, plan=RECOMPUTE) as again:
        again(batch)
        assert calls.n == 2
    calls.handle.remove()
    assert all(not b._forward_pre_hooks and not b._forward_hooks for b in other.layers)


def test_a_transformers_model_under_planned_recomputation_saves_loads_and_copies(tmp_path):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=64,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    gpt = tf.GPT2LMHeadModel(cfg)
    keys = list(gpt.state_dict())
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "labels": ids}
    want = copy.deepcopy(gpt)
    want(**batch).loss.backward()
    step = act.Step(gpt, plan={"micro_batches": 1, "recompute": [0, 1]})
    calls = [0]
    counting = gpt.transformer.h[0].mlp.register_forward_pre_hook(
        lambda *_: calls.__setitem__(0, calls[0] + 1))
    step(batch)
    counting.remove()
    assert calls[0] == 2  # recomputed in backward
    assert close(grads(gpt), grads(want))
    assert list(gpt.state_dict()) == keys
    torch.save(gpt, tmp_path / "gpt.pt")
    loaded = torch.load(tmp_path / "gpt.pt", weights_only=False)
    copied = copy.deepcopy(gpt)
    for other in (loaded, copied, pickle.loads(pickle.dumps(gpt))):
        assert list(other.state_dict()) == keys
        with torch.no_grad():
            assert torch.equal(other(**batch).logits, gpt(**batch).logits)
            for p in other.transformer.h.parameters():  # the blocks' weights alone
                p.mul_(0.5)
            twin = tf.GPT2LMHeadModel(cfg)
            twin.load_state_dict(other.state_dict())
            assert torch.allclose(other(**batch).logits, twin(**batch).logits, atol=1e-6)
    step.close()


# -- close() and the context manager -----------------------------------------------------------

def test_close_leaves_the_model_as_it_was():
    batch = data()
    m = net()
    before = hook_state(m)
    forwards = [type(b).forward for b in m.layers]
    step = act.Step(m, loss_fn=mse, plan=RECOMPUTE)
    step(batch)
    step.close()
    assert hook_state(m) == before
    assert all("forward" not in vars(b) for b in m.modules())
    assert [type(b).forward for b in m.layers] == forwards
    step.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        step(batch)
    calls = Calls(m)
    mse(m, batch).backward()
    assert calls.n == 1  # nothing recomputes any more


def test_close_closes_the_file_a_paged_plan_wrote_to(tmp_path):
    """A plan that pages its saves out opens a file in spill_dir; close() closes it (it was
    left open until the Step was collected, a ResourceWarning then)."""
    step = act.Step(net(), loss_fn=mse, plan={"micro_batches": 1, "storage": "paged"},
                    spill_dir=str(tmp_path))
    step(data(n=4096))  # saves of 1 MiB: paged (a small one stays where it is)
    spills = [ctx.limit.keeper.spill for ctx in step._contexts.values()
              if getattr(ctx, "limit", None) is not None]
    assert spills and any(s.file is not None for s in spills)
    step.close()
    assert all(s.file is None for s in spills)


def test_the_context_manager_closes_and_a_lost_step_takes_its_hooks_with_it():
    batch = data()
    m = net()
    before = hook_state(m)
    with act.Step(m, loss_fn=mse, plan=RECOMPUTE) as step:
        assert hook_state(m) != before
        step(batch)
    assert hook_state(m) == before
    with pytest.raises(RuntimeError, match="closed"):
        step(batch)
    step = act.Step(m, loss_fn=mse, plan=RECOMPUTE)
    step.cycle = step  # only the cycle collector frees it
    del step
    gc.collect()
    assert hook_state(m) == before


def test_close_during_a_step_is_refused():
    m = net()
    errors = []

    def loss_fn(model, b):
        try:
            step.close()
        except RuntimeError as exc:
            errors.append(exc)
        return mse(model, b)

    step = act.Step(m, loss_fn=loss_fn, plan=RECOMPUTE)
    step(data())
    assert errors and "while a step is running" in str(errors[0])
    step.close()


def test_two_steps_on_one_model_share_the_hooks_and_each_runs_its_plan():
    batch = data()
    m = net()
    before = hook_state(m)
    recomputing = act.Step(m, loss_fn=mse, plan=RECOMPUTE)
    plain = act.Step(m, loss_fn=mse, plan={"micro_batches": 2})
    calls = Calls(m)
    recomputing(batch)
    assert calls.n == 2
    plain(batch)
    assert calls.n == 2 + 2  # two micro-batches, no recomputation
    recomputing.close()
    m.zero_grad(set_to_none=True)
    plain(batch)
    assert close(grads(m), plain_grads(net(), batch))
    other = act.Step(m, loss_fn=mse, plan=RECOMPUTE)  # shares again
    calls.n = 0
    other(batch)
    assert calls.n == 2
    other.close()
    plain.close()
    calls.handle.remove()
    assert hook_state(m) == before


def test_a_step_over_another_set_of_blocks_of_a_stepped_model_is_refused():
    m = net()
    step = act.Step(m, loss_fn=mse)
    wider = nn.Sequential(m, Block(16))  # five blocks, four of them the first Step's
    with pytest.raises(ValueError, match="another Step"):
        act.Step(wider, loss_fn=lambda model, b: model(b).sum())
    step.close()
    act.Step(wider, loss_fn=lambda model, b: model(b).sum()).close()


# -- the blocks' hooks ---------------------------------------------------------------------------

def test_a_recomputed_block_gives_the_plain_gradients_called_twice_with_keywords():
    batch = data()
    m = net(again=True)
    want = plain_grads(m, batch)
    calls = Calls(m)
    act.Step(m, loss_fn=mse, plan={"micro_batches": 1, "recompute": [0]})(batch)
    assert calls.n == 4  # twice in forward, twice again in backward
    assert all(torch.equal(a, b) for a, b in zip(grads(m), want))


def test_blocks_run_plain_under_no_grad_and_in_another_thread():
    batch = data()
    m = net()
    calls = Calls(m)
    seen = {}

    def loss_fn(model, b):
        with torch.no_grad():
            model(b[0])
        seen["no_grad"] = calls.n
        # a thread of its own has no step context: a forward and backward there run plain
        t = threading.Thread(target=lambda: mse(model, b).backward())
        t.start()
        t.join()
        seen["thread"] = calls.n - seen["no_grad"]
        return mse(model, b)

    act.Step(m, loss_fn=loss_fn, plan=RECOMPUTE)(batch)
    assert seen == {"no_grad": 1, "thread": 1}
    assert calls.n == 1 + 1 + 2  # the step's own forward is recomputed


def test_an_exception_in_a_recomputed_block_leaves_no_checkpoint_open():
    batch = data()
    m = net()
    fail = [True]

    def broken(module, args, kwargs):
        if fail[0]:
            raise RuntimeError("block broke")

    handle = m.layers[1].down.register_forward_pre_hook(broken, with_kwargs=True)
    step = act.Step(m, loss_fn=mse, plan=RECOMPUTE)
    with pytest.raises(RuntimeError, match="block broke"):
        step(batch)
    fail[0] = False
    handle.remove()
    step(batch)  # the next step runs, with no region left open by the first
    assert close(grads(m), plain_grads(net(), batch))
    x = torch.randn(3, requires_grad=True)
    (x * x).sum().backward()  # outside: saves are kept as they are
    assert torch.equal(x.grad, 2 * x.detach())


# -- the allocator only under a limit -----------------------------------------------------------

def test_the_allocator_is_installed_only_by_a_step_under_a_limit(monkeypatch):
    ensured = []
    monkeypatch.setattr(allocators, "ensure", lambda: ensured.append(1) or True)
    batch = data()
    step = act.Step(net(), loss_fn=mse, plan={"micro_batches": 2, "storage": "lossless"})
    step(batch)
    assert ensured == []
    act.Step(net(), limit=resident.rss() + 1024 * MiB, loss_fn=mse, allocator=False)(batch)
    assert ensured == []
    act.Step(net(), limit=resident.rss() + 1024 * MiB, loss_fn=mse)(batch)
    assert ensured


# -- the training mode, read at every step ------------------------------------------------------

def test_batch_norm_switched_to_training_after_an_eval_step_runs_one_micro_batch():
    from actcodec.torch.limit.planning import SAFETY, SAFETY_BYTES

    batch = data(1024)
    m = net(width=128, depth=4, batchnorm=True)
    m.eval()
    allocators.ensure()
    step = act.Step(m, limit=resident.live() + 1024 * MiB, loss_fn=mse)
    step(batch)  # profiled, in eval mode; the whole batch at once
    added = step.stats.peak - step.stats.floor
    for share in (0.8, 0.7, 0.6, 0.5, 0.4, 0.35):  # tighter until the plan in eval mode
        step.limit = step.stats.floor + int((SAFETY_BYTES + share * added) / (1 - SAFETY))
        try:  # splits the batch (a process whose heap drifted may refuse a share)
            step(batch)
        except act.MemoryLimitError:
            continue
        if step.stats.micro_batches > 1:
            break  # (where the process's heap lets a plan split it: the solver's own test,
            # test_the_solver_takes_no_measured_micro_batch_count..., needs no such luck)
    m.train()
    for _ in range(2):
        try:
            step(batch)
        except act.MemoryLimitError as exc:
            assert "needs about" in str(exc)
            continue
        assert step.stats.micro_batches == 1


def test_the_solver_takes_no_measured_micro_batch_count_where_micro_batches_are_not_allowed():
    from actcodec.torch.limit import limit_plan as lp

    profile = lp.Profile(batch=8, fixed=1e6, work=1e5, rest=1e5, split=True)
    four = lp.predict(profile, 4, (), lp.PLAIN)
    measured = lp.Measured(caution=0.25).learn(lp.memory_key(profile, 4, (), "plain"),
                                               four.peak, four.peak)
    assert lp.solve(profile, four.peak, measured=measured).micro_batches == 4
    training = lp.Profile(**{**vars(profile), "split": False})
    assert lp.solve(training, four.peak, measured=measured) is None
    assert lp.solve(training, 1e12, measured=measured).micro_batches == 1


def test_a_plan_of_micro_batches_run_in_eval_mode_is_not_kept_once_batch_norm_trains():
    from actcodec.torch.limit import limit_plan as lp
    from actcodec.torch.limit import planning

    block = lp.Block(saved=4e5, inputs=1e4, forward=1e-3)
    profile = lp.Profile(batch=8, fixed=1e6, work=1e5, rest=1e5, blocks=(block,) * 2,
                         seconds=1e-2, per_micro_batch=1e-4, storages=(lp.PLAIN,),
                         split=True, effect=1.0, least=0.0)
    ran = lp.predict(profile, 4, (), lp.PLAIN)  # run in eval mode, measured
    key = lp.memory_key(profile, 4, (), "plain")
    measured = lp.Measured(caution=0.25).learn(key, ran.peak, ran.peak)
    one = lp.predict(profile, 1, (0, 1), lp.PLAIN)  # hardly faster: stays, in eval mode
    assert planning.stay(one, ran, profile, 1e9, measured) == ran
    training = lp.Profile(**{**vars(profile), "split": False})
    assert planning.stay(one, ran, training, 1e9, measured) == one


def test_a_pinned_plan_of_micro_batches_is_refused_where_batch_norm_trains():
    m = net(batchnorm=True)
    with pytest.raises(ValueError, match="ghost_batchnorm"):
        act.Step(m, loss_fn=mse, plan={"micro_batches": 3})(data())
    act.Step(m, loss_fn=mse, plan={"micro_batches": 3}, ghost_batchnorm=True)(data())
    m.eval()
    act.Step(m, loss_fn=mse, plan={"micro_batches": 3})(data())


# -- a pinned plan against the limit ------------------------------------------------------------

def test_a_pinned_plan_above_the_limit_raises_and_leaves_grad_as_it_was():
    batch = data(4096)
    m = net(width=256, depth=4)
    for p in m.parameters():
        p.grad = torch.full_like(p, 0.5)
    before = grads(m)
    step = act.Step(m, limit="1MiB", loss_fn=mse, plan={"micro_batches": 1})
    with pytest.raises(act.MemoryLimitError, match="pinned plan"):
        step(batch)
    assert all(torch.equal(a, b) for a, b in zip(grads(m), before))
    # room above the floor, but far less than the step adds (about 170 MiB)
    step.limit = resident.live() + 8 * MiB
    with pytest.raises(act.MemoryLimitError, match="peaked at") as err:
        step(batch)
    assert err.value.needed > step.limit
    assert all(torch.equal(a, b) for a, b in zip(grads(m), before))
    step.limit = None  # what the error says to do: the pinned plan runs
    step(batch)
    want = plain_grads(net(width=256, depth=4), batch)
    assert close(grads(m), [w + 0.5 for w in want])


def test_a_refusal_from_a_profile_scaled_up_says_its_number_is_an_upper_bound():
    """Images 16 times the size of any probed: the profile so far, scaled up (an upper
    bound, at the square of the growth), predicts their probe would not fit this room, so
    they are refused unprobed; the limit named then is one that fits, not the smallest, and
    the message says so (a BERT's 2 x 512 after 8 x 256 was named 1219 MiB where, probed, it
    names 852). (At 64 times, the small probes' few MiB scaled 4096-fold: in a long test
    process whose heap moved them, the one-sample probe was predicted above a room of 2 GiB.)"""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))

    def loss_fn(m, b):
        return F.cross_entropy(m(b[0]), b[1])

    small = (torch.randn(8, 3, 32, 32), torch.randint(0, 4, (8,)))
    large = (torch.randn(8, 3, 128, 128), torch.randint(0, 4, (8,)))
    step = act.Step(model, limit=resident.live() + 1024 * MiB, loss_fn=loss_fn)
    step(small)
    assert "or less" not in step.describe()
    step.limit = step.stats.floor + 16 * MiB
    with pytest.raises(act.MemoryLimitError, match=r"needs about \d+ MiB in all, or less "
                                                   r"\(from the profile of smaller samples"):
        step(large)
    step.limit = step.stats.floor + 2048 * MiB  # probed at that size: a measured number
    step(large)
    step.limit = step.stats.floor + 1 * MiB
    with pytest.raises(act.MemoryLimitError) as refused:
        step(large)
    assert "or less" not in str(refused.value)
