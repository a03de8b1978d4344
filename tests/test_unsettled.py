"""Device saves that do not wait for their statistics (pack(defer=True), save/unsettled.py):
settled, they are exactly what a waiting encode gives (its bytes, its codec choice, its
NaN error), nothing decodes one before it is settled, the window holds at most its limit
beyond one save, and a step's gradients and accounting match the waiting path. Without a
GPU the kernels run on CPU tensors under Triton's interpreter, routed as device tensors."""
import os
import weakref

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import actcodec  # noqa: E402
import actcodec.torch as act  # noqa: E402
from actcodec.torch.codecs import fused  # noqa: E402
from actcodec.torch.codecs import packed as packing  # noqa: E402
from actcodec.torch.save.policy import Setting  # noqa: E402
from actcodec.torch.save.unsettled import Window  # noqa: E402

GPU = torch.device("cuda") if torch.cuda.is_available() else None
if GPU is None and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and Triton's interpreter is off", allow_module_level=True)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture
def as_device(monkeypatch):
    """CPU tensors take the device path (the kernels, interpreted) as a GPU's would."""
    if GPU is None:
        monkeypatch.setattr(packing, "_host_path", lambda t: False)
        monkeypatch.setattr(fused, "applies", lambda t: True)


@pytest.fixture
def stalled(monkeypatch):
    """Statistics that never arrive on their own, as on a busy GPU: saves settle only when
    waited for (the window's limit, the forward's end) or read (backward)."""
    monkeypatch.setattr(fused.Unread, "ready", lambda self: False)


def here(t):
    return t.to(GPU) if GPU else t


def bits_of(t):
    return t.reshape(-1).view(torch.int32 if t.element_size() == 4 else torch.int16)


def randn(*shape, seed=0):
    return here(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_dense_save_is_the_waiting_encode_and_reads_nothing(as_device, monkeypatch, dtype):
    x = randn(3, 1000).to(dtype)
    reads = []
    real = fused._read
    monkeypatch.setattr(fused, "_read", lambda s: reads.append(1) or real(s))
    for name in ("item", "tolist", "cpu", "numpy"):
        method = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _n=name, _m=method, **k:
                            reads.append(_n) or _m(self, *a, **k))
    p = packing.pack(x, Setting(bits=8), defer=True)
    assert reads == [] and p.unsettled is not None and p.codec == "quant"
    monkeypatch.undo()
    assert p.unsettled.unread.same_as_encode()
    p.settle()
    assert p.unsettled is None and p.codec == "quant"
    want = fused.encode(x, "auto", bits=8)
    assert p.enc.to("cpu").to_bytes() == want.to("cpu").to_bytes()
    assert torch.equal(bits_of(p.unpack()), bits_of(packing.pack(x, Setting(bits=8)).unpack()))


def test_saves_of_a_run_share_row_blocks_and_never_a_row(as_device, monkeypatch):
    monkeypatch.setattr(fused.Rows, "COUNT", 4)
    rows = fused.Rows()
    xs = [torch.relu(randn(2000, seed=k)) * (randn(2000, seed=50 + k) > 0.5 * (k % 3))
          for k in range(10)]  # dense, ~30% and ~13% nonzero: some settle as bitmaps
    packs = [packing.pack(x, Setting(bits=4), defer=True, rows=rows) for x in xs]
    hosts = [p.unsettled.unread.host for p in packs]
    assert len({h.data_ptr() for h in hosts}) == 10  # a row each
    assert len({h.untyped_storage().data_ptr() for h in hosts}) == 3  # blocks of 4
    for p, x in zip(packs, xs):  # rows read after later encodes wrote theirs
        p.settle()
        want = fused.encode(x, "auto", bits=4)
        assert p.codec == want.codec
        assert p.enc.to("cpu").to_bytes() == want.to("cpu").to_bytes()


