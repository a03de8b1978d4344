"""Position-wise children of repeated blocks (an MLP) in chunks of the sequence: the plain
gradient, chunk-sized work in forward and in backward (recomputed blocks included), less
saved for backward, never a child that mixes positions, nothing left on the model."""
import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import actcodec.torch as act
from actcodec.torch.limit import limit_plan as lp
from actcodec.torch.limit import mini_sequence

tf = pytest.importorskip("transformers")

VOCAB, TOKENS = 256, 256


def llama(seed=0):
    torch.manual_seed(seed)
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=128, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=TOKENS,
        bos_token_id=0, eos_token_id=0))


def gpt2(seed=0):
    torch.manual_seed(seed)
    return tf.GPT2LMHeadModel(tf.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, n_positions=TOKENS, vocab_size=VOCAB, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))


MODELS = {"llama": llama, "gpt2": gpt2}


def sample():
    ids = torch.randint(0, VOCAB, (1, TOKENS), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}


def flat_grad(m):
    return torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])


def mlp_of(model):
    block = model.model.layers[0] if hasattr(model, "model") else model.transformer.h[0]
    return block.mlp


def lengths_seen(module) -> list:
    """The sequence lengths `module`'s first weight layer is called with, forward and
    backward's recomputations alike."""
    seen = []
    first = next(m for m in module.modules() if m is not module)
    first.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[1]))
    return seen


@pytest.mark.parametrize("recompute", [(), (0, 1)])
@pytest.mark.parametrize("name", MODELS)
def test_chunks_give_the_plain_gradient_and_work_a_chunk_at_a_time(name, recompute):
    batch = sample()
    want = MODELS[name]()
    want(**batch).loss.backward()
    model = MODELS[name]()
    seen = lengths_seen(mlp_of(model))
    plan = lp.Plan(1, recompute, "plain", chunks=4)
    with act.Step(model, plan=plan, chunk_loss=False) as step:
        step(batch)
    got, ref = flat_grad(model), flat_grad(want)
    assert F.cosine_similarity(got, ref, dim=0) >= 0.99999
    assert (got - ref).norm() / ref.norm() < 1e-5
    # the check of the child (on its first tokens, whole and halves, once), then only
    # chunks (and the empty sequence the child's own forward is handed): in forward, in the
    # chunks' recomputation, and in a recomputed block's
    chunk, checked = TOKENS // 4, mini_sequence.CHECK_TOKENS
    assert seen[:3] == [checked, checked // 2, checked // 2], seen
    after_check = [n for n in seen[3:] if n]
    assert after_check and set(after_check) == {chunk}, seen
    # forward, then backward's recomputation of each chunk; a recomputed block's forward
    # again in between (which torch's checkpoint may stop early, once what it needs is back)
    assert len(after_check) == 8 if not recompute else 8 < len(after_check) <= 12, seen


def saved_bytes(model, batch, plan) -> int:
    total, seen = [0], set()

    def pack(t):  # each storage once (the chunks' inputs are views of one tensor)
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total[0] += t.untyped_storage().nbytes()
        return t

    with act.Step(model, plan=plan, chunk_loss=False) as step:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            step(batch)
    return total[0]


def test_chunks_keep_only_the_childs_input_for_backward():
    whole = saved_bytes(llama(), sample(), lp.Plan(1, (), "plain"))
    chunked = saved_bytes(llama(), sample(), lp.Plan(1, (), "plain", chunks=4))
    # an MLP of width 128 over 32 saves its gate, up, activation and product (4 x 128 per
    # token, float32) per block: all but its input go
    assert whole - chunked >= 2 * TOKENS * 4 * 128 * 4 * 0.9, (whole, chunked)


class CausalMix(nn.Module):
    """Two weight layers around a running mean over the sequence: not position-wise."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x):
        h = self.a(x).cumsum(1) / torch.arange(1, x.shape[1] + 1)[None, :, None]
        return self.b(h)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.mix = nn.LayerNorm(8), CausalMix()

    def forward(self, x):
        return x + self.mix(self.norm(x))


def test_a_child_that_mixes_positions_is_never_chunked():
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block())
    x = torch.randn(1, 128, 8)
    want = copy.deepcopy(model)
    want(x).square().mean().backward()
    seen = lengths_seen(model[0].mix)
    with act.Step(model, plan=lp.Plan(1, (), "plain", chunks=4),
                  loss_fn=lambda m, b: m(b).square().mean()) as step:
        step(x)
    assert max(seen) == 128 and 32 not in seen, seen  # the check's halves, then the whole
    assert torch.equal(flat_grad(model), flat_grad(want))


def test_the_check_of_a_child_with_dropout_draws_no_random_numbers_of_the_step():
    """GPT-2's MLP ends in a dropout: in training it is never chunked (its halves differ
    from its whole). Its check ran inside the step on the global generator, so every
    dropout after it drew other masks than plain training's."""
    def dropping():
        torch.manual_seed(0)
        return tf.GPT2LMHeadModel(tf.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, n_positions=TOKENS, vocab_size=VOCAB,
            resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1))

    batch = sample()
    model, reference = dropping(), dropping()
    torch.manual_seed(5)
    reference(**batch).loss.backward()
    torch.manual_seed(5)
    with act.Step(model, plan=lp.Plan(1, (), "plain", chunks=2)) as step:
        step(batch)
    assert torch.equal(flat_grad(model), flat_grad(reference))


