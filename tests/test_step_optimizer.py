"""The optimizer's step after a training step: its gradients and temporaries are planned with
the step (a limit the training step would meet but `opt.step()` would not is refused at the
first step, naming the optimizer), and what it needs is in `smallest_limit()`."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import actcodec.torch as act  # noqa: E402
from actcodec import resident  # noqa: E402
from actcodec.torch.limit import optimizer_state  # noqa: E402

MiB = 2**20


def _params(*sizes):
    return [nn.Parameter(torch.zeros(n)) for n in sizes]


@pytest.mark.parametrize("make,temporaries", [
    (lambda ps: torch.optim.SGD(ps, lr=0.1), 0),
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), 2 * 4000),
    (lambda ps: torch.optim.AdamW(ps), 2 * 4000),
    (lambda ps: torch.optim.AdamW(ps, foreach=True), 4000 + 400),
    (lambda ps: torch.optim.AdamW(ps, fused=True), 0),
])
def test_gradients_and_temporaries_by_kind(make, temporaries):
    ps = _params(1000, 100)
    assert optimizer_state.step_parts(make(ps)) == (4400, temporaries)
    ps[0].grad = torch.zeros(1000)  # a gradient that exists is in the floor
    assert optimizer_state.step_parts(make(ps))[0] == 400
    assert optimizer_state.step_parts(None) == (0, 0)


def test_foreach_by_default_where_torch_runs_it(monkeypatch):
    """AdamW without foreach= runs foreach where torch.optim defaults to it (CUDA): one
    temporary per parameter at once, not two of the largest."""
    assert "cuda" in optimizer_state.foreach_devices()
    assert "cpu" not in optimizer_state.foreach_devices()
    ps = _params(1000, 100)
    monkeypatch.setattr(optimizer_state, "foreach_devices", lambda: ("cpu",))
    assert optimizer_state.step_parts(torch.optim.AdamW(ps)) == (4400, 4000 + 400)
    assert optimizer_state.step_parts(torch.optim.AdamW(ps, foreach=False)) == (4400, 2 * 4000)
    assert optimizer_state.step_parts(torch.optim.AdamW(ps, fused=True)) == (4400, 0)
    # fused=False alone: torch's default applies only where neither is set
    assert optimizer_state.step_parts(torch.optim.AdamW(ps, fused=False)) == (4400, 2 * 4000)
    assert optimizer_state.step_parts(
        torch.optim.AdamW(ps, lr=torch.tensor(1e-3))) == (4400, 2 * 4000)


def _wide():
    """One wide layer: the training step holds its weight's gradient (128 MiB) and a few KiB
    of activations; the optimizer's step (single-tensor AdamW) its gradient and two
    temporaries of its size on top of the state."""
    return nn.Sequential(nn.Linear(4096, 8192, bias=False), nn.Linear(8192, 4))


def _loss(model, batch):
    return model(batch).square().mean()


def test_a_limit_the_optimizer_step_would_cross_is_refused():
    """A limit the training step meets (by what the step measured) but the optimizer's step
    would not: refused before the step, naming the optimizer and the limit that holds."""
    torch.manual_seed(0)
    model = _wide()
    opt = torch.optim.AdamW(model.parameters())
    batch = torch.randn(8, 4096)
    step = act.Step(model, limit=resident.rss() + (4 << 30), loss_fn=_loss, optimizer=opt)
    step(batch)
    opt.step()  # the state exists from here: in the floor
    opt.zero_grad(set_to_none=True)
    grads, temporaries = optimizer_state.step_parts(opt)
    assert temporaries >= 2 * 128 * MiB
    floor = resident.live()
    training = step._planning.needed(floor)  # what the measured step alone asks for
    tight = training + 32 * MiB
    assert tight < floor + grads + temporaries, (tight - floor) / MiB
    step.limit = tight
    with pytest.raises(act.MemoryLimitError, match="optimizer's step") as err:
        step(batch)
    assert err.value.needed >= floor + grads + temporaries
    assert all(p.grad is None for p in model.parameters())
    assert step.smallest_limit() >= floor + grads + temporaries
    # what it names is for another process too (its floor and probes differ a little): more
    # than this Step's smallest, by planning.NAMED_BYTES at least
    smallest = step.smallest_limit()
    assert err.value.needed >= smallest + 4 * MiB - MiB  # (the floor moved since)
    assert f"about {-(-err.value.needed // MiB)} MiB" in str(err.value)
    step.limit = err.value.needed + 64 * MiB
    step(batch)
    opt.step()
