"""The shortcuts change bytes and time, never values: the sampled density test that skips the
bitmap pass of `auto` on dense arrays and tensors (and its C sample kernel against a numpy
reference), and the decoded tensor shared by the ops that saved the same tensor."""
import contextlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import actcodec
from actcodec import _ext, bitmap, choice, encoder

torch = pytest.importorskip("torch")  # the torch extra; CI installs it
nn = torch.nn

from actcodec.torch import Policy, Setting, compress_saved  # noqa: E402
from actcodec.torch.codecs import packed as packing  # noqa: E402

UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


M64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def sample_reference(bits: np.ndarray, runs: int, run_len: int):
    """Run r starts at r * stride plus a hashed offset within its stretch (actcodec.h)."""
    stride = bits.size // runs
    starts = [r * stride + splitmix64(r) % (stride - run_len + 1) for r in range(runs)]
    sample = np.stack([bits[s:s + run_len] for s in starts])
    counts = np.count_nonzero(sample, axis=1).astype(np.uint64)
    nonzero = sample[sample != 0]
    one = bool(nonzero.size) and bool((nonzero == nonzero[0]).all())
    return int(counts.sum()), int((counts * counts).sum()), one


@settings(max_examples=200, deadline=None)
@given(esize=st.sampled_from([2, 4, 8]), n=st.integers(1, 3000), runs=st.integers(1, 70),
       run_len=st.integers(1, 70), p_zero=st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]),
       values=st.sampled_from(["random", "one", "two"]), seed=st.integers(0, 2**32 - 1))
def test_sample_nonzero_matches_reference(esize, n, runs, run_len, p_zero, values, seed):
    rng = np.random.default_rng(seed)
    dt = UINT[esize]
    if values == "random":
        bits = rng.integers(1, np.iinfo(dt).max, n, dtype=dt, endpoint=True)
    else:
        bits = rng.choice(np.array([7, 1 << (8 * esize - 1)][: 1 if values == "one" else 2],
                                   dtype=dt), n)
    bits[rng.random(n) < p_zero] = 0
    raw = bits.view(np.uint8)
    if runs * run_len > n:
        with pytest.raises(ValueError, match="do not fit"):
            _ext.sample_nonzero(raw, esize, runs, run_len)
        return
    assert _ext.sample_nonzero(raw, esize, runs, run_len) == sample_reference(bits, runs, run_len)


@settings(max_examples=100, deadline=None)
@given(esize=st.sampled_from([2, 4, 8]), n=st.integers(0, 20000),
       p_zero=st.sampled_from([0.0, 0.05, 0.5, 0.95, 1.0]), seed=st.integers(0, 2**32 - 1))
def test_nonzero_share_floor_is_the_sample_minus_five_standard_errors(esize, n, p_zero, seed):
    rng = np.random.default_rng(seed)
    bits = rng.integers(1, 1000, n).astype(UINT[esize])
    bits[rng.random(n) < p_zero] = 0
    low, one = _ext.nonzero_share_floor(bits.view(np.uint8), esize)
    if n < 64 * 64:
        assert (low, one) == (0.0, False)
        return
    nnz, sumsq, want_one = sample_reference(bits, 64, 64)
    mean = nnz / 4096
    var = max(0.0, sumsq / 64**3 - mean * mean)
    want = max(0.0, mean - 5 * (var / 64) ** 0.5 - 1 / 64)
    assert one == want_one and low == pytest.approx(want, abs=1e-12)


def test_sample_nonzero_rejects_bad_arguments():
    with pytest.raises(ValueError, match="whole number"):
        _ext.sample_nonzero(np.zeros(7, np.uint8), 4, 1, 1)
    with pytest.raises(ValueError):
        _ext.sample_nonzero(np.zeros(8, np.uint8), 3, 1, 1)
    with pytest.raises(ValueError, match="do not fit"):
        _ext.sample_nonzero(np.zeros(8, np.uint8), 4, 0, 1)


N = 1 << 18  # above the sampling threshold


