"""actcodec.torch.offload_saved: saves copied to (pinned) host memory in forward and back in
backward, exactly; the bookkeeping checked on the CPU with a stand-in for the CUDA copies
(synchronous copies that log what happens): which saves go, when each comes back, the
prefetch order, the pool's reuse."""
import pytest
import torch

import actcodec.torch as act
from actcodec.torch.save import offload


class LoggedCopies:
    """CudaCopies' interface on the CPU: copies made at once, a log of every call."""

    def __init__(self):
        self.log, self.made = [], 0

    def applies(self, t):
        return t.device.type == "cpu"

    def host_buffer(self, nbytes):
        self.made += 1
        return torch.full((nbytes,), 0xAB, dtype=torch.uint8)  # garbage where not written

    def to_host(self, t, host):
        offload.as_values(host, t.dtype, t.shape).copy_(t)
        self.log.append(("out", host.data_ptr()))
        return ("event", host.data_ptr())

    def wait(self, done):
        self.log.append(("wait", done[1]))

    def to_device(self, host, device):
        self.log.append(("in", host.data_ptr()))
        return host.clone(), ("event", host.data_ptr())

    def use(self, out, done):
        self.log.append(("use", done[1]))
        return out


def chain(x, n):
    """n exps in a row: each saves its output, and backward meets them in reverse."""
    for _ in range(n):
        x = torch.exp(x * 0.01)
    return x.sum()


def test_gradients_are_bit_identical_and_every_large_save_goes():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                torch.nn.LayerNorm(512), torch.nn.Linear(512, 256))
    x = torch.randn(128, 256)
    model(x).pow(2).mean().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    copies = LoggedCopies()
    ctx = act.offload_saved(min_bytes=4096, copies=copies)
    with ctx:
        loss = model(x).pow(2).mean()
    assert ctx.stats["saves"] >= 3 and ctx.stats["bytes"] >= 3 * 128 * 512 * 4
    loss.backward()
    for p, g in zip(model.parameters(), plain):
        assert torch.equal(p.grad, g)
    outs = [ptr for what, ptr in copies.log if what == "out"]
    ins = [ptr for what, ptr in copies.log if what == "in"]
    assert sorted(outs) == sorted(ins)  # each save went once and came back once


def test_backward_prefetches_the_saves_before_the_one_it_needs():
    x = torch.randn(64, 1024, requires_grad=True)
    copies = LoggedCopies()
    ctx = offload.Offload(copies, min_bytes=1024, prefetch=2)
    with ctx:
        loss = chain(x, 6)
    loss.backward()
    n = ctx.stats["saves"]
    assert n == 6
    # only the last save made is fetched on demand; each other one started ahead
    assert ctx.stats["on_demand"] == 1 and ctx.stats["prefetched"] == n - 1
    order = [ptr for what, ptr in copies.log if what == "out"]
    fetched = [ptr for what, ptr in copies.log if what == "in"]
    assert fetched == order[::-1]  # in the reverse of the order forward made them
    for i, (what, ptr) in enumerate(copies.log):
        if what == "use":  # every save's copy back started before the compute used it
            assert ("in", ptr) in copies.log[:i]
    used = [ptr for what, ptr in copies.log if what == "use"]
    assert used == order[::-1]
    x.grad = None
    loss = chain(x, 6)
    loss.backward()
    with_offload = x.grad.clone()
    x.grad = None
    with offload.Offload(LoggedCopies(), min_bytes=1024, prefetch=0) as c0:
        loss = chain(x, 6)
    loss.backward()
    assert c0.stats["on_demand"] == 6 and c0.stats["prefetched"] == 0
    assert torch.equal(x.grad, with_offload)


def test_the_pool_reuses_its_buffers_from_the_second_step():
    x = torch.randn(32, 1024, requires_grad=True)
    copies = LoggedCopies()
    ctx = offload.Offload(copies, min_bytes=1024)
    for step in range(3):
        with ctx:
            loss = chain(x, 5)
        loss.backward()
        del loss
        if step == 0:
            made = copies.made
            assert ctx.pool.held() == ctx.pool.made  # every buffer back once the graph is gone
    assert copies.made == made and ctx.pool.reused == 2 * ctx.stats["saves"] // 3 > 0


