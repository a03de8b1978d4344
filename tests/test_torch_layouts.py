"""Saves come back as they were saved (shape, strides, memory format, alignment, broadcast
dimensions), so lossless compression changes no gradient bit: channels_last CNNs, attention
blocks, and models from a library nobody here wrote (transformers, built from a config)."""
import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from actcodec.torch import Policy, compress_saved, convert  # noqa: E402
from actcodec.torch.codecs import packed as packing  # noqa: E402
from actcodec.torch.codecs.packed import ALIGN  # noqa: E402

LOSSLESS = packing.Setting(bits=None)


def _relu(*shape):
    return torch.relu(torch.randn(*shape))


VIEWS = {
    "contiguous": lambda: _relu(4, 8, 6, 6),
    "channels_last": lambda: _relu(4, 8, 6, 6).contiguous(memory_format=torch.channels_last),
    "transposed": lambda: _relu(300, 70).t(),
    "permuted": lambda: _relu(5, 40, 30).permute(2, 0, 1),
    "sliced": lambda: _relu(64, 90)[:, ::3],
    "offset": lambda: _relu(10_000)[3:9_003].view(100, 90),
    "head_of_fused_qkv": lambda: _relu(2, 33, 3, 4, 16).unbind(2)[1].transpose(1, 2),
    "broadcast": lambda: _relu(1, 50, 1).expand(40, 50, 30),
    "broadcast_channels_last": lambda: _relu(1, 8, 5, 5).contiguous(
        memory_format=torch.channels_last).expand(6, 8, 5, 5),
    "size_one_dims": lambda: _relu(1, 1, 4000).transpose(0, 2),
    "empty": lambda: torch.empty(0, 5),
    "scalar": lambda: torch.tensor(2.5),
    "bool_channels_last": lambda: (torch.randn(4, 8, 6, 6) > 0).contiguous(
        memory_format=torch.channels_last),
    "half_transposed": lambda: _relu(200, 30).half().t(),
}


@pytest.mark.parametrize("name", VIEWS)
@pytest.mark.parametrize("bits", [None, 8])
def test_every_view_comes_back_with_its_layout(name, bits):
    torch.manual_seed(0)
    t = VIEWS[name]()
    packed = packing.pack(t, packing.Setting(bits=bits))
    back = packed.unpack()
    assert back.shape == t.shape and back.stride() == t.stride() and back.dtype == t.dtype
    assert back.data_ptr() % ALIGN == t.data_ptr() % ALIGN
    if bits is None or t.dtype == torch.bool:
        assert torch.equal(back, t)
    else:
        assert torch.allclose(back, t, atol=t.abs().max().item() / 100 if t.numel() else 0)
    if packed.enc is not None and "broadcast" in name:  # stored once, not once per repeat
        base = t.numel() // (t.shape[0] * (t.shape[2] if name == "broadcast" else 1))
        assert packed.original_nbytes == base * t.element_size()


def test_dense_layouts_are_encoded_and_decoded_in_place(monkeypatch):
    """channels_last and transposes are dense: no copy to encode, none to restore."""
    views = [VIEWS[name]() for name in ("channels_last", "transposed", "permuted",
                                        "broadcast_channels_last")]
    copies = []
    for method in ("contiguous", "clone", "copy_"):
        real = getattr(torch.Tensor, method)
        monkeypatch.setattr(torch.Tensor, method, lambda self, *a, _r=real, **k:
                            copies.append(self.shape) or _r(self, *a, **k))
    for t in views:
        assert torch.equal(packing.pack(t, LOSSLESS).unpack(), t)
    assert copies == []


def test_overlapping_views_are_kept_as_they_are():
    base = torch.randn(1000)
    windows = base.as_strided((100, 20), (5, 1))  # each element in several windows
    packed = packing.pack(windows, LOSSLESS)
    assert packed.is_kept and packed.unpack().data_ptr() == windows.data_ptr()


# ---- gradients, bit for bit ----

def cnn(channels_last: bool):
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32),
        nn.ReLU(), nn.Conv2d(32, 32, 1), nn.SiLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(32, 10))
    return m.to(memory_format=torch.channels_last) if channels_last else m


class Attention(nn.Module):
    """Fused qkv, heads by view and transpose, softmax(q k^T) v, output projection."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        torch.manual_seed(0)
        self.heads, self.ln = heads, nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        return x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))


def grads(model, inputs, ctx=None, loss=None):
    model.zero_grad(set_to_none=True)
    loss = loss or (lambda out: out.float().square().mean())
    if ctx is None:
        value = loss(model(**inputs) if isinstance(inputs, dict) else model(inputs))
    else:
        with ctx:
            value = loss(model(**inputs) if isinstance(inputs, dict) else model(inputs))
    value.backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def assert_bit_identical(a, b):
    assert len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b))


def _image(channels_last):
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


@pytest.mark.parametrize("channels_last", [False, True])
def test_cnn_hooks_and_functions_bit_identical(channels_last):
    model, x = cnn(channels_last), _image(channels_last)
    plain = grads(model, x)
    hooks = compress_saved(Policy.preset("lossless", min_bytes=0))
    assert_bit_identical(plain, grads(model, x, hooks))
    assert hooks.stats.tensors > 0
    converted = convert(copy.deepcopy(model), Policy.preset("lossless", min_bytes=0))
    assert_bit_identical(plain, grads(converted, x))


def test_attention_block_bit_identical():
    model = Attention()
    x = torch.randn(3, 17, 64, generator=torch.Generator().manual_seed(2))
    plain = grads(model, x)
    assert_bit_identical(plain, grads(model, x, compress_saved(bits=None, min_bytes=0)))
    converted = convert(copy.deepcopy(model), Policy.preset("lossless", min_bytes=0))
    assert_bit_identical(plain, grads(converted, x))


# ---- real clients: transformers models from a config (random weights, nothing downloaded) ----

def _gpt2():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64,
                                  vocab_size=128, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0)
    ids = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(3))
    return transformers.GPT2LMHeadModel(cfg), {"input_ids": ids, "labels": ids}


def _resnet(channels_last):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.ResNetConfig(depths=[1, 1], hidden_sizes=[16, 32], embedding_size=16,
                                    layer_type="basic", num_labels=5)
    model = transformers.ResNetForImageClassification(cfg)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), \
            x.contiguous(memory_format=torch.channels_last)
    return model, {"pixel_values": x, "labels": torch.tensor([0, 1, 2, 3])}


CLIENTS = {"gpt2": _gpt2, "resnet": lambda: _resnet(False),
           "resnet_channels_last": lambda: _resnet(True)}


@pytest.mark.parametrize("client", CLIENTS)
def test_transformers_models_bit_identical(client):
    model, inputs = CLIENTS[client]()
    model.train()
    loss = (lambda out: out.loss)
    plain = grads(model, inputs, loss=loss)
    hooks = compress_saved(Policy.preset("lossless", min_bytes=0), model=model)
    assert_bit_identical(plain, grads(model, inputs, hooks, loss=loss))
    assert hooks.stats.tensors > 0
    converted = convert(copy.deepcopy(model), Policy.preset("lossless", min_bytes=0))
    assert_bit_identical(plain, grads(converted, inputs, loss=loss))