@pytest.mark.parametrize("how", ["contiguous", "requires_grad", "neg_view", "transposed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_unread_encoding_reads_the_elements_as_encode_does(as_device, how, dtype):
    x = randn(40, 70).to(dtype)
    t = {"contiguous": x, "requires_grad": x.clone().requires_grad_(),
         "neg_view": torch._neg_view(x), "transposed": x.t()}[how]
    enc, unread = fused.encode_unread(t, "auto", bits=8)
    assert unread.same_as_encode()
    want = fused.encode(t.detach(), "auto", bits=8)
    assert enc.to("cpu").to_bytes() == want.to("cpu").to_bytes()


@pytest.mark.parametrize("kib,kept", [(768, True), (1024, False)])
def test_a_small_lossless_device_save_is_kept_without_a_read(as_device, monkeypatch, kib,
                                                             kept):
    x = torch.relu(randn(kib * 256, seed=3))  # half zeros: a bitmap where it is encoded
    reads = []
    real = fused._read
    monkeypatch.setattr(fused, "_read", lambda s: reads.append(1) or real(s))
    p = packing.pack(x, Setting(bits=None), defer=True)
    assert (p.codec == "keep") == kept and len(reads) == (0 if kept else 1)
    assert torch.equal(bits_of(p.unpack()), bits_of(x))
    mask = (x > 0).float()  # a comparison saved as a float mask: encoded at any size
    assert packing.pack(mask, Setting(codec="mask", bits=None)).codec == "mask"


def test_a_quant_encoding_is_one_allocation(as_device):
    x = randn(3, 1001)
    enc = fused.encode(x, "quant", bits=4, group_size=64)
    packed, mins, scales = enc.buffers
    base = packed.untyped_storage().data_ptr()
    assert {b.untyped_storage().data_ptr() for b in enc.buffers} == {base}
    assert (mins.data_ptr() - base) % 16 == 0 and (scales.data_ptr() - base) % 16 == 0
    assert enc.to("cpu").to_bytes() == actcodec.encode(x.cpu(), "quant", bits=4,
                                                       group_size=64).to_bytes()


def test_a_sparse_save_is_encoded_again_as_auto_chooses(as_device):
    x = torch.relu(randn(4096, seed=1)) * (randn(4096, seed=2) > 1.0)  # ~16% nonzero
    p = packing.pack(x, Setting(bits=4), defer=True)
    assert p.codec == "quant"
    p.settle()
    want = fused.encode(x, "auto", bits=4)
    assert want.codec == "bitmap_quant" and p.codec == "bitmap_quant"
    assert p.enc.to("cpu").to_bytes() == want.to("cpu").to_bytes()
    assert p.unsettled is None


def test_a_nan_raises_the_c_paths_error_and_nothing_decodes(as_device):
    x = randn(5000, seed=3)
    x[1234] = float("nan")
    with pytest.raises(actcodec.NonFiniteError) as c:
        actcodec.encode(x.cpu(), bits=8)
    p = packing.pack(x, Setting(bits=8), defer=True)
    for _ in range(2):  # it stays unsettled: every read raises
        with pytest.raises(actcodec.NonFiniteError) as got:
            p.unpack()
        assert got.value.index == c.value.index == 1234
        assert p.unsettled is not None


def test_a_save_changed_in_place_before_it_settles_is_refused(as_device):
    x = torch.relu(randn(4096, seed=4)) * (randn(4096, seed=5) > 1.0)
    p = packing.pack(x, Setting(bits=8), defer=True)
    x.add_(1.0)
    with pytest.raises(RuntimeError, match="modified in place"):
        p.settle()


def test_the_tensor_is_let_go_once_settled(as_device):
    x = randn(4000, seed=6)
    p = packing.pack(x, Setting(bits=2), defer=True)
    held = p.unsettled
    assert held.t.data_ptr() == x.data_ptr() and held.nbytes == x.numel() * 4
    refs = [weakref.ref(held.t), weakref.ref(held.source)]
    del held
    p.settle()
    assert [r() for r in refs] == [None, None]  # nothing holds the tensor for it any more


class FakeUnread:
    def __init__(self, arrived):
        self.arrived, self.reads = arrived, 0

    def ready(self):
        return self.arrived

    def same_as_encode(self):
        self.reads += 1
        return True


class FakeSave:
    """A Packed stand-in: `nbytes` held until settled, statistics arrived or not."""

    def __init__(self, nbytes, arrived, done):
        self.codec, self.nbytes, self.done = "quant", 1, done
        self.unsettled = packing.Unsettled(FakeUnread(arrived), None,
                                           torch.empty(nbytes, dtype=torch.uint8), {}, True)
        self.settled = False

    def settle(self):
        self.settled, self.unsettled = True, None
        self.done.append(self)


def test_the_window_reads_what_arrived_and_waits_for_the_oldest_over_its_limit():
    done = []
    w = Window(limit=100)
    a, b, c = (FakeSave(n, False, done) for n in (60, 30, 50))
    w.add(a)
    w.add(b)
    assert done == [] and w.nbytes == 90  # under the limit, nothing arrived: no wait
    w.add(c)  # 140 > 100: the oldest is waited for, then it fits
    assert done == [a] and w.nbytes == 80 and len(w) == 2
    d = FakeSave(500, True, done)
    b.unsettled.unread.arrived = True  # b arrived; c has not: b is read, c stays
    w.add(d)  # over the limit with c still first: c is waited for; d arrived
    assert done == [a, b, c, d] and w.nbytes == 0
    big = FakeSave(1000, False, done)
    w.add(big)  # alone over the limit: held, never waited for at its own save
    assert done[-1] is d and len(w) == 1
    w.settle_all()
    assert done[-1] is big and w.nbytes == 0


def _model():
    torch.manual_seed(0)
    # the Threshold's output is sparse, and a Linear saves it as "auto": encoded again
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                               torch.nn.Linear(256, 256), torch.nn.Threshold(0.5, 0.0),
                               torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 8))


