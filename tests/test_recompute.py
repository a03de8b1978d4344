"""transformers' activations written as several ops are saved once under compress_saved (their
input) and run again in backward (actcodec.torch.save.recompute): bit-identical gradients
under a lossless policy, the output free to change in place, and left as they are where
the saves are not the session's (a checkpoint's region) or the module has hooks."""
import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

import actcodec.torch as act  # noqa: E402
from actcodec.torch.save.save import SaveSession  # noqa: E402
from transformers import activations  # noqa: E402

tf.logging.set_verbosity_error()

SEVERAL = ["gelu_new", "gelu_fast", "quick_gelu", "gelu_python", "gelu_python_tanh",
           "gelu_accurate", "gelu_10", "relu2"]


def gpt2(act_fn="gelu_new", layers=2):
    torch.manual_seed(0)
    return tf.GPT2LMHeadModel(tf.GPT2Config(
        n_layer=layers, n_embd=64, n_head=2, vocab_size=300, n_positions=64,
        activation_function=act_fn, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).train()


IDS = torch.randint(0, 300, (2, 48), generator=torch.Generator().manual_seed(1))


def grads(model, ctx=None, inside=False):
    model.zero_grad(set_to_none=True)
    if ctx is None:
        model(input_ids=IDS, labels=IDS).loss.backward()
    else:
        with ctx:
            loss = model(input_ids=IDS, labels=IDS).loss
            if inside:
                loss.backward()
        if not inside:
            loss.backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.fixture(autouse=True)
def act_saves(monkeypatch):
    """Saves the session's hooks see while an activation module runs (a list, one entry per
    save: the module's class name)."""
    seen = []
    real = SaveSession.pack_hook

    def pack_hook(self, t):
        if self.modules and type(self.modules[-1]).__module__ == activations.__name__:
            seen.append(type(self.modules[-1]).__name__)
        return real(self, t)
    monkeypatch.setattr(SaveSession, "pack_hook", pack_hook)
    return seen


@pytest.mark.parametrize("act_fn", SEVERAL)
def test_saved_once_and_exact_under_a_lossless_policy(act_fn, act_saves):
    m = gpt2(act_fn)
    want = grads(m)
    ctx = act.compress_saved(act.Policy.preset("lossless"), model=m)
    got = grads(m, ctx)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert len(act_saves) == 2  # its input, once per layer (plain: 2 to 7 tensors each)


def test_lossy_saves_hold_less_and_stay_close():
    m = gpt2("gelu_new")
    want = grads(m)
    ctx = act.compress_saved(act.Policy.preset("8bit"), model=m)
    got = grads(m, ctx)
    for a, b in zip(want, got):
        if a.abs().sum() > 0:
            assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), 0) > 0.9999
    # a backward inside the context runs the activation again with plain saves of its own
    inside = grads(m, act.compress_saved(act.Policy.preset("8bit"), model=m), inside=True)
    assert all(torch.equal(a, b) for a, b in zip(got, inside))


@pytest.mark.parametrize("act_fn,node", [("gelu", "GeluBackward0"),
                                         ("gelu_new", "_RecomputedBackward")])
def test_one_op_activations_are_left_as_they_are(act_fn, node, act_saves):
    m = gpt2(act_fn)  # F.gelu: one op, which saves its input alone already
    seen = []
    m.transformer.h[0].mlp.c_proj.register_forward_pre_hook(
        lambda mod, args: seen.append(type(args[0].grad_fn).__name__))
    ctx = act.compress_saved(act.Policy.preset("lossless"), model=m)
    grads(m, ctx)
    assert len(act_saves) == 2 and seen == [node]


class Scaled(torch.nn.Module):
    """An activation whose output is changed in place by the module around it."""

    def __init__(self, in_place=True):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.act = activations.NewGELUActivation()
        self.in_place = in_place

    def forward(self, x):
        y = self.act(self.lin(x))
        y = y.mul_(3.0) if self.in_place else y * 3.0
        return y.sum()


