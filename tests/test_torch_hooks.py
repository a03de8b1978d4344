"""The saved-tensor-hooks context: lossless compression changes no gradient bit; accounting is
exact; repeated saves are shared; masks take 1 bit; retain_graph works."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the torch extra; CI installs it
nn = torch.nn

import actcodec  # noqa: E402
from actcodec.torch import compress_saved  # noqa: E402


def cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AvgPool2d(2), nn.Flatten(), nn.Linear(32 * 4 * 4, 10))


class Block(nn.Module):
    """A transformer block: LayerNorm, attention from matmul/softmax, GELU MLP, dropout."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.drop(self.proj((att @ v).transpose(1, 2).reshape(b, s, d)))
        return x + self.drop(self.mlp(self.ln2(x)))


def grads(model, x, ctx=None):
    model.zero_grad()
    torch.manual_seed(1)  # the same dropout masks in every run
    if ctx is None:
        loss = model(x).square().mean()
    else:
        with ctx:
            loss = model(x).square().mean()
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


MODELS = [(cnn, lambda: torch.randn(8, 3, 32, 32)), (Block, lambda: torch.randn(4, 32, 64))]


@pytest.mark.parametrize("make,inputs", MODELS, ids=["cnn", "transformer"])
def test_lossless_gradients_bit_identical(make, inputs):
    model, x = make(), inputs()
    plain = grads(model, x)
    ctx = compress_saved(min_bytes=0)
    packed = grads(model, x, ctx)
    assert torch.equal(plain, packed)
    assert ctx.stats.tensors > 0 and ctx.stats.compressed_bytes > 0


def test_cnn_relu_outputs_are_sparse_and_shared():
    model, x = cnn(), torch.randn(8, 3, 32, 32)
    ctx = compress_saved(min_bytes=0)
    grads(model, x, ctx)
    assert ctx.stats.codecs.get("bitmap", 0) >= 1   # ReLU outputs are half zeros
    assert ctx.stats.deduplicated >= 1               # e.g. a ReLU output saved by the pool too
    assert ctx.stats.compressed_bytes < ctx.stats.original_bytes


def test_accounting_is_exact():
    model, x = cnn(), torch.randn(4, 3, 32, 32)
    ctx = compress_saved(min_bytes=0)
    seen = []
    orig_pack = ctx._pack

    def spy(t):
        p = orig_pack(t)
        if p is not t and all(p is not q for q in seen):
            seen.append(p)
        return p
    ctx._hooks = torch.autograd.graph.saved_tensors_hooks(spy, ctx._unpack)
    grads(model, x, ctx)
    assert ctx.stats.tensors == len(seen)
    assert ctx.stats.compressed_bytes == sum(p.nbytes for p in seen)


def test_dropout_mask_takes_one_bit():
    x = torch.randn(64, 1024, requires_grad=True)
    ctx = compress_saved(min_bytes=0)
    with ctx:
        y = torch.nn.functional.dropout(x, 0.5, training=True)
    assert ctx.stats.codecs.get("mask", 0) == 1
    assert ctx.stats.compressed_bytes <= x.numel() // 8 + 4
    y.sum().backward()
    assert torch.equal(x.grad, (y != 0).float() * 2)


def test_retain_graph_backward_twice():
    model, x = cnn(), torch.randn(4, 3, 32, 32)
    with compress_saved(min_bytes=0):
        loss = model(x).square().mean()
    loss.backward(retain_graph=True)
    first = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone()
    model.zero_grad()
    loss.backward()
    second = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert torch.equal(first, second)


def test_8bit_gradients_close():
    model, x = cnn(), torch.randn(8, 3, 32, 32)
    plain = grads(model, x)
    ctx = compress_saved(bits=8, min_bytes=0)
    q = grads(model, x, ctx)
    cos = torch.nn.functional.cosine_similarity(plain, q, dim=0)
    assert cos > 0.99
    assert ctx.stats.ratio > 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes_lossless(dtype):
    lin = nn.Linear(256, 256).to(dtype)
    x = torch.relu(torch.randn(64, 256, dtype=dtype))
    x.requires_grad_(True)

    def run(ctx):
        lin.zero_grad()
        x.grad = None
        if ctx:
            with ctx:
                out = torch.relu(lin(x)).sum()
        else:
            out = torch.relu(lin(x)).sum()
        out.backward()
        return lin.weight.grad.clone(), x.grad.clone()
    a, b = run(None), run(compress_saved(min_bytes=0))
    assert all(torch.equal(u, v) for u, v in zip(a, b))


def test_kept_tensors_are_not_compressed():
    lin = nn.Linear(8, 8)
    ctx = compress_saved()  # default min_bytes: these tiny activations are kept
    with ctx:
        lin(torch.randn(2, 8)).sum().backward()
    assert ctx.stats.tensors == 0 and ctx.stats.kept > 0


def test_bridge_roundtrip_and_errors():
    from actcodec.torch import decode_tensor, encode_tensor
    t = torch.relu(torch.randn(3, 5, 7))[:, ::2]      # non-contiguous
    assert torch.equal(decode_tensor(encode_tensor(t)), t)
    with pytest.raises(TypeError, match="dtype"):
        encode_tensor(torch.arange(4))
    enc = encode_tensor(torch.randn(100), "quant", bits=8)
    assert decode_tensor(enc).dtype == torch.float32
    assert np.abs(decode_tensor(enc).numpy()).max() < 10


def test_no_memory_growth_over_many_steps():
    """Encodings must die with the graph: after a warm-up, 200 more steps may not grow the
    Python-visible allocations (tracemalloc sees numpy's payload buffers)."""
    import gc
    import tracemalloc
    model, x = cnn(), torch.randn(4, 3, 32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad()
        with compress_saved(min_bytes=0):
            loss = model(x).square().mean()
        loss.backward()
        opt.step()
    for _ in range(20):
        step()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for _ in range(200):
        step()
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert grown < 256 * 1024, f"{grown} bytes still held after 200 steps"


def test_checkpoint_inside_the_context():
    """Non-reentrant checkpoint installs its own hooks in its region: tensors saved there are
    recomputed, not compressed; the result and gradients stay exactly those of plain runs."""
    from torch.utils.checkpoint import checkpoint
    model, x = cnn(), torch.randn(4, 3, 32, 32)
    plain = grads(model, x)

    class Wrapped(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False)
    wrapped = Wrapped(model)
    ctx = compress_saved(min_bytes=0)
    assert torch.equal(plain, grads(wrapped, x, ctx))
    everything = compress_saved(min_bytes=0)
    grads(model, x, everything)
    assert ctx.stats.tensors < everything.stats.tensors  # the region saved nothing through us