def test_the_hooks_leave_nothing_on_the_model():
    model = llama()
    step = act.Step(model, limit=None)
    mlp = mlp_of(model)
    assert any(isinstance(h, mini_sequence._Enter) for h in mlp._forward_pre_hooks.values())
    clone = copy.deepcopy(model)
    pickle.loads(pickle.dumps(model))
    assert torch.isfinite(clone(**sample()).loss)  # inert in a copy
    second = act.Step(model, limit=None)  # a second Step shares them
    step.close()
    assert any(isinstance(h, mini_sequence._Enter) for h in mlp._forward_pre_hooks.values())
    second.close()
    assert not any(isinstance(h, (mini_sequence._Enter, mini_sequence._Leave))
                   for h in [*mlp._forward_pre_hooks.values(), *mlp._forward_hooks.values()])


def test_the_solver_offers_chunks_along_a_sequence_only():
    block = lp.Block(saved=100.0, inputs=10.0, forward=1e-6, local=60.0, local_inputs=10.0,
                     local_forward=5e-7)
    tokens = lp.Profile(batch=1024, fixed=1e5, work=0.0, rest=20.0, blocks=(block, block),
                        flat=1e5, unit="token", split=False)
    assert lp.chunk_counts(tokens) == [1, 2, 4, 8, 16]
    assert lp.chunk_counts(lp.Profile(batch=96, fixed=0, work=0, rest=0, blocks=(block,),
                                      unit="token")) == [1]
    assert lp.chunk_counts(lp.Profile(batch=1024, fixed=0, work=0, rest=0,
                                      blocks=(block,))) == [1]  # samples
    assert block.chunked(4) == (50.0, 15.0) and block.chunked(1) == (100.0, 0.0)
    plain = lp.predict(tokens, 1, (), lp.PLAIN)
    chunked = lp.predict(tokens, 1, (), lp.PLAIN, chunks=4)
    assert chunked.peak < plain.peak and chunked.seconds > plain.seconds
    assert chunked.chunks == 4 and lp.Plan.from_dict(chunked.to_dict()) == chunked
    # where only chunks fit, the solver picks them
    room = (plain.peak + chunked.peak) / 2
    assert lp.solve(dataclasses_replace(tokens, blocks=(block,)), 1e12).chunks == 1
    assert lp.solve(tokens, room, exact=True).chunks > 1


