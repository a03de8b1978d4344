"""actcodec.torch.Step: the training step within a memory limit. Gradients against plain
PyTorch's for each technique a plan combines, the limit's errors, bad input, faults, a limit
changed from another thread. (That the measured peak stays under the limit is the memory
command's to show, in fresh processes: `python -m actcodec memory --configs limit=...`.)"""
import dataclasses
import threading

import pytest
import torch
from torch import nn
import torch.nn.functional as F

import actcodec.torch as act
from actcodec import resident
from actcodec.torch.limit import blocks
from actcodec.torch.limit import limit_plan
from actcodec.torch.limit import step_profile

MiB = 1 << 20


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 4 * width), \
            nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, width=32, depth=4, batchnorm=False):
        super().__init__()
        self.stem = nn.Linear(8, width)
        self.bn = nn.BatchNorm1d(width) if batchnorm else nn.Identity()
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        h = self.bn(self.stem(x))
        for layer in self.layers:
            h = layer(h)
        return self.head(h).squeeze(-1)


def mse(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


def data(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randn(n, generator=g)


def model(seed=0, **kw):
    torch.manual_seed(seed)
    return Net(**kw)


def grads(m):
    return [p.grad.clone() if p.grad is not None else None for p in m.parameters()]


def plain_grads(batch, **kw):
    m = model(**kw)
    mse(m, batch).backward()
    return grads(m)


def close(a, b, rtol=1e-5, atol=1e-6):
    return all(torch.allclose(x, y, rtol=rtol, atol=atol) for x, y in zip(a, b))


def test_without_a_limit_it_is_plain_training_bit_for_bit():
    batch = data()
    m = model()
    loss = act.Step(m, loss_fn=mse)(batch)
    want = plain_grads(batch)
    assert all(torch.equal(x, y) for x, y in zip(grads(m), want))
    assert loss.item() == pytest.approx(mse(model(), batch).item(), rel=1e-6)


@pytest.mark.parametrize("plan", [
    {"micro_batches": 4},
    {"micro_batches": 5},  # uneven: 3, 3, 2, 2, 2
    {"micro_batches": 1, "recompute": [0, 1, 2, 3]},
    {"micro_batches": 3, "recompute": [1, 3], "storage": "lossless"},
    {"micro_batches": 2, "recompute": [0], "storage": "paged"},
])
def test_exact_plans_give_plain_gradients_up_to_summation_order(plan, tmp_path):
    batch = data()
    m = model()
    step = act.Step(m, loss_fn=mse, plan=plan, spill_dir=str(tmp_path))
    loss = step(batch)
    assert close(grads(m), plain_grads(batch))
    assert loss.item() == pytest.approx(mse(model(), batch).item(), rel=1e-5)
    assert step.stats.micro_batches == plan["micro_batches"]


def test_a_lossy_plan_stays_close():
    batch = data(64)
    m = model(width=64)
    act.Step(m, loss_fn=mse, plan={"micro_batches": 2, "storage": "8bit"})(batch)
    got = torch.cat([g.flatten() for g in grads(m)])
    want = torch.cat([g.flatten() for g in plain_grads(batch, width=64)])
    assert F.cosine_similarity(got, want, dim=0) > 0.999


def test_gradients_add_to_what_grad_holds():
    batch = data()
    m = model()
    mse(m, batch).backward()
    act.Step(m, loss_fn=mse, plan={"micro_batches": 3})(batch)
    assert close(grads(m), [2 * g for g in plain_grads(batch)])


def test_weighted_micro_batches_give_the_weighted_mean():
    x, y = data()
    w = torch.arange(1.0, 13.0)

    def weighted(m, b):
        xb, yb, wb = b
        return (wb * (m(xb) - yb) ** 2).sum() / wb.sum(), wb.sum()

    m = model()
    mse(m, (x, y)).backward()  # .grad held before the step stays, added to
    act.Step(m, loss_fn=weighted, plan={"micro_batches": 4})((x, y, w))
    ref = model()
    mse(ref, (x, y)).backward()
    weighted(ref, (x, y, w))[0].backward()
    assert close(grads(m), grads(ref))


def test_a_limit_plans_within_it_and_names_its_plan():
    batch = data(64)
    m = model(width=64)
    step = act.Step(m, limit=resident.rss() + 512 * MiB, loss_fn=mse)
    step(batch)
    assert isinstance(step.plan, limit_plan.Plan)
    assert "micro-batch" in step.describe()
    assert step.stats.limit == step.limit and step.stats.peak > 0
    assert close(grads(m), plain_grads(batch, width=64), rtol=1e-4, atol=1e-5)


def test_exact_forbids_lossy_storage():
    batch = data(64)
    step = act.Step(model(width=64), limit=resident.rss() + 256 * MiB, loss_fn=mse, exact=True)
    step(batch)
    assert all(s.exact for s in step.profile.storages)
    assert step.plan.storage in ("plain", "lossless", "paged")


def test_a_limit_below_the_floor_raises_and_leaves_grad_alone():
    m = model()
    # below what torch alone holds (half the RSS was not, after tests that left the heap
    # holding pages: the Step's floor counts what is in use)
    step = act.Step(m, limit=32 * MiB, loss_fn=mse)
    with pytest.raises(act.MemoryLimitError, match="nothing was added to .grad") as err:
        step(data())
    assert isinstance(err.value, MemoryError)
    assert err.value.needed is None and "smallest_limit()" in str(err.value)
    assert all(p.grad is None for p in m.parameters())


def test_a_limit_without_room_for_the_optimizers_step_is_refused_before_any_probe(
        monkeypatch):
    """Above what the process holds, below that and the optimizer's state and step: a probe
    would take the process past the limit only to learn that no plan fits."""
    m = model(width=1024)  # 134 MB of parameters: AdamW's state is twice that
    opt = torch.optim.AdamW(m.parameters())
    state = sum(p.numel() * p.element_size() for p in m.parameters()) * 2
    monkeypatch.setattr(step_profile, "measure", lambda *a, **k: pytest.fail("probed"))
    step = act.Step(m, limit=resident.rss() + state // 2, loss_fn=mse, optimizer=opt)
    with pytest.raises(act.MemoryLimitError, match="leaves no room") as err:
        step(data())
    assert err.value.needed is None and "optimizer's first step will add" in str(err.value)
    assert all(p.grad is None for p in m.parameters())


def test_batch_norm_keeps_one_micro_batch_unless_ghost_batch_norm_is_allowed():
    m = model(batchnorm=True)
    assert act.Step(m, limit="64GiB", loss_fn=mse)._split() is False
    assert act.Step(m, limit="64GiB", loss_fn=mse, ghost_batchnorm=True)._split() is True
    m.eval()
    assert act.Step(m, limit="64GiB", loss_fn=mse)._split() is True


def test_probes_leave_batch_norm_statistics_as_they_were():
    m = model(batchnorm=True)
    before = m.bn.running_mean.clone(), m.bn.num_batches_tracked.clone()
    step = act.Step(m, limit=resident.rss() + 512 * MiB, loss_fn=mse)
    step(data())
    ref = model(batchnorm=True)
    mse(ref, data()).backward()
    assert torch.allclose(m.bn.running_mean, ref.bn.running_mean)
    assert m.bn.num_batches_tracked == before[1] + 1


@pytest.mark.parametrize("limit, match", [("lots", "cannot read"), (-1, "0 or more"),
                                          (1.5, "number of bytes")])
def test_a_limit_that_is_not_a_size_is_refused(limit, match):
    with pytest.raises((ValueError, TypeError), match=match):
        act.Step(model(), limit=limit, loss_fn=mse)


def test_bad_batches_and_losses_are_named():
    step = act.Step(model(), loss_fn=mse)
    with pytest.raises(ValueError, match="no batch dimension"):
        step((torch.tensor(1.0), torch.tensor(2.0)))
    with pytest.raises(TypeError, match="a batch is a tensor"):
        step(3)
    with pytest.raises(ValueError, match="batch_size=5"):
        act.Step(model(), loss_fn=mse, batch_size=5)(data())
    with pytest.raises(ValueError, match=r"scalar loss .* shape \(12,\)"):
        act.Step(model(), loss_fn=lambda m, b: (m(b[0]) - b[1]) ** 2)(data())
    with pytest.raises(TypeError, match="needs loss_fn"):
        act.Step(model())(data())
    with pytest.raises(ValueError, match="bits"):
        act.Step(model(), bits=3)


def test_an_exception_in_a_micro_batch_leaves_grad_as_it_was_and_says_so():
    batch = data()
    calls = []

    def failing(m, b):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("data loader broke")
        return mse(m, b)

    m = model()
    with pytest.raises(RuntimeError, match="data loader broke") as err:
        act.Step(m, loss_fn=failing, plan={"micro_batches": 4})(batch)
    assert any("micro-batch 3 of 4" in n and ".grad is as it was" in n
               for n in err.value.__notes__)
    # what the first two micro-batches added was taken back: .grad is None as before
    assert all(p.grad is None for p in m.parameters())


def test_a_limit_lowered_from_another_thread_holds_from_the_next_step():
    batch = data(64)
    m = model(width=64)
    floor = resident.rss()
    step = act.Step(m, limit=floor + 1024 * MiB, loss_fn=mse)
    lowered = floor + 256 * MiB

    def loss_fn(model_, b):
        if threading.current_thread() is threading.main_thread() and step.stats.peak:
            t = threading.Thread(target=setattr, args=(step, "limit", lowered))
            t.start()
            t.join()
        return mse(model_, b)

    step.loss_fn = loss_fn
    step(batch)  # plans and probes
    step(batch)  # the limit is lowered during this one
    assert step.stats.limit == floor + 1024 * MiB
    step(batch)
    assert step.stats.limit == lowered == step.limit


def test_a_model_elsewhere_than_the_cpu_and_cuda_is_refused_clearly():
    m = model().to("meta")
    with pytest.raises(ValueError, match=r"the CPU .* and CUDA .* this model is on meta"):
        act.Step(m, limit="1GiB", loss_fn=mse)(data())


def test_grad_scaler_scales_the_gradients():
    batch = data()
    m = model()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    act.Step(m, loss_fn=mse, plan={"micro_batches": 3}, scaler=scaler)(batch)
    assert close(grads(m), [1024.0 * g for g in plain_grads(batch)], rtol=1e-4, atol=1e-3)


def test_it_runs_under_autocast():
    batch = data(32)
    m = model()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        act.Step(m, loss_fn=mse, plan={"micro_batches": 2, "recompute": [0, 2],
                                        "storage": "8bit"})(batch)
    assert all(torch.isfinite(g).all() for g in grads(m))


def test_repeated_blocks_are_found_in_the_module_tree():
    m = model()  # one instance: modules compare by identity
    found = blocks.find(m)
    assert len(found) == 4 and all(a is b for a, b in zip(found, m.layers))
    assert blocks.find(nn.Linear(2, 2)) == []


class EncoderDecoder(nn.Module):
    """Two stacks of layers of two classes, each stack a module holding its ModuleList (as
    T5's, BART's and Whisper's are): the layers, not the stacks nor the lists, are blocks."""

    class Cross(Block):
        def __init__(self, width):
            super().__init__(width)
            self.mix = nn.Linear(2 * width, width)

        def forward(self, x, memory):
            return super().forward(self.mix(torch.cat([x, memory], dim=-1)))

    class Stack(nn.Module):
        def __init__(self, layers):
            super().__init__()
            self.layers, self.norm = nn.ModuleList(layers), nn.LayerNorm(layers[0].up.in_features)

    def __init__(self, width=16, depth=2):
        super().__init__()
        self.encoder = self.Stack([Block(width) for _ in range(depth)])
        self.decoder = self.Stack([self.Cross(width) for _ in range(depth)])
        self.stem, self.head = nn.Linear(8, width), nn.Linear(width, 1)

    def forward(self, x):
        memory = self.stem(x)
        for layer in self.encoder.layers:
            memory = layer(memory)
        memory = self.encoder.norm(memory)
        h = memory
        for layer in self.decoder.layers:
            h = layer(h, memory)
        return self.head(self.decoder.norm(h)).squeeze(-1)


def test_an_encoders_and_a_decoders_layers_are_blocks_and_recompute_exactly():
    torch.manual_seed(0)
    m = EncoderDecoder()
    found = blocks.find(m)
    assert found == [*m.encoder.layers, *m.decoder.layers]
    batch = data()
    want = [g.clone() for g in torch.autograd.grad(mse(m, batch), list(m.parameters()))]
    with act.Step(m, loss_fn=mse, plan={"micro_batches": 1, "recompute": [0, 1, 2, 3]}) as step:
        step(batch)
    assert all(torch.equal(p.grad, w) for p, w in zip(m.parameters(), want))


def test_a_module_list_is_never_a_block_and_finer_lists_need_half_the_parameters():
    """A ModuleList is never called (a hook on it never runs): two of them are not blocks.
    Stages whose layers the class rule finds finer keep those layers; a layer list that
    holds less than half the parameters of the class rule's blocks does not replace them."""
    class Lists(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.ModuleList([Block(8), Block(8)])
            self.b = nn.ModuleList([EncoderDecoder.Cross(8), EncoderDecoder.Cross(8)])

    m = Lists()
    assert blocks.find(m) == [*m.a, *m.b]
    nested = nn.ModuleList([m.a, m.b])  # lists of lists: the lists' layers
    assert blocks.find(nn.Sequential(nested)) == [*m.a, *m.b]

    class Stages(nn.Module):  # a ResNet's: stages of layers in Sequentials
        def __init__(self):
            super().__init__()
            self.stages = nn.ModuleList(nn.Sequential(Block(8), Block(8)) for _ in range(2))

    m = Stages()
    assert blocks.find(m) == [layer for stage in m.stages for layer in stage]

    class Heads(nn.Module):  # two large blocks by attribute, a list of two small heads
        def __init__(self):
            super().__init__()
            self.one, self.two = Block(64), Block(64)
            self.heads = nn.ModuleList(nn.Sequential(nn.Linear(64, 2)) for _ in range(3))

    m = Heads()
    assert blocks.find(m) == [m.one, m.two]


def test_transformers_encoder_decoder_layers_are_blocks():
    tf = pytest.importorskip("transformers")
    bart = tf.BartForConditionalGeneration(tf.BartConfig(
        d_model=16, encoder_ffn_dim=32, decoder_ffn_dim=32, encoder_layers=2,
        decoder_layers=3, encoder_attention_heads=2, decoder_attention_heads=2,
        vocab_size=64, max_position_embeddings=32))
    assert [type(b).__name__ for b in blocks.find(bart)] == \
        ["BartEncoderLayer"] * 2 + ["BartDecoderLayer"] * 3
    for vocab in (64, 4096):
        # 4096: the shared embedding, which both stacks hold, outweighs the layers; the
        # stacks (each recomputed whole, holding all its layers' saves at once) are no blocks
        t5 = tf.T5ForConditionalGeneration(tf.T5Config(
            d_model=16, d_ff=32, d_kv=8, num_layers=2, num_decoder_layers=2, num_heads=2,
            vocab_size=vocab, decoder_start_token_id=0, pad_token_id=0))
        assert [type(b).__name__ for b in blocks.find(t5)] == ["T5Block"] * 4


def test_transformers_blocks_and_a_dict_batch():
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=3, n_embd=32, n_head=2, n_positions=32, vocab_size=64,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    gpt = tf.GPT2LMHeadModel(cfg)
    assert [type(b).__name__ for b in blocks.find(gpt)] == ["GPT2Block"] * 3
    ids = torch.randint(0, 64, (6, 32), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "labels": ids}
    act.Step(gpt, plan={"micro_batches": 3, "recompute": [0, 1, 2]})(batch)
    got = [p.grad.clone() for p in gpt.parameters()]
    gpt.zero_grad(set_to_none=True)
    gpt(**batch).loss.backward()
    want = [p.grad for p in gpt.parameters()]
    assert close(got, want, rtol=1e-4, atol=1e-6)


def test_a_budget_plan_spends_the_room_on_bits_and_never_goes_below_bits():
    batch = data(64)
    m = model(width=64)
    step = act.Step(m, limit=resident.rss() + 1024 * MiB, loss_fn=mse, bits=4,
                    plan={"micro_batches": 2, "storage": "budget"})
    step(batch)
    ctx = step._contexts["budget"]
    assert ctx.min_bits == 4 and ctx.budget > 0
    assert ctx.limit.sites and all(site.min_bits >= 4 for site in ctx.limit.sites.values())
    got = torch.cat([g.flatten() for g in grads(m)])
    want = torch.cat([g.flatten() for g in plain_grads(batch, width=64)])
    assert F.cosine_similarity(got, want, dim=0) > 0.999


def test_a_limit_lowered_mid_step_makes_room_at_once_in_what_the_budget_holds(tmp_path):
    batch = data(256)
    m = model(width=128)
    floor = resident.live()  # what Step counts as the floor (RSS less what allocators hold free)
    step = act.Step(m, limit=floor + 1024 * MiB, loss_fn=mse, spill_dir=str(tmp_path),
                    plan={"micro_batches": 1, "storage": "budget"})
    lowered = []

    def lower(module, args, out):  # in the forward, after the first blocks saved
        if not lowered:
            lowered.append(step._in_flight.budget)
            step.limit = step.limit - 1023 * MiB
    handle = m.layers[2].register_forward_hook(lower)
    step(batch)
    handle.remove()
    stats = step._contexts["budget"].stats
    assert lowered and step._contexts["budget"].budget == max(0, lowered[0] - 1023 * MiB)
    assert stats.spilled > 0 or stats.reencoded > 0
    got = torch.cat([g.flatten() for g in grads(m)])
    want = torch.cat([g.flatten() for g in plain_grads(batch, width=128)])
    assert F.cosine_similarity(got, want, dim=0) > 0.999


def test_a_measured_plan_gives_way_only_to_a_clearly_faster_one():
    """The first step of a plan not yet run is where the model errs: a plan that fits by its
    measured peak is kept unless the new one is predicted SWITCH_GAIN faster."""
    from actcodec.torch.limit import limit_plan as lp
    from actcodec.torch.limit import planning

    block = lp.Block(saved=4e5, inputs=1e4, forward=1e-3)
    profile = lp.Profile(batch=8, fixed=1e6, work=1e5, rest=1e5, blocks=(block,) * 2,
                         seconds=1e-2, per_micro_batch=1e-3, storages=(lp.PLAIN,),
                         split=True, effect=1.0, least=0.0)
    ran = lp.predict(profile, 4, (0,), lp.PLAIN)
    key = lp.memory_key(profile, 4, (0,), "plain")
    measured = lp.Measured(caution=0.25).learn(key, ran.peak, ran.peak)
    close = dataclasses.replace(lp.predict(profile, 4, (), lp.PLAIN), seconds=ran.seconds / 1.05)
    clear = dataclasses.replace(close, seconds=ran.seconds / (planning.SWITCH_GAIN * 1.01))
    assert planning.stay(close, ran, profile, 1e9, measured) == ran
    assert planning.stay(clear, ran, profile, 1e9, measured) == clear
    # the measured one no longer fits
    assert planning.stay(close, ran, profile, ran.peak - 1, measured) == close