def lin_grad(m, x, wrap=lambda m, x: m(x)):
    """The Linear's weight gradient: plain, then with the loss made under compress_saved."""
    m.zero_grad()
    m(x).backward()
    want = m.lin.weight.grad.clone()
    m.zero_grad()
    with act.compress_saved(act.Policy.preset("lossless"), model=m):
        loss = wrap(m, x)
    loss.backward()
    return want, m.lin.weight.grad


def test_the_output_may_change_in_place(act_saves):
    torch.manual_seed(0)
    want, got = lin_grad(Scaled(), torch.randn(8, 16))
    assert torch.equal(want, got)
    assert len(act_saves) == 1


def test_inside_a_checkpoint_and_with_hooks_of_its_own_it_runs_as_it_is(act_saves):
    torch.manual_seed(0)
    m, x = Scaled(), torch.randn(8, 16)
    # the checkpoint's recomputation in backward saves what its forward saved
    want, got = lin_grad(m, x, lambda m, x: torch.utils.checkpoint.checkpoint(
        m, x, use_reentrant=False))
    assert torch.equal(want, got) and act_saves == []
    handle = m.act.register_forward_pre_hook(lambda mod, args: (args[0] * 2.0,))
    want, got = lin_grad(m, x)
    handle.remove()
    assert torch.equal(want, got)
    assert act_saves == ["NewGELUActivation"] * 4  # plain's saves, the session's to keep


def test_under_autocast_the_activation_runs_again_as_it_ran():
    m = gpt2("gelu_new")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = grads(m)
        got = grads(m, act.compress_saved(act.Policy.preset("lossless"), model=m))
    assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_an_error_in_the_activation_leaves_the_next_step_whole(monkeypatch, act_saves):
    m = gpt2("gelu_new")
    want = grads(m)
    real = activations.NewGELUActivation.forward
    monkeypatch.setattr(activations.NewGELUActivation, "forward",
                        lambda self, x: (_ for _ in ()).throw(RuntimeError("boom")))
    ctx = act.compress_saved(act.Policy.preset("lossless"), model=m)
    with pytest.raises(RuntimeError, match="boom"):
        grads(m, ctx)
    monkeypatch.setattr(activations.NewGELUActivation, "forward", real)
    assert all(torch.equal(a, b) for a, b in zip(want, grads(m, ctx)))
    assert len(act_saves) == 2


def test_second_derivatives_follow_an_input_kept_as_it_is():
    torch.manual_seed(0)
    lin, gelu = torch.nn.Linear(8, 8), activations.NewGELUActivation()
    x = torch.randn(4, 8, requires_grad=True)

    def second(ctx):
        with ctx:
            y = gelu(lin(x)).square().sum()
        g, = torch.autograd.grad(y, x, create_graph=True)
        return torch.autograd.grad(g.square().sum(), lin.weight)[0]
    import contextlib
    want = second(contextlib.nullcontext())
    got = second(act.compress_saved(act.Policy.preset("lossless"), model=lin))
    assert torch.allclose(want, got, rtol=1e-5, atol=1e-6)  # (its terms summed in its order)


@pytest.mark.parametrize("where", ["module", "every module"])
def test_backward_hooks_see_the_input_gradient(act_saves, where):
    torch.manual_seed(0)
    m, x = Scaled(in_place=False), torch.randn(8, 16)  # (a hooked output is a view)
    seen = []
    hook = lambda mod, grad_in, grad_out: seen.append(grad_in[0] is not None)  # noqa: E731
    handle = m.act.register_full_backward_hook(hook) if where == "module" else \
        torch.nn.modules.module.register_module_full_backward_hook(
            lambda mod, gi, go: hook(mod, gi, go) if mod is m.act else None)
    try:
        want, got = lin_grad(m, x)
    finally:
        handle.remove()
    assert torch.equal(want, got) and seen == [True, True]
    assert act_saves == ["NewGELUActivation"] * 4  # left as it is
