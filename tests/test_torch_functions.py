"""The compressed-save autograd Functions and the module converter: gradcheck on every Function;
forward bits equal to the plain op's on every float dtype; lossless gradients bit-identical to
plain PyTorch on a CNN and a transformer block (and their training state after a few steps);
8-bit gradients close; retain_graph; unconvert; include/exclude; accounting; max-pool indices
kept as uint8 window positions."""
import copy
import functools

import pytest

torch = pytest.importorskip("torch")  # the torch extra; CI installs it
nn = torch.nn
F = nn.functional

from actcodec.torch import record  # noqa: E402
from actcodec.torch.save import functions as fn  # noqa: E402
from actcodec.torch.save.convert import COMPRESSED, convert, unconvert  # noqa: E402
from actcodec.torch.save.policy import Policy  # noqa: E402

LOSSLESS = Policy.preset("lossless", min_bytes=0)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """torch's OpenMP pool waits on busy shared cores (a float64 conv of 150 elements took
    20 ms instead of 0.02 on two loaded cores); plain and converted runs share the setting,
    and test_lossless_model_gradients_bit_identical also runs with two threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def lossless():
    return Policy.preset("lossless", min_bytes=0)


# --- gradcheck -----------------------------------------------------------------------------

def _x(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()


def _away_from_zero(*shape):
    """Values at least 0.1 from 0, so that gradcheck's steps do not cross relu's kink."""
    x = _x(*shape).detach()
    return (x.sign() * (x.abs() + 0.1)).requires_grad_()


def _with_seed(f):
    """Dropout draws a mask per call; gradcheck needs the same one every call."""
    def run(*args):
        torch.manual_seed(7)
        return f(*args)
    return run


P = LOSSLESS
GRADCHECK = {
    "linear-2d": (lambda x, w, b: fn.linear(x, w, b, P), [_x(4, 5), _x(3, 5), _x(3)]),
    "linear-3d": (lambda x, w, b: fn.linear(x, w, b, P), [_x(2, 3, 5), _x(3, 5), _x(3)]),
    "linear-strided-nobias": (lambda x, w: fn.linear(x.mT, w, None, P), [_x(2, 5, 3), _x(4, 5)]),
    "linear-strided-bias": (lambda x, w, b: fn.linear(x.transpose(0, 1), w, b, P),
                            [_x(3, 2, 5), _x(4, 5), _x(4)]),
    "linear-1d": (lambda x, w, b: fn.linear(x, w, b, P), [_x(5), _x(3, 5), _x(3)]),
    "conv2d": (lambda x, w, b: fn.conv2d(x, w, b, 1, 1, policy=P),
               [_x(2, 2, 5, 5), _x(3, 2, 3, 3), _x(3)]),
    "conv2d-stride-pad": (lambda x, w: fn.conv2d(x, w, None, 2, (1, 0), policy=P),
                          [_x(1, 2, 6, 5), _x(2, 2, 3, 2)]),
    "conv2d-dilation-groups": (lambda x, w, b: fn.conv2d(x, w, b, 1, 2, 2, 2, policy=P),
                               [_x(1, 4, 5, 5), _x(4, 2, 3, 3), _x(4)]),
    "conv2d-same": (lambda x, w: fn.conv2d(x, w, None, 1, "same", policy=P),
                    [_x(1, 2, 4, 4), _x(2, 2, 3, 3)]),
    "conv2d-unbatched": (lambda x, w: fn.conv2d(x, w, None, policy=P),
                         [_x(2, 4, 4), _x(2, 2, 3, 3)]),
    "conv1d": (lambda x, w, b: fn.conv1d(x, w, b, 2, 1, 2, 2, policy=P),
               [_x(2, 4, 9), _x(4, 2, 3), _x(4)]),
    "relu": (lambda x: fn.relu(x, policy=P), [_away_from_zero(3, 7)]),
    "relu-inplace": (lambda x: fn.relu(x * 1, True, P), [_away_from_zero(3, 7)]),
    "gelu": (lambda x: fn.gelu(x, policy=P), [_x(3, 7)]),
    "gelu-tanh": (lambda x: fn.gelu(x, "tanh", P), [_x(3, 7)]),
    "silu": (lambda x: fn.silu(x, policy=P), [_x(3, 7)]),
    "silu-inplace": (lambda x: fn.silu(x * 1, True, P), [_x(3, 7)]),
    "batch_norm-4d": (lambda x, w, b: fn.batch_norm(x, torch.zeros(3, dtype=x.dtype),
                                                    torch.ones(3, dtype=x.dtype), w, b, True,
                                                    0.1, 1e-5, P),
                      [_x(4, 3, 2, 2), _x(3), _x(3)]),
    "batch_norm-2d-no-affine-no-stats": (
        lambda x: fn.batch_norm(x, None, None, None, None, True, 0.1, 1e-5, P), [_x(5, 3)]),
    "layer_norm": (lambda x, w, b: fn.layer_norm(x, 4, w, b, 1e-5, P), [_x(3, 4), _x(4), _x(4)]),
    "layer_norm-2d-no-affine": (lambda x: fn.layer_norm(x, (3, 4), policy=P), [_x(2, 3, 4)]),
    "max_pool2d": (lambda x: fn.max_pool2d(x, 2, policy=P), [_x(1, 2, 4, 6)]),
    "max_pool2d-overlap-ceil": (lambda x: fn.max_pool2d(x, 3, 2, 1, ceil_mode=True, policy=P),
                                [_x(1, 2, 6, 5)]),
    "max_pool2d-dilation": (lambda x: fn.max_pool2d(x, (2, 3), 1, (1, 0), (2, 1), policy=P),
                            [_x(1, 1, 6, 6)]),
    "max_pool1d-overlap-ceil": (lambda x: fn.max_pool1d(x, 3, 2, 1, ceil_mode=True, policy=P),
                                [_x(2, 2, 8)]),
    "avg_pool2d": (lambda x: fn.avg_pool2d(x, 2, policy=P), [_x(1, 2, 4, 4)]),
    "avg_pool2d-overlap-ceil": (lambda x: fn.avg_pool2d(x, 3, 2, 1, True, False, policy=P),
                                [_x(1, 2, 6, 5)]),
    "avg_pool2d-divisor": (lambda x: fn.avg_pool2d(x, 2, 1, divisor_override=3, policy=P),
                           [_x(1, 1, 4, 4)]),
    "avg_pool1d-overlap-ceil": (lambda x: fn.avg_pool1d(x, 3, 2, 1, True, policy=P),
                                [_x(2, 2, 8)]),
    "dropout": (_with_seed(lambda x: fn.dropout(x, 0.3, policy=P)), [_x(4, 8)]),
    "dropout-inplace": (_with_seed(lambda x: fn.dropout(x * 1, 0.3, inplace=True, policy=P)),
                        [_x(4, 8)]),
    "softmax": (lambda x: fn.softmax(x, -1, policy=P), [_x(3, 5)]),
    "softmax-dim0": (lambda x: fn.softmax(x, 0, policy=P), [_x(3, 2, 4)]),
    "matmul-mm": (lambda a, b: fn.matmul(a, b, P), [_x(3, 4), _x(4, 2)]),
    "matmul-fold": (lambda a, b: fn.matmul(a, b, P), [_x(2, 3, 4), _x(4, 2)]),
    "matmul-fold-transposed": (lambda a, b: fn.matmul(a, b, P), [_x(3, 4), _x(2, 4, 2)]),
    "matmul-broadcast": (lambda a, b: fn.matmul(a, b, P), [_x(2, 1, 3, 4), _x(3, 4, 2)]),
    "matmul-squeeze": (lambda a, b: fn.matmul(a, b, P), [_x(1, 3, 4), _x(2, 4, 2)]),
    "matmul-attention": (lambda q, k: fn.matmul(q.transpose(1, 2), k.permute(0, 2, 3, 1), P),
                         [_x(2, 3, 2, 4), _x(2, 3, 2, 4)]),
    "bmm": (lambda a, b: fn.bmm(a, b, P), [_x(2, 3, 4), _x(2, 4, 2)]),
}


@pytest.mark.parametrize("name", list(GRADCHECK))
def test_gradcheck(name):
    f, inputs = GRADCHECK[name]
    assert torch.autograd.gradcheck(f, inputs)


# --- per-op bit identity -------------------------------------------------------------------

def _ours(out) -> bool:
    """Whether one of our Functions made `out` (within a few nodes: squeeze, add, ...)."""
    nodes = [out.grad_fn]
    for _ in range(3):
        if any(type(n).__name__.endswith("FunctionBackward") for n in nodes):
            return True
        nodes = [m for n in nodes if n is not None for m, _ in n.next_functions]
    return False


def _run(f, inputs, seed, ours=None):
    ins = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    torch.manual_seed(seed)
    out = f(*ins)
    if ours is not None:
        assert _ours(out) == ours
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
    out.backward(g)
    return out.detach(), [t.grad for t in ins if t.requires_grad]


def _cases(dt):
    """(name, plain f, our f, inputs) on dtype dt."""
    def r(*shape, grad=True):
        return torch.randn(*shape).to(dt).requires_grad_(grad)
    L = LOSSLESS
    x4 = r(4, 6, 9, 9)
    cases = [
        ("linear", lambda x, w, b: F.linear(x, w, b), lambda x, w, b: fn.linear(x, w, b, L),
         [r(3, 5, 8), r(6, 8), r(6)]),
        ("linear-strided", lambda x, w, b: F.linear(x.transpose(0, 1), w, b),
         lambda x, w, b: fn.linear(x.transpose(0, 1), w, b, L), [r(5, 3, 8), r(6, 8), r(6)]),
        ("linear-4d", lambda x, w, b: F.linear(x, w, b), lambda x, w, b: fn.linear(x, w, b, L),
         [r(2, 3, 5, 8), r(6, 8), r(6)]),
        ("linear-4d-strided-nobias", lambda x, w: F.linear(x.transpose(1, 2), w),
         lambda x, w: fn.linear(x.transpose(1, 2), w, None, L), [r(2, 5, 3, 8), r(6, 8)]),
        ("linear-frozen-input", lambda x, w: F.linear(x, w), lambda x, w: fn.linear(x, w, None, L),
         [r(5, 8, grad=False), r(6, 8)]),
        ("conv2d", lambda x, w, b: F.conv2d(x, w, b, 2, 1, 1, 2),
         lambda x, w, b: fn.conv2d(x, w, b, 2, 1, 1, 2, L), [x4, r(6, 3, 3, 3), r(6)]),
        ("conv2d-channels-last", lambda x, w: F.conv2d(x, w, None, 1, 1),
         lambda x, w: fn.conv2d(x, w, None, 1, 1, policy=L),
         [x4.detach().to(memory_format=torch.channels_last).requires_grad_(), r(5, 6, 3, 3)]),
        ("conv1d", lambda x, w: F.conv1d(x, w, None, 1, 2, 2),
         lambda x, w: fn.conv1d(x, w, None, 1, 2, 2, policy=L), [r(2, 6, 11), r(4, 6, 3)]),
        ("relu", F.relu, lambda x: fn.relu(x, policy=L), [r(3, 50, 7)]),
        ("gelu", F.gelu, lambda x: fn.gelu(x, policy=L), [r(3, 50, 7)]),
        ("gelu-tanh", lambda x: F.gelu(x, approximate="tanh"),
         lambda x: fn.gelu(x, "tanh", L), [r(3, 50, 7)]),
        ("silu", F.silu, lambda x: fn.silu(x, policy=L), [r(3, 50, 7)]),
        ("batch_norm", lambda x, w, b: F.batch_norm(x, None, None, w, b, True),
         lambda x, w, b: fn.batch_norm(x, None, None, w, b, True, policy=L),
         [r(8, 6, 5, 5), r(6), r(6)]),
        ("layer_norm", lambda x, w, b: F.layer_norm(x, (7,), w, b),
         lambda x, w, b: fn.layer_norm(x, 7, w, b, policy=L), [r(3, 50, 7), r(7), r(7)]),
        ("max_pool2d", lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True),
         lambda x: fn.max_pool2d(x, 3, 2, 1, ceil_mode=True, policy=L), [r(2, 3, 11, 13)]),
        ("max_pool2d-channels-last", lambda x: F.max_pool2d(x, 3, 2, 1),
         lambda x: fn.max_pool2d(x, 3, 2, 1, policy=L),
         [torch.randn(2, 3, 11, 13).to(dt, memory_format=torch.channels_last).requires_grad_()]),
        ("max_pool1d", lambda x: F.max_pool1d(x, 3, 2, 1, 2),
         lambda x: fn.max_pool1d(x, 3, 2, 1, 2, policy=L), [r(2, 3, 13)]),
        ("avg_pool2d", lambda x: F.avg_pool2d(x, 3, 2, 1, True, False),
         lambda x: fn.avg_pool2d(x, 3, 2, 1, True, False, policy=L), [r(2, 3, 11, 13)]),
        ("avg_pool1d", lambda x: F.avg_pool1d(x, 3, 2, 1), lambda x: fn.avg_pool1d(x, 3, 2, 1),
         [r(2, 3, 13)]),
        ("softmax", lambda x: F.softmax(x, 1), lambda x: fn.softmax(x, 1, policy=L),
         [r(3, 50, 7)]),
        ("matmul-attention", lambda q, k: torch.matmul(q, k.mT),
         lambda q, k: fn.matmul(q, k.mT, L), [r(2, 4, 33, 16), r(2, 4, 33, 16)]),
        ("matmul-broadcast", torch.matmul, lambda a, b: fn.matmul(a, b, L),
         [r(2, 1, 5, 7), r(3, 7, 4)]),
        ("bmm", torch.bmm, lambda a, b: fn.bmm(a, b, L), [r(3, 5, 7), r(3, 7, 4)]),
    ]
    # nn.Dropout on the CPU scales by 1/(1-p) rounded in the dtype; p=0.15 is one where that
    # differs from native_dropout's scale in float32
    for p in (0.1, 0.15, 0.5):
        cases.append((f"dropout-{p}", lambda x, p=p: F.dropout(x, p),
                      lambda x, p=p: fn.dropout(x, p, policy=L), [r(3, 50, 7)]))
        cases.append((f"dropout-inplace-{p}", lambda x, p=p: F.dropout(x * 1, p, inplace=True),
                      lambda x, p=p: fn.dropout(x * 1, p, inplace=True, policy=L),
                      [r(3, 50, 7)]))
    return cases


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_forward_and_lossless_gradients_bit_identical_per_op(dtype):
    """The same output bits as the plain op, and with a lossless policy the same gradient
    bits, for every op on every float dtype."""
    failed = []
    for name, plain, ours, inputs in _cases(dtype):
        o1, g1 = _run(plain, inputs, seed=5, ours=False)
        o2, g2 = _run(ours, inputs, seed=5, ours=True)
        if not torch.equal(o1, o2):
            failed.append(f"{name}: output")
        if len(g1) != len(g2) or not all(torch.equal(a, b) for a, b in zip(g1, g2)):
            failed.append(f"{name}: gradient")
    assert not failed, failed


# Row-major operands: x @ W, attention's batched products, 2-D products. The backward's plain
# products are the ones aten computes for these, bit for bit.
ROW_MAJOR_MATMULS = [((5, 7), (7, 3)), ((4, 5, 7), (7, 3)), ((2, 4, 33, 16), (2, 4, 16, 33)),
                     ((3, 5, 7), (3, 7, 2))]
# Broadcast batch dimensions, a 2-D operand against a batched one: aten folds or broadcasts
# these its own way, and the sums may round differently (documented in functions.py).
OTHER_MATMULS = [((7, 5), (4, 5, 3)), ((2, 1, 5, 7), (1, 4, 7, 6)), ((1, 5, 7), (4, 7, 3)),
                 ((4, 5, 7), (1, 7, 3)), ((5, 7), (2, 3, 7, 4))]


@pytest.mark.parametrize("sa,sb", ROW_MAJOR_MATMULS + OTHER_MATMULS)
def test_matmul_gradients(sa, sb):
    """Outputs always, and gradients for row-major operands, bit-identical to plain PyTorch;
    gradients of column-major (transposed) or broadcast operands equal to float rounding."""
    for ga, gb in [(True, True), (True, False), (False, True)]:
        for transposed in (False, True):
            a = torch.randn(*sa)
            if transposed:
                a = torch.randn(*sa[:-2], sa[-1], sa[-2]).mT
            inputs = [a.requires_grad_(ga), torch.randn(*sb).requires_grad_(gb)]
            o1, g1 = _run(torch.matmul, inputs, 0)
            o2, g2 = _run(lambda x, y: fn.matmul(x, y, LOSSLESS), inputs, 0, ours=True)
            assert torch.equal(o1, o2)
            exact = (sa, sb) in ROW_MAJOR_MATMULS and not transposed
            for u, v in zip(g1, g2):
                if exact:
                    assert torch.equal(u, v), (sa, sb, ga, gb)
                else:
                    torch.testing.assert_close(u, v, rtol=1e-5, atol=1e-6)


# --- models --------------------------------------------------------------------------------

def cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
        nn.Conv2d(16, 32, 3, padding=1, stride=2, bias=False), nn.BatchNorm2d(32, momentum=None),
        nn.ReLU(inplace=True), nn.AvgPool2d(2), nn.Flatten(),
        nn.Linear(32 * 2 * 2, 64), nn.BatchNorm1d(64), nn.SiLU(), nn.Dropout(0.2),
        nn.Linear(64, 10))


class Block(nn.Module):
    """A pre-norm transformer block: LayerNorm, attention from matmul and nn.Softmax (with
    attention dropout), GELU MLP, dropout. `policy` set: the attention's two products go
    through functions.matmul; unset: torch.matmul."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads, self.policy = heads, None
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.softmax, self.attn_drop = nn.Softmax(dim=-1), nn.Dropout(0.1)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        mm = torch.matmul if self.policy is None else \
            functools.partial(fn.matmul, policy=self.policy, layer="attn")
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = self.attn_drop(self.softmax(mm(q, k.transpose(-1, -2)) / (d // self.heads) ** 0.5))
        x = x + self.drop(self.proj(mm(att, v).transpose(1, 2).reshape(b, s, d)))
        return x + self.drop(self.mlp(self.ln2(x)))


def block():
    torch.manual_seed(0)
    return nn.Sequential(Block(), Block())


def converted(model, policy, **kw):
    out = convert(copy.deepcopy(model), policy, **kw)
    for m in out.modules():
        if isinstance(m, Block):
            m.policy = policy
    return out


MODELS = {"cnn": (cnn, lambda: torch.randn(8, 3, 16, 16)),
          "transformer": (block, lambda: torch.randn(4, 17, 64))}


def grads(model, x):
    model.zero_grad()
    torch.manual_seed(1)  # the same dropout masks in every run
    out = model(x)
    out.square().mean().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", list(MODELS))
def test_lossless_model_gradients_bit_identical(name, threads):
    make, inputs = MODELS[name]
    model, x = make(), inputs()
    torch.set_num_threads(threads)
    try:
        plain_out, plain = grads(model, x)
        ours = converted(model, lossless())
        with record() as acc:
            out, packed = grads(ours, x)
    finally:
        torch.set_num_threads(1)
    assert torch.equal(plain_out, out)
    assert all(torch.equal(a, b) for a, b in zip(plain, packed))
    assert acc.tensors > 0 and acc.compressed_bytes < acc.original_bytes


@pytest.mark.parametrize("name", list(MODELS))
def test_training_state_identical_after_steps(name):
    """Three SGD steps with momentum: parameters, running statistics (momentum 0.1 and the
    cumulative momentum=None) and num_batches_tracked end up bit-identical."""
    make, inputs = MODELS[name]
    plain = make()
    ours = converted(plain, lossless())
    for model in (plain, ours):
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for step in range(3):
            torch.manual_seed(10 + step)
            x = inputs()
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    a, b = plain.state_dict(), ours.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    if name == "cnn":
        assert int(b["5.num_batches_tracked"]) == 3


def _cos(a, b):
    a, b = a.double().reshape(-1), b.double().reshape(-1)
    return float(a @ b / (a.norm() * b.norm()))


# Parameters whose exact gradient is zero: the bias of the Linear right before BatchNorm1d
# (batch norm subtracts the batch mean, so a constant shift changes nothing). Plain PyTorch
# gives it rounding noise (~3e-8), and the cosine of two noise vectors means nothing.
ZERO_GRADIENT = {"cnn": {"9.bias"}, "transformer": set()}


@pytest.mark.parametrize("name", list(MODELS))
def test_8bit_gradients_close(name):
    make, inputs = MODELS[name]
    model, x = make(), inputs()
    _, plain = grads(model, x)
    ours = converted(model, Policy.preset("8bit", min_bytes=0))
    with record() as acc:
        _, q = grads(ours, x)
    names = [n for n, _ in model.named_parameters()]
    assert all((float(p.abs().max()) < 1e-6) == (n in ZERO_GRADIENT[name])
               for n, p in zip(names, plain))
    assert _cos(torch.cat([p.reshape(-1) for p in plain]),
                torch.cat([p.reshape(-1) for p in q])) >= 0.999
    cosines = {n: _cos(a, b) for n, a, b in zip(names, plain, q) if n not in ZERO_GRADIENT[name]}
    assert min(cosines.values()) >= 0.99, cosines
    assert acc.ratio > 2


def test_retain_graph_backward_twice():
    for make, inputs in MODELS.values():
        model = converted(make(), Policy.preset("8bit", min_bytes=0))
        x = inputs()
        torch.manual_seed(1)
        loss = model(x).square().mean()
        loss.backward(retain_graph=True)
        first = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        loss.backward()
        assert all(torch.equal(a, p.grad) for a, p in zip(first, model.parameters()))


# --- converter -----------------------------------------------------------------------------

def _same_state(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_convert_keeps_modules_and_unconvert_restores():
    model = cnn()
    before = copy.deepcopy(model.state_dict())
    classes = [type(m) for m in model.modules()]
    hook_calls = []
    model[3].register_forward_hook(lambda *a: hook_calls.append(1))
    assert convert(model) is model
    assert _same_state(before, model.state_dict())
    assert type(model[0]) is COMPRESSED[nn.Conv2d] and type(model[0]).__name__ != "Conv2d"
    assert isinstance(model[3], nn.MaxPool2d) and type(model[3]) is not nn.MaxPool2d
    assert model[0].actcodec_name == "0" and isinstance(model[0].actcodec_policy, Policy)
    with record() as acc:
        model(torch.randn(2, 3, 16, 16)).sum().backward()
    assert hook_calls == [1] and acc.tensors > 0
    trained = copy.deepcopy(model.state_dict())
    assert unconvert(model) is model
    assert [type(m) for m in model.modules()] == classes
    assert not any(hasattr(m, "actcodec_policy") for m in model.modules())
    assert _same_state(trained, model.state_dict())
    with record() as acc:
        model(torch.randn(2, 3, 16, 16)).sum().backward()
    assert hook_calls == [1, 1] and acc.tensors == 0


def test_include_exclude():
    def kinds(model):
        return {name: type(m) in COMPRESSED.values() for name, m in model.named_modules()
                if type(m) in COMPRESSED or type(m) in COMPRESSED.values()}
    m = convert(block(), include=["0.*"])
    assert all(v == name.startswith("0.") for name, v in kinds(m).items())
    m = convert(block(), exclude=[nn.Dropout, "*.mlp.*"])
    for name, v in kinds(m).items():
        module = m.get_submodule(name)
        assert v == (not isinstance(module, nn.Dropout) and ".mlp." not in name), name
    m = convert(block(), include=[nn.LayerNorm, "1.qkv"], exclude="0.ln2")
    assert {n for n, v in kinds(m).items() if v} == {"0.ln1", "1.ln1", "1.ln2", "1.qkv"}
    with pytest.raises(TypeError):
        convert(block(), include=[3])


def test_policy_overrides_by_layer_name():
    """The qualified names reach the policy: an override keeps one layer uncompressed."""
    policy = Policy.preset("8bit", min_bytes=0, overrides={"9": None})
    model = converted(cnn(), policy)
    with record() as acc:
        model(torch.randn(4, 3, 16, 16)).sum().backward()
    layers = {r.layer for r in acc.rows.values()}
    assert "9" not in layers and "13" in layers and acc.kept >= 1


def test_eval_and_no_grad_run_the_plain_forward():
    model = converted(cnn(), lossless())
    plain = cnn()
    x = torch.randn(2, 3, 16, 16)
    with record() as acc:
        model.eval()
        plain.eval()
        assert torch.equal(model(x), plain(x))
        model.train()
        plain.train()
        with torch.no_grad():
            torch.manual_seed(2)
            a = model(x)
            torch.manual_seed(2)
            assert torch.equal(a, plain(x))
    assert acc.tensors == 0 and not acc.rows


def test_other_conv_and_norm_forms():
    """padding_mode="reflect", string padding, 1-D convs and pools, BatchNorm1d on 3-D input,
    LayerNorm without bias, tanh GELU, Softmax(dim=None): converted gradients bit-identical."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv1d(4, 8, 3, padding=1, padding_mode="reflect"), nn.BatchNorm1d(8), nn.ReLU(),
        nn.Conv1d(8, 8, 3, padding="same", dilation=2, groups=2), nn.MaxPool1d(2),
        nn.AvgPool1d(3, 1, 1, count_include_pad=False), nn.LayerNorm(8, bias=False),
        nn.GELU("tanh"), nn.Softmax(dim=-1))
    x = torch.randn(3, 4, 16)
    out1, g1 = grads(model, x)
    ours = converted(model, lossless())
    out2, g2 = grads(ours, x)
    assert torch.equal(out1, out2) and all(torch.equal(a, b) for a, b in zip(g1, g2))


# --- accounting and payloads ---------------------------------------------------------------

def test_accounting_rows_per_layer():
    model = converted(block(), Policy.preset("8bit", min_bytes=0))
    with record() as acc:
        torch.manual_seed(1)
        model(torch.randn(2, 17, 64)).sum().backward()
    rows = {(r.layer, r.op) for r in acc.rows.values()}
    for want in [("0.ln1", "layer_norm"), ("0.qkv", "linear"), ("attn", "matmul"),
                 ("0.softmax", "softmax"), ("0.attn_drop", "dropout"), ("0.mlp.1", "gelu"),
                 ("1.mlp.2", "linear"), ("1.drop", "dropout")]:
        assert want in rows, want
    assert acc.rows[("0.attn_drop", "dropout")].codecs == {"mask": 1}
    assert acc.compressed_bytes == sum(r.compressed_bytes for r in acc.rows.values())
    table = acc.table()
    assert "0.mlp.1" in table and "gelu" in table and "total" in table
    assert acc.decode_seconds > 0  # decodes in backward are timed into their rows


def test_relu_and_dropout_masks_take_one_bit():
    x = torch.randn(64, 1024, requires_grad=True)
    with record() as acc:
        y = fn.dropout(fn.relu(x, layer="r"), 0.5, layer="d")
    # the bitmap, and the mask codec's one value (True)
    assert acc.rows[("r", "relu")].compressed_bytes == x.numel() // 8 + 1
    assert acc.rows[("d", "dropout")].compressed_bytes == x.numel() // 8 + 1
    y.sum().backward()
    assert torch.equal(x.grad, ((y != 0) & (x > 0)).float() * 2)


def test_max_pool_indices_are_uint8_window_positions():
    x = torch.randn(2, 3, 12, 12, requires_grad=True)
    with record() as acc:
        out = fn.max_pool2d(x, 3, 2, 1, layer="pool")
    (payload,) = out.grad_fn.saved_tensors
    assert payload.dtype == torch.uint8 and payload.shape == out.shape
    assert int(payload.max()) < 9
    row = acc.rows[("pool", "max_pool")]
    assert row.codecs == {"uint8": 1}
    assert row.original_bytes == 8 * out.numel() and row.compressed_bytes == out.numel()
    # the positions are the argmax within each window
    _, idx = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    row_, col = idx // 12, idx % 12
    oh = torch.arange(out.shape[2]).view(-1, 1) * 2 - 1
    ow = torch.arange(out.shape[3]) * 2 - 1
    assert torch.equal(payload.long(), (row_ - oh) * 3 + (col - ow))
    # windows larger than 256 elements take int16
    big = fn.max_pool2d(torch.randn(1, 1, 40, 40, requires_grad=True), 17, 1)
    assert big.grad_fn.saved_tensors[0].dtype == torch.int16
