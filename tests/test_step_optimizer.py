"""The optimizer's step after a training step: its gradients and temporaries are planned with
the step (a limit the training step would meet but `opt.step()` would not is refused at the
first step, naming the optimizer), and what it needs is in `smallest_limit()`."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import actcodec.torch as act  # noqa: E402
from actcodec import resident  # noqa: E402
from actcodec.torch.limit import optimizer_state, step_profile  # noqa: E402

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


class _Lookup(nn.Module):
    """A large table and a small head: the training step's activations are a few KiB, the
    optimizer's step is three times the table."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(1 << 17, 128)  # 64 MiB
        self.head = nn.Linear(128, 8)

    def forward(self, x):
        return self.head(self.table(x))


def _loss(model, batch):
    return model(batch).square().mean()


def test_a_limit_the_optimizer_step_would_cross_is_refused_at_the_first_step():
    torch.manual_seed(0)
    model = _Lookup()
    opt = torch.optim.AdamW(model.parameters())
    batch = torch.randint(0, 1 << 17, (8,))
    state = optimizer_state.pending_bytes(opt)  # AdamW's moments, made at its first step
    grads, temporaries = optimizer_state.step_parts(opt)
    assert temporaries >= 2 * 64 * MiB
    tight = resident.rss() + state + 100 * MiB  # the step fits; the optimizer's does not
    step = act.Step(model, limit=tight, loss_fn=_loss, optimizer=opt)
    with pytest.raises(act.MemoryLimitError, match="optimizer's step") as err:
        step(batch)
    floor = step_profile.floor() + state
    assert err.value.needed >= floor + grads + temporaries
    assert all(p.grad is None for p in model.parameters())
    roomy = resident.rss() + state + grads + temporaries + 120 * MiB
    step = act.Step(model, limit=roomy, loss_fn=_loss, optimizer=opt)
    step(batch)
    opt.step()
    assert step.smallest_limit() >= step_profile.floor() + temporaries  # gradients: in the floor