def _grads(model, x, policy, inside=False):
    """Gradients, accounting rows as the forward ended and bytes held then; inside: backward
    runs inside the context (it reads saves the window has not settled)."""
    model.zero_grad()
    with act.compress_saved(policy, model=model, guard=False) as ctx:
        loss = model(x).square().sum()
        if inside:
            loss.backward()
            again = model(x).sum()  # saves after it, with settled ones still in the window
    rows = {k: (dict(r.codecs), r.compressed_bytes) for k, r in ctx.stats.rows.items()}
    stored = ctx.stats.stored_bytes
    if inside:
        del again
    if not inside:
        loss.backward()
    return [p.grad.clone() for p in model.parameters()], rows, stored


@pytest.mark.parametrize("arrive,inside", [(True, False), (False, False), (False, True)])
def test_a_step_matches_the_waiting_path(as_device, monkeypatch, arrive, inside):
    from actcodec.torch.save import save as saving
    model = _model().to(GPU) if GPU else _model()
    x = randn(64, 64, seed=7)
    policy = act.Policy.preset("4bit")
    made = []
    real = saving.pack
    monkeypatch.setattr(saving, "pack", lambda *a, **k: made.append(k["defer"]) or real(*a, **k))
    if not arrive:  # settled at the forward's end, or by the backward inside the context
        monkeypatch.setattr(fused.Unread, "ready", lambda self: False)
    deferred, rows, held = _grads(model, x, policy, inside)
    assert any(made)  # the hooks' saves were deferred
    monkeypatch.setattr(saving, "pack", lambda *a, **k: real(*a, **{**k, "defer": False}))
    waited, wrows, wheld = _grads(model, x, policy, inside)
    for a, b in zip(deferred, waited):
        assert torch.equal(a, b)
    assert rows == wrows
    # the Threshold's output, once a forward
    assert rows[("4", "linear")][0] == {"bitmap_quant": 2 if inside else 1}
    assert held == wheld


@pytest.mark.parametrize("arrive", [True, False])
def test_a_nan_in_a_step_raises_by_the_end_of_forward_and_lets_go(as_device, monkeypatch,
                                                                 arrive):
    import gc
    from actcodec.torch.save import save as saving
    if not arrive:  # found at the forward's end, with saves still in the window
        monkeypatch.setattr(fused.Unread, "ready", lambda self: False)
    made = []
    real = saving.pack
    monkeypatch.setattr(saving, "pack", lambda *a, **k: made.append(k["defer"]) or real(*a, **k))
    model = _model().to(GPU) if GPU else _model()
    x = randn(64, 64, seed=8)
    x[3, 5] = float("inf")
    ctx = act.compress_saved(act.Policy.preset("8bit"), model=model, guard=False)
    out = None
    with pytest.raises(actcodec.NonFiniteError):
        with ctx:
            session = ctx.session
            out = model(x).sum()
    assert any(made) and len(session.unsettled) == 0
    del out
    gc.collect()
    assert ctx.stats.stored_bytes == 0  # nothing of the failed step is held