@pytest.mark.parametrize("bits", [None, 2, 4, 8])
def test_dense_tensors_skip_the_bitmap_pass_and_match_the_exact_choice(bits, monkeypatch):
    x = torch.randn(N)
    setting = Setting(bits=bits, group_size=64)
    assert exact_choice(x, setting) == ("raw" if bits is None else "quant")
    calls = []
    real = bitmap.scan
    monkeypatch.setattr(bitmap, "scan",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    packed = packing.pack(x, setting)
    numpy_users = actcodec.encode(x.numpy(), bits=bits, group_size=64)
    assert calls == []
    assert numpy_users.codec == exact_choice(x, setting)
    if bits is None:  # raw would be a copy of the same bytes: the tensor itself is kept
        assert packed.is_kept and packed.kept.data_ptr() == x.data_ptr()
    else:
        assert packed.codec == "quant"
        assert torch.equal(packed.unpack(), torch.from_numpy(numpy_users.decode()))


@pytest.mark.parametrize("make,codec", [
    (lambda: torch.relu(torch.randn(N)), "bitmap_quant"),               # half zeros
    (lambda: torch.nn.functional.dropout(torch.ones(N), 0.1), "mask"),  # 90% one value
    (lambda: torch.full((N,), 2.5), "mask"),                            # constant
    (lambda: torch.zeros(N), "bitmap"),                                 # all zeros
])
def test_sparse_masks_and_constants_take_the_exact_path(make, codec):
    packed = packing.pack(make(), Setting(bits=8))
    assert packed.codec == codec


def test_structured_sparsity_is_never_mistaken_for_dense():
    # Whole zero planes (dead channels) between dense ones: runs disagree, the margin holds.
    x = torch.randn(64, 64, 64)
    x[::2] = 0
    assert packing.pack(x, Setting(bits=2, group_size=64)).codec == "bitmap_quant"


class ReluConv(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))  # relu's output is saved by relu and by conv b


def test_a_tensor_saved_twice_is_decoded_once_per_backward(monkeypatch):
    model, x = ReluConv(), torch.randn(4, 3, 32, 32)
    decodes = []
    real = packing.Packed.restore
    monkeypatch.setattr(packing.Packed, "restore",
                        lambda self: (self.is_kept or decodes.append(self)) and 0 or real(self))
    # guard=False: a profile step decodes saves again to measure them (test_sensitivity)
    with compress_saved(Policy.preset("8bit", min_bytes=0), guard=False) as c:
        loss = model(x).square().mean()
    assert c.stats.deduplicated >= 1
    loss.backward(retain_graph=True)
    first = [p.grad.clone() for p in model.parameters()]
    assert len(decodes) == len(set(map(id, decodes))) == c.stats.tensors
    model.zero_grad()
    loss.backward()  # a second backward decodes again, and gets the same gradients
    assert len(decodes) == 2 * c.stats.tensors
    assert all(torch.equal(a, p.grad) for a, p in zip(first, model.parameters()))


def test_the_shared_decoded_tensor_is_dropped_with_its_last_use():
    packed = packing.pack(torch.relu(torch.randn(N)), Setting(bits=8))
    packed.uses = 2
    first = packed.unpack()
    assert packed._decoded is first
    assert packed.unpack() is first and packed._decoded is None
    third = packed.unpack()  # the next backward starts over
    assert third is not first and torch.equal(third, first)


def exact_choice(t: torch.Tensor, setting: Setting) -> str:
    """The choice the full count makes."""
    return choice.smallest(encoder.sizes(t.numpy(), setting.bits, setting.group_size))


def dense_first_channel(batch):
    x = torch.relu(torch.randn(batch, 64, 16, 16) - 1.5)  # ~7% nonzero
    x[:, 0] = torch.rand(batch, 16, 16) + 0.1            # but channel 0 of every sample dense
    return x


def padded_sequences():
    x = torch.randn(64, 128, 256)
    for i, length in enumerate(torch.randint(8, 64, (64,))):
        x[i, length:] = 0                                # masked positions, ~30% nonzero
    return x


@pytest.mark.parametrize("make", [lambda: dense_first_channel(64),
                                  lambda: dense_first_channel(128), padded_sequences],
                         ids=["channel0-b64", "channel0-b128", "padded"])
@pytest.mark.parametrize("bits", [None, 4, 8])
def test_batch_aligned_layouts_do_not_fool_the_sample(make, bits):
    # Runs evenly spaced by n/64 would read the same spot of every sample of a batch of 64 or
    # 128 (all dense here) and send these sparse tensors to quant or keep them whole.
    torch.manual_seed(0)
    x = make()
    setting = Setting(bits=bits, group_size=64)
    packed = packing.pack(x, setting)
    assert packed.enc is not None and packed.codec == exact_choice(x, setting)


@pytest.mark.parametrize("preset", [None, "lossless", "8bit"])
def test_inplace_change_of_a_save_raises_like_plain_pytorch(preset):
    w = torch.randn(256, 256, requires_grad=True)
    x = torch.randn(256, 256)
    ctx = compress_saved(Policy.preset(preset)) if preset else contextlib.nullcontext()
    with ctx:
        h = x @ w            # dense: lossless keeps h itself, 8-bit an encoded copy
        y = h.sin().sum()
    h.detach().mul_(0)       # bumps h's version: sin's backward would read the wrong values
    if preset == "8bit":     # works from its own copy, as it always did
        y.backward()
        assert torch.isfinite(w.grad).all()
    else:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()