def test_no_chunk_whose_saves_would_go_to_the_c_heap():
    """A chunk count is offered only where a chunk's widest position-wise save reaches the
    allocator's floor: smaller, it lands among the heap's small allocations (a GPT-2's
    MLPs in chunks of 128 tokens peaked 1.7 times their model)."""
    block = lp.Block(saved=100.0, inputs=10.0, forward=1e-6, local=60.0, local_inputs=10.0,
                     local_forward=5e-7, local_widest=4096.0)
    tokens = lp.Profile(batch=2048, fixed=1e5, work=0.0, rest=20.0, blocks=(block,),
                        flat=1e5, unit="token", units=2048, split=False)
    assert lp.chunk_counts(tokens) == [1, 2, 4, 8, 16]  # no floor (a CUDA step's)
    floored = dataclasses_replace(tokens, chunk_floor=1 << 20)
    assert lp.chunk_counts(floored) == [1, 2, 4, 8]  # 256 tokens x 4 KiB = 1 MiB
    assert lp.chunk_counts(dataclasses_replace(lp.scaled(floored, 1024), batch=1024)) == [1, 2, 4]
    plans = [lp.solve(floored, room, exact=True) for room in (2.6e5, 2.8e5, 3.1e5, 1e12)]
    assert all(p is not None and p.chunks <= 8 for p in plans) and \
        any(p.chunks == 8 for p in plans)


def test_the_probe_records_the_widest_position_wise_save():
    """The profile's local_widest is the largest single tensor an MLP saves, per token (a
    projection's output here: 128 floats a token), not their sum."""
    from actcodec.torch.limit import meter as meters

    with act.Step(llama(), limit="64GiB", exact=True) as step:
        step(sample())
        profile = step.profile
    assert profile.unit == "token"
    for b in profile.blocks:
        assert 0 < b.local_widest < b.local
        assert b.local_widest == pytest.approx(128 * 4, rel=0.25)
    assert profile.chunk_floor == meters.ProcessMeter.heap_below > 0


def test_a_lean_probe_tells_each_blocks_moment_in_backward_apart():
    """With every block recomputed, each block's moment in backward holds its saves again,
    read in live bytes (the store's counter of pages in use, the heap's growth): the RSS of
    a step keeps the pages of what an earlier moment freed, so it could not tell them apart."""
    from actcodec.torch.limit import blocks as blocks_mod
    from actcodec.torch.limit import meter as meters
    from actcodec.torch.limit import step_profile
    from actcodec.torch.save import allocator as allocators

    allocators.ensure()
    torch.manual_seed(0)
    tokens = 1024
    model = tf.LlamaForCausalLM(tf.LlamaConfig(
        num_hidden_layers=2, hidden_size=256, intermediate_size=1024, num_attention_heads=4,
        num_key_value_heads=4, vocab_size=VOCAB, max_position_embeddings=tokens,
        bos_token_id=0, eos_token_id=0)).train()
    ids = torch.randint(0, VOCAB, (1, tokens), generator=torch.Generator().manual_seed(1))
    params = [p for p in model.parameters() if p.requires_grad]
    found = blocks_mod.find(model)
    attachment = blocks_mod.attach(found)
    meter = meters.ProcessMeter()

    def run(n):
        return model(input_ids=ids[:, :n], labels=ids[:, :n], use_cache=False).loss
    try:
        counted = step_profile.probe(run, params, tokens, meter=meter)
        lean = step_profile.probe(run, params, tokens, (0, 1), meter=meter, peak_only=True,
                                  moments=True)
    finally:
        attachment.release()
    assert counted.moments is None and set(lean.moments.blocks) == {0, 1}
    for i in (0, 1):  # each block's saves are back at once in its moment
        assert lean.moments.blocks[i] >= 0.8 * counted.saved[i]
    assert 0 < lean.moments.outside
    assert lean.state.moments is None  # the marks end with the probe


def dataclasses_replace(profile, **kw):
    import dataclasses

    return dataclasses.replace(profile, **kw)
