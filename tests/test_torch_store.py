"""The torch adapters and the activation store: everything a step stores goes back to the
store when its graph is freed, after backward, after an exception in forward or backward, with
retain_graph and double backward, from several threads at once; steps reuse the same pages;
and the opt-in torch allocator keeps gradients bit-identical."""
import gc
import os
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest

torch = pytest.importorskip("torch")  # the torch extra; CI installs it
nn = torch.nn

from actcodec._ext import Store  # noqa: E402
from actcodec.torch import Policy, compress_saved, convert  # noqa: E402

from test_torch_hooks import cnn, grads  # noqa: E402

MiB = 2**20

POLICIES = [Policy(bits=8, min_bytes=0), Policy(bits=2, min_bytes=0),
            Policy(bits=None, min_bytes=0)]


def empty(store):
    gc.collect()
    st = store.stats()
    return st["blocks"] == 0 and st["used_bytes"] == 0


@pytest.mark.parametrize("policy", POLICIES, ids=["8bit", "2bit", "lossless"])
def test_a_step_releases_everything_after_backward(policy):
    store, model, x = Store(), cnn(), torch.randn(8, 3, 32, 32)
    with compress_saved(policy, store=store) as c:
        loss = model(x).square().mean()
    assert store.stats()["blocks"] > 0
    assert c.stats.store_mapped_bytes == store.stats()["mapped_bytes"]
    loss.backward()
    del loss
    assert empty(store)


def test_lossless_gradients_are_the_same_with_and_without_a_store():
    model, x = cnn(), torch.randn(8, 3, 32, 32)
    plain = grads(model, x)
    assert torch.equal(grads(model, x, compress_saved(bits=None, min_bytes=0, store=Store())),
                       plain)
    assert torch.equal(grads(model, x, compress_saved(bits=None, min_bytes=0, store=None)), plain)


def test_steps_reuse_the_same_pages():
    store, model, x = Store(), cnn(), torch.randn(8, 3, 32, 32)
    mapped = []
    for _ in range(5):
        with compress_saved(bits=4, min_bytes=0, store=store):
            loss = model(x).square().mean()
        loss.backward()
        mapped.append(store.stats()["mapped_bytes"])
    assert len(set(mapped)) == 1 and empty(store)


def test_an_exception_in_forward_releases_what_was_stored():
    store, model = Store(), cnn()
    with pytest.raises(RuntimeError):
        with compress_saved(bits=8, min_bytes=0, store=store):
            h = model[:3](torch.randn(8, 3, 32, 32))
            model[-1](h)  # a shape error after several compressed saves
    del h
    assert empty(store)


def test_an_exception_in_backward_releases_what_was_stored():
    store, model = Store(), cnn()
    with compress_saved(bits=8, min_bytes=0, store=store):
        h = model[:4](torch.randn(8, 3, 32, 32))
        h.register_hook(lambda g: (_ for _ in ()).throw(ValueError("in backward")))
        loss = model[4:](h).square().mean()
    with pytest.raises(ValueError, match="in backward"):
        loss.backward()
    del loss, h
    assert empty(store)


def test_retain_graph_and_double_backward():
    store, model, x = Store(), cnn(), torch.randn(8, 3, 32, 32)
    with compress_saved(bits=None, min_bytes=0, store=store):
        loss = model(x).square().mean()
    params = list(model.parameters())
    first = torch.autograd.grad(loss, params, retain_graph=True)
    assert store.stats()["blocks"] > 0  # kept for the second backward
    second = torch.autograd.grad(loss, params)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    del loss
    assert empty(store)

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    x = torch.randn(64, 16, requires_grad=True)

    def hessian_vector(ctx):
        with ctx:
            y = mlp(x).sum()
            (g,) = torch.autograd.grad(y, x, create_graph=True)
            out = g.square().sum()
        return torch.autograd.grad(out, x)[0]

    assert torch.equal(hessian_vector(compress_saved(bits=None, min_bytes=0, store=store)),
                       hessian_vector(torch.autograd.graph.saved_tensors_hooks(
                           lambda t: t, lambda t: t)))
    assert empty(store)


def test_threads_share_one_store():
    store, x = Store(), torch.randn(4, 3, 32, 32)
    models = [cnn() for _ in range(3)]
    expected = [grads(m, x) for m in models]
    results = {}

    def train(i):
        got = []
        for _ in range(3):
            got.append(grads(models[i], x, compress_saved(bits=None, min_bytes=0, store=store)))
        results[i] = got

    threads = [threading.Thread(target=train, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(g, expected[i]) for i, got in results.items() for g in got)
    assert len(results) == 3 and empty(store)


def test_converted_modules_use_the_store():
    from actcodec import store as stores

    model, x = convert(cnn(), Policy(bits=8, min_bytes=0)), torch.randn(8, 3, 32, 32)
    before = stores.default().stats()["blocks"]
    loss = model(x).square().mean()
    assert stores.default().stats()["blocks"] > before
    loss.backward()
    del loss
    gc.collect()
    assert stores.default().stats()["blocks"] == before


def test_no_memory_growth_over_a_thousand_steps():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.GELU(),
                          nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, store = torch.randn(256, 64), Store(MiB)
    from actcodec.apps.process_memory import rss

    marks = {}
    for step in range(1000):
        with compress_saved(bits=2, min_bytes=0, store=store):
            loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step in (100, 999):
            gc.collect()
            marks[step] = (rss(), store.stats()["mapped_bytes"])
    assert marks[999][1] == marks[100][1]            # the store holds the same pages
    assert marks[999][0] - marks[100][0] < 8 * MiB   # and the process does not grow
    assert empty(store)


def test_the_torch_allocator_keeps_gradients_and_serves_large_tensors():
    """In a fresh process: installing is process-wide, and the first install compiles."""
    if shutil.which("ninja") is None:  # the test extra installs it; torch builds with it
        pytest.skip("ninja is not installed: the allocator cannot be compiled")
    script = textwrap.dedent("""
        import gc, torch
        import actcodec.torch as act
        from actcodec import store
        from test_torch_hooks import cnn, grads
        model, x = cnn(), torch.randn(32, 3, 32, 32)
        plain = grads(model, x)
        act.allocator.install()
        assert act.allocator.installed()
        before = store.default().stats()["blocks"]
        big = torch.empty(4 << 20, dtype=torch.uint8)
        assert store.default().stats()["blocks"] == before + 1
        del big
        assert store.default().stats()["blocks"] == before
        for _ in range(2):
            assert torch.equal(grads(model, x), plain)
            assert torch.equal(grads(model, x, act.compress_saved(bits=None, min_bytes=0)), plain)
        # Without compress_saved nothing ends a step: the user's new_step gives pages back.
        mapped = store.default().stats()["mapped_bytes"]
        store.new_step(None)
        store.new_step(None)
        assert store.default().stats()["mapped_bytes"] < mapped
        kept = torch.ones(2 << 20)
        act.allocator.uninstall()
        assert not act.allocator.installed()
        del kept  # made by the store's allocator, freed after it is uninstalled
        gc.collect()
        assert store.default().stats()["blocks"] == 0
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=os.path.dirname(__file__),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
