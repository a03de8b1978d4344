"""Importance from backward (actcodec.torch.budget.sensitivity): a profile step measures, per save,
how its compression error reaches the parameters' gradients. The estimate is checked against
the gradient error measured by quantizing one save at a time, against the closed form for a
linear layer, and profiling never changes what backward computes."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the torch extra; CI installs it
nn = torch.nn

from actcodec.torch import Policy, compress_saved  # noqa: E402
from actcodec.torch.budget import budget as budgets  # noqa: E402
from actcodec.torch.budget import guard as guards  # noqa: E402
from actcodec.torch.budget import planner  # noqa: E402
from actcodec.torch.budget import sensitivity  # noqa: E402

from test_torch_hooks import MODELS, Block, cnn, grads  # noqa: E402

HUGE = 1 << 40  # a budget that plans every save and never makes room


def _per_parameter(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("make,inputs", MODELS, ids=["cnn", "transformer"])
def test_a_profile_step_leaves_gradients_bit_identical(make, inputs):
    model, x = make(), inputs()
    exact = grads(model, x)
    ctx = compress_saved(Policy(bits=None, min_bytes=0), budget=HUGE)
    for _ in range(2):  # the first step profiles, the second takes in what it measured
        assert torch.equal(grads(model, x, ctx), exact)
    gains = ctx.limit.gains
    assert gains and all(0 <= p <= g for g, p in gains.values())
    # a weight gradient reads every linear, conv and norm input; a ReLU output that only
    # ReLU's backward (its signs) and max-pool's (its indices) read moves no gradient
    assert all(g > 0 for k, (g, _) in gains.items() if k[0] in ("linear", "conv", "layer_norm"))
    assert all(g == 0 for k, (g, _) in gains.items() if k[0] == "relu") or make is Block
    assert ctx.stats.stored_bytes == 0  # the probe keeps no save past backward


def test_a_linear_layers_gain_is_the_closed_form():
    """For y = x W^T and noise e of one variance per element, the weight gradient's error
    G^T e has E|G^T e|^2 = |G|^2 |e|^2 / n (n rows): the gain (its energy relative to |G^T x|^2,
    per unit of |e|^2 / |x|^2) is |G|^2 |x|^2 / (n |G^T x|^2). Rows of x that are permutations
    of one vector give every group the same range, so the probe's noise has one variance."""
    torch.manual_seed(0)
    n, d_in, d_out = 512, 256, 32
    base = torch.linspace(-1.0, 1.0, d_in)
    x = torch.stack([base[torch.randperm(d_in)] for _ in range(n)])
    lin = nn.Linear(d_in, d_out)
    r = torch.randn(n, d_out)
    ctx = compress_saved(Policy(bits=None, min_bytes=0), budget=HUGE)
    for _ in range(2):
        with ctx:
            loss = (lin(x) * r).sum()
        loss.backward()
    g = r  # the incoming gradient
    expected = float(g.square().sum() * x.square().sum() / (n * (g.T @ x).square().sum()))
    (gain, peak), = ctx.limit.gains.values()
    assert gain == pytest.approx(expected, rel=0.05)
    assert peak == gain  # one parameter reached


def _site_alone(model, x, ctx, target, bits):
    """The gradient with only `target` stored at `bits` (groups of 64), every other save
    lossless."""
    original = budgets.planner.plan
    budgets.planner.plan = lambda sites, room: {s: ((bits, 64) if s == target else None)
                                                for s in sites}
    try:
        ctx.limit.planned_for = None
        grads(model, x, ctx)
    finally:
        budgets.planner.plan = original
    return _per_parameter(model)


@pytest.mark.parametrize("make,inputs", MODELS, ids=["cnn", "transformer"])
def test_the_gain_predicts_the_gradient_error_of_each_save(make, inputs):
    """Each save quantized alone at 2 bits: the sum over parameters of each one's relative
    error energy, against the gain times the noise model's relative noise at 2 bits."""
    model, x = make(), inputs()
    grads(model, x)
    exact = _per_parameter(model)
    ctx = compress_saved(Policy(bits=None, min_bytes=0), budget=HUGE)
    grads(model, x, ctx)
    grads(model, x, ctx)
    measured, predicted = [], []
    for key, site in list(ctx.limit.sites.items()):
        got = _site_alone(model, x, ctx, key, 2)
        measured.append(sum(float((got[n] - g).square().sum() / g.square().sum())
                            for n, g in exact.items() if g.square().sum() > 0))
        predicted.append(site.error((2, 64)))
    measured, predicted = np.array(measured), np.array(predicted)
    big = measured > 1e-3 * measured.max()  # saves whose error is not lost in rounding
    ratio = predicted[big] / measured[big]
    assert big.sum() >= 3
    assert 0.33 < float(np.median(ratio)) < 3.0
    ranks = [np.argsort(np.argsort(v)) for v in (measured[big], predicted[big])]
    assert np.corrcoef(*ranks)[0, 1] > 0.7