def test_small_saves_and_parameters_stay_views_go_as_their_values_once():
    w = torch.nn.Parameter(torch.randn(256, 512))
    x = torch.randn(512, 512)
    ctx = offload.Offload(LoggedCopies(), min_bytes=4096)
    with ctx:
        small = (torch.randn(8, requires_grad=True) * 2).exp().sum()
        assert ctx.stats["saves"] == 0  # small; the parameter is held anyway
        gaps = (x[:, ::2] @ w).sum()  # x's strided view saved for w's gradient
        assert ctx.stats["saves"] == 1
        h = torch.randn(64, 1024, requires_grad=True) * 1.0
        twice = (h.sin() + h.cos()).sum()  # h saved by two operations, copied once
        assert ctx.stats["saves"] == 2
    (small + gaps + twice).backward()
    assert torch.equal(w.grad, x[:, ::2].t() @ torch.ones(512, 512))


def test_forward_waits_for_the_oldest_copies_beyond_the_bytes_in_flight():
    x = torch.randn(64, 1024, requires_grad=True)  # each save: 256 KiB
    copies = LoggedCopies()
    ctx = offload.Offload(copies, min_bytes=1024, in_flight=3 * 256 * 1024)
    with ctx:
        loss = chain(x, 8)
    outs = [ptr for what, ptr in copies.log if what == "out"]
    waits = [ptr for what, ptr in copies.log if what == "wait"]
    assert waits == outs[:5]  # at most three running after each save
    for i, (what, ptr) in enumerate(copies.log):
        if what == "wait":
            running = {p for w, p in copies.log[:i] if w == "out"} - \
                {p for w, p in copies.log[:i] if w == "wait"}
            assert len(running) == 4  # the fourth made it wait for the oldest
    loss.backward()


def test_a_second_backward_through_the_graph_gets_the_bytes_again():
    x = torch.randn(64, 1024, requires_grad=True)
    with offload.Offload(LoggedCopies(), min_bytes=1024):
        loss = chain(x, 3)
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    loss.backward()
    assert torch.equal(x.grad, 2 * first)


@pytest.mark.parametrize("nbytes", [1, 7, 4096, 65537, (1 << 20) + 1, 3 << 20, (5 << 30) + 3])
def test_size_classes_hold_the_request_with_little_waste(nbytes):
    size = offload.size_class(nbytes)
    assert size >= nbytes
    if nbytes > 1 << 20:
        assert size <= nbytes * 1.125 + 1
    else:
        assert size & (size - 1) == 0


def test_a_buffer_goes_back_to_copies_of_the_device_it_served():
    """Each device copies on its own side stream: a buffer a copy back on one device may still
    read is not handed to a copy out on another, whose stream would not wait for it."""
    made = []
    pool = offload.PinnedPool(lambda n: made.append(n) or torch.empty(n, dtype=torch.uint8))
    first = pool.take(4096, "cuda:0")
    pool.give(first, "cuda:0")
    assert pool.take(4096, "cuda:1") is not first and pool.reused == 0
    assert pool.take(4096, "cuda:0") is first and pool.reused == 1
    assert made == [4096, 4096]


def test_a_negative_prefetch_is_refused():
    with pytest.raises(ValueError, match="prefetch"):
        offload.Offload(LoggedCopies(), prefetch=-1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_gradients_are_bit_identical():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                                torch.nn.Linear(2048, 512)).cuda()
    x = torch.randn(1024, 512, device="cuda")
    model(x).pow(2).mean().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ctx = act.offload_saved()
    for _ in range(2):
        model.zero_grad()
        with ctx:
            loss = model(x).pow(2).mean()
        loss.backward()
    assert ctx.stats["saves"] >= 4
    for p, g in zip(model.parameters(), plain):
        assert torch.equal(p.grad, g)