def test_a_node_that_cannot_be_called_again_is_left_unmeasured():
    class Once(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            ctx.used = False
            return x.sin()

        @staticmethod
        def backward(ctx, g):
            if ctx.used:
                raise RuntimeError("called twice")
            ctx.used = True
            x, = ctx.saved_tensors
            return g * x.cos()

    torch.manual_seed(0)
    lin = nn.Linear(64, 64)
    x = torch.randn(128, 64)
    ctx = compress_saved(Policy(bits=None, min_bytes=0), budget=HUGE)
    for _ in range(2):
        lin.zero_grad()
        with ctx:
            loss = Once.apply(lin(x)).sum()
        loss.backward()
    expected = lin.weight.grad.clone()
    lin.zero_grad()
    Once.apply(lin(x)).sum().backward()
    assert torch.equal(lin.weight.grad, expected)
    assert ctx.limit.gains  # the linear layer's input was measured all the same


def test_perturbed_keeps_signs_where_asked_and_reports_its_noise():
    torch.manual_seed(0)
    t = torch.relu(torch.randn(64, 64))
    moved, noise = sensitivity.perturbed(t, 7, keep_signs=True)
    assert torch.equal(moved == 0, t == 0) and (moved[t > 0] > 0).all()
    assert noise == pytest.approx(float((moved - t).square().sum() / t.square().sum()))
    same, zero = sensitivity.perturbed(torch.zeros(128), 7, keep_signs=False)
    assert zero == 0 and torch.equal(same, torch.zeros(128))
    inf = torch.full((128,), math.inf)
    assert sensitivity.perturbed(inf, 7, keep_signs=False)[1] == 0


def test_the_budget_holds_the_worst_save_as_low_as_the_bytes_allow():
    """Under a budget, measured gains raise the saves that most move one parameter first."""
    model, x = Block(), torch.randn(4, 32, 64)
    ctx = compress_saved(Policy(bits=8, min_bytes=0), budget=HUGE)
    grads(model, x, ctx)
    grads(model, x, ctx)
    sites = ctx.limit.sites
    fewest = sum(s.nbytes(s.ladder()[0]) for s in sites.values())
    plan = planner.plan(sites, int(fewest * 1.5))
    worst = max(sites[k].worst(c) for k, c in plan.items())
    greedy_only = planner._floors
    try:
        planner._floors = lambda s, ladders, budget: [0] * len(s)
        plain = planner.plan(sites, int(fewest * 1.5))
    finally:
        planner._floors = greedy_only
    assert worst <= max(sites[k].worst(c) for k, c in plain.items())


class Wiggle(nn.Module):
    """sin(1000 h): backward reads cos of the saved 1000 h, so an 8-bit error in it (a step
    of several radians) scrambles every gradient upstream."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 8)

    def forward(self, x):
        return self.b(torch.sin(1000.0 * self.a(x)))


def _cosine(a, b) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0))


def test_the_guard_stores_a_save_that_amplifies_its_error_lossless():
    model, x = Wiggle(), torch.randn(256, 64)
    exact = grads(model, x)
    ctx = compress_saved()  # the default: 8 bits, with the guard
    for _ in range(2):  # the first step, and the second: the profile step
        assert _cosine(grads(model, x, ctx), exact) < 0.9
    assert not ctx.guard.lossless
    second = grads(model, x, ctx)
    assert len(ctx.guard.lossless) == 1
    (site,) = ctx.guard.lossless
    assert site[0] == "other" and ctx.guard.errors[site] > 100 * min(ctx.guard.errors.values())
    assert _cosine(second, exact) > 0.9999
    off = compress_saved(guard=False)
    for _ in range(3):
        assert _cosine(grads(model, x, off), exact) < 0.9
    fresh = [grads(model, x, compress_saved()) for _ in range(3)]  # a context per step
    assert all(_cosine(g, exact) < 0.9 for g in fresh)  # never profiled, never guarded


def test_the_guard_leaves_a_well_behaved_model_as_the_policy_says():
    model, x = Block(), torch.randn(4, 32, 64)
    ctx = compress_saved()
    for _ in range(3):
        grads(model, x, ctx)
    assert ctx.guard.errors and not ctx.guard.lossless
    assert max(ctx.guard.errors.values()) < 0.1 * guards.GUARD


def test_the_guard_is_on_for_eight_bits_and_off_for_fewer_unless_told():
    assert compress_saved().guard is not None
    assert compress_saved(Policy.preset("8bit")).guard is not None
    assert compress_saved(Policy.preset("2bit")).guard is None
    assert compress_saved(Policy.preset("lossless")).guard is None
    assert compress_saved(bits=4, guard=True).guard is not None
    assert compress_saved(guard=False).guard is None


def _profile_steps(states, first=0):
    schedule = sensitivity.Schedule(first=first)
    steps = []
    for i, state in enumerate(states):
        schedule.new_step(state=state)
        if schedule.probe is not None:
            steps.append(i)
    return steps


def test_profiles_follow_what_the_model_saves():
    same = [{"a": 1.0, "b": 2.0}] * 1200
    assert _profile_steps(same) == [0, 500, 1000]  # nothing drifts: every PROFILE_EVERY
    # a drift of half of every site's noise at step 100: profiled at once
    moved = same[:100] + [{"a": 1.5, "b": 3.0}] * 1100
    assert _profile_steps(moved) == [0, 100, 600, 1100]
    # one site of three drifting is not the model changing (the median)
    one = same[:100] + [{"a": 9.0, "b": 2.0, "c": 5.0}] * 100
    assert _profile_steps([{**s, "c": 5.0} for s in same[:100]] + one) == [0]
    # drifts sooner than DRIFT_GAP after a profile wait for it; small ones never count
    early = same[:10] + [{"a": 2.0, "b": 4.0}] * 100
    assert _profile_steps(early) == [0, sensitivity.DRIFT_GAP]
    creep = [{"a": 1.0 + 0.2 * (i > 50), "b": 2.0} for i in range(400)]
    assert _profile_steps(creep) == [0]
    # the guard's schedule, told nothing of the saves, keeps the fixed cadence from step 1
    assert _profile_steps([None] * 600, first=1) == [1, 501]
