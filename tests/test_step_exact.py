"""act.Step's micro-batches give the plain full-batch gradient for the losses people use
(transformers' mean over target tokens, padded labels of -100, a causal LM's shift,
sequence-level labels, `num_items_in_batch`, a loss_fn's (loss, weight)), also where a
micro-batch holds no target; and an exception anywhere in a step leaves .grad as it was.
Tiny transformers models built from configs (random init, nothing downloaded)."""
import torch
import torch.nn.functional as F
import pytest
from torch import nn

import actcodec.torch as act
from actcodec.torch.limit import loss_weights

tf = pytest.importorskip("transformers")

VOCAB, PAD = 128, 127


def gpt2(seed=0):
    torch.manual_seed(seed)
    return tf.GPT2LMHeadModel(tf.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, n_positions=64, vocab_size=VOCAB, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=PAD))


def llama(seed=0):
    torch.manual_seed(seed)
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=0, pad_token_id=PAD))


MODELS = {"gpt2": gpt2, "llama": llama}


def padded(lengths, width=16, seed=1):
    """A right-padded batch as Hugging Face collators give it: rows of `lengths` tokens,
    the rest PAD, masked out, and labelled -100 (a length of 0: a row with no target)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, PAD, (len(lengths), width), generator=g)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    ids[mask == 0] = PAD
    mask[:, 0] = 1  # every row attends to something (a row of no token is all padding)
    labels = ids.masked_fill(torch.arange(width) >= torch.tensor(lengths)[:, None], -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def flat_grad(m):
    return torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])


def plain(make, batch):
    m = make()
    loss = m(**batch).loss
    loss.backward()
    return loss.detach(), flat_grad(m)


def assert_same(got, want, rel=1e-5):
    assert torch.isfinite(got).all(), "NaN or inf in .grad"
    assert F.cosine_similarity(got, want, dim=0) >= 0.99999
    assert (got - want).norm() / want.norm() < rel


CASES = {
    # 3 micro-batches of 2, 2, 1 rows, lengths all different
    "uneven": ([16, 3, 9, 12, 5], 3),
    # the padding all in the first micro-batch: its rows have a few tokens, the other's all
    "concentrated": ([2, 3, 1, 16, 16, 16], 2),
    # the last micro-batch holds no target (its loss is NaN in transformers)
    "last_without_target": ([16, 7, 12, 9, 0, 1], 3),  # (a row of 1 token has no target)
    "first_without_target": ([1, 0, 16, 7, 12, 9], 3),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", MODELS)
def test_padded_labels_give_the_plain_gradient(name, case):
    lengths, k = CASES[case]
    batch = padded(lengths)
    m = MODELS[name]()
    step = act.Step(m, plan={"micro_batches": k})
    loss = step(batch)
    want_loss, want = plain(MODELS[name], batch)
    assert step.stats.micro_batches == k
    assert_same(flat_grad(m), want)
    assert loss.item() == pytest.approx(want_loss.item(), rel=1e-5)


def test_the_causal_shift_is_read_from_the_model():
    assert loss_weights.shifts_labels(gpt2()) and loss_weights.shifts_labels(llama())
    cls = tf.GPT2ForSequenceClassification(tf.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB, pad_token_id=PAD))
    assert not loss_weights.shifts_labels(cls)
    batch = padded([16, 3, 0])
    # a causal LM's row of n tokens has n - 1 targets; a row of 1 or 0 has none
    assert loss_weights.targets(gpt2(), batch) == 15 + 2
    assert loss_weights.targets(cls, batch) == 16 + 3
    given = {**batch, "shift_labels": torch.full((3, 16), -100)}
    given["shift_labels"][0, :4] = 1  # shifted by the collator: counted as they are
    assert loss_weights.targets(gpt2(), given) == 4


def test_targets_per_sample_are_counted_once_per_step_without_a_read_per_micro_batch(
        monkeypatch):
    batch = padded([16, 3, 0])
    per = loss_weights.per_sample_targets(gpt2(), batch, 3)
    assert per.tolist() == [15, 2, 0] and per.device == batch["labels"].device
    assert loss_weights.per_sample_targets(gpt2(), batch, 4) is None  # not one row each
    assert loss_weights.per_sample_targets(gpt2(), {"labels": torch.zeros(0, 5).long()},
                                           0).tolist() == []
    assert loss_weights.per_sample_targets(gpt2(), {"labels": torch.zeros(2, 0).long()},
                                           2).tolist() == [0, 0]
    assert loss_weights.per_sample_targets(gpt2(), {"labels": torch.rand(3, 2)}).tolist() == \
        [2, 2, 2]
    reads = []
    real = loss_weights.OnTheWay.read
    monkeypatch.setattr(loss_weights.OnTheWay, "read",
                        lambda self: reads.append(1) or real(self))
    m = gpt2()
    step = act.Step(m, plan={"micro_batches": 3})
    step(padded([16, 3, 9]))
    assert step.stats.micro_batches == 3 and reads == [1]


def test_sequence_level_labels_weigh_by_the_labels_not_ignored():
    def make():
        torch.manual_seed(0)
        return tf.GPT2ForSequenceClassification(tf.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, num_labels=3,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=PAD))

    batch = padded([16, 3, 9, 12, 5, 7])
    batch["labels"] = torch.tensor([2, -100, -100, -100, 0, 1])  # 1 of 3, then 2 of 3
    m = make()
    act.Step(m, plan={"micro_batches": 2})(batch)
    assert_same(flat_grad(m), plain(make, batch)[1])


@pytest.mark.parametrize("name", MODELS)
def test_num_items_in_batch_makes_the_micro_batches_add_up(name):
    # as transformers' Trainer passes it: the loss is a sum over the given count, here of
    # a larger batch (gradient accumulation); a micro-batch without a target adds 0
    batch = {**padded([16, 7, 12, 9, 0, 1]), "num_items_in_batch": torch.tensor(97)}
    m = MODELS[name]()
    loss = act.Step(m, plan={"micro_batches": 3})(batch)
    want_loss, want = plain(MODELS[name], batch)
    assert_same(flat_grad(m), want)
    assert loss.item() == pytest.approx(want_loss.item(), rel=1e-5)


def bert_mlm(seed=0):  # a masked LM whose loss is a mean of its own
    torch.manual_seed(seed)
    return tf.BertForMaskedLM(tf.BertConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        vocab_size=VOCAB, max_position_embeddings=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=PAD))


def t5(seed=0):  # an encoder-decoder whose loss is a mean of its own
    torch.manual_seed(seed)
    return tf.T5ForConditionalGeneration(tf.T5Config(
        d_model=32, d_ff=64, d_kv=16, num_heads=2, num_layers=2, vocab_size=VOCAB,
        dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=PAD))


@pytest.mark.parametrize("make", [bert_mlm, t5], ids=["bert_mlm", "t5"])
def test_num_items_in_batch_that_the_models_loss_ignores_weighs_by_targets(make):
    """BERT's and T5's losses are a mean over the targets whatever num_items_in_batch says
    (transformers' Trainer passes it to every model whose forward takes **kwargs): the
    micro-batches are weighed by their targets, not added (4 micro-batches gave 4x the
    gradient)."""
    batch = {**padded([16, 7, 12, 9, 0, 1]), "num_items_in_batch": torch.tensor(97)}
    assert not loss_weights.divides_by_items(make())
    assert loss_weights.divides_by_items(gpt2()) and loss_weights.divides_by_items(nn.Linear(2, 2))
    m = make()
    loss = act.Step(m, plan={"micro_batches": 3})(batch)
    want_loss, want = plain(make, batch)
    assert_same(flat_grad(m), want)
    assert loss.item() == pytest.approx(want_loss.item(), rel=1e-5)


def llama_classifier(seed=0, **kw):  # transformers' shared head: its loss gets no kwargs
    torch.manual_seed(seed)
    return tf.LlamaForSequenceClassification(tf.LlamaConfig(
        num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
        pad_token_id=PAD, **kw))


@pytest.mark.parametrize("labels", ["classes", "multi_label"])
def test_num_items_in_batch_that_a_classifiers_loss_ignores_weighs_by_samples(labels):
    """A loss called without the count (Llama's classification head), and a multi-label one
    (float labels: transformers sets problem_type from them at the first forward): a mean,
    so the micro-batches are weighed (3 micro-batches gave 3x the gradient)."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, PAD, (6, 12), generator=g)
    if labels == "classes":
        make, y = (lambda: llama_classifier(num_labels=3)), torch.tensor([0, 1, 2, 0, 1, 2])
    else:
        make = lambda: llama_classifier(num_labels=3)  # noqa: E731
        y = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]] * 3)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": y,
             "num_items_in_batch": torch.tensor(6)}
    assert not loss_weights.divides_by_items(make(), batch)
    m = make()
    loss = act.Step(m, plan={"micro_batches": 3})(batch)
    want_loss, want = plain(make, batch)
    assert_same(flat_grad(m), want)
    assert loss.item() == pytest.approx(want_loss.item(), rel=1e-5)


def test_a_loss_fn_weight_of_zero_adds_nothing_even_where_its_loss_is_nan():
    def masked_mse(m, b):
        x, y, keep = b
        err = (m(x).squeeze(-1) - y) ** 2 * keep
        return err.sum() / keep.sum(), keep.sum()  # 0/0 where nothing is kept

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 16), nn.GELU(), nn.Linear(16, 1))

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(9, 4, generator=g), torch.randn(9, generator=g)
    keep = torch.tensor([1.0, 1, 0, 1, 1, 1, 0, 0, 0])  # the last micro-batch keeps nothing
    m = make()
    loss = act.Step(m, loss_fn=masked_mse, plan={"micro_batches": 3})((x, y, keep))
    ref = make()
    want_loss = masked_mse(ref, (x, y, keep))[0]
    want_loss.backward()
    assert_same(flat_grad(m), flat_grad(ref))
    assert loss.item() == pytest.approx(want_loss.item(), rel=1e-5)


def test_a_micro_batch_without_a_target_keeps_ddp_in_sync(tmp_path):
    """Under DistributedDataParallel (gloo, one rank) the last micro-batch run reduces the
    gradients: where the plan's last holds no target, the last that does takes the sync.
    A step that left DDP without its reduction fails at the next forward."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        model = nn.parallel.DistributedDataParallel(gpt2())
        calls = []

        def counting(state, bucket):
            calls.append(1)
            fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])

        model.register_comm_hook(None, counting)
        batch = padded([16, 7, 12, 9, 0, 1])
        step = act.Step(model, plan={"micro_batches": 3})
        for _ in range(2):
            calls.clear()
            model.zero_grad(set_to_none=True)
            step(batch)
            assert calls, "no all-reduce: DDP did not sync"
            assert_same(flat_grad(model), plain(gpt2, batch)[1])
    finally:
        dist.destroy_process_group()


# -- an exception anywhere in a step leaves .grad as it was ---------------------------------
class Fail(Exception):
    pass


def failing_at(call, loss_fn):
    calls = []

    def wrapped(m, b):
        calls.append(1)
        if len(calls) == call:
            raise Fail("the loss broke")
        return loss_fn(m, b)

    return wrapped


def mse(m, b):
    return F.mse_loss(m(b[0]).squeeze(-1), b[1])


def weighted_mse(m, b):
    return mse(m, b), len(b[0])


def small(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.GELU(), nn.Linear(16, 1))


def xy(n=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randn(n, generator=g)


@pytest.mark.parametrize("loss_fn", [mse, weighted_mse], ids=["mean", "weighted"])
@pytest.mark.parametrize("held", [False, True], ids=["grad_none", "grad_held"])
@pytest.mark.parametrize("call", [2, 3])
def test_an_exception_leaves_grad_exactly_as_it_was(loss_fn, held, call):
    m = small()
    if held:
        mse(m, xy(seed=5)).backward()
    before = [p.grad for p in m.parameters()]
    values = [None if g is None else g.clone() for g in before]
    step = act.Step(m, loss_fn=failing_at(call, loss_fn), plan={"micro_batches": 3})
    with pytest.raises(Fail) as err:
        step(xy())
    assert any(f"micro-batch {call} of 3" in n and ".grad is as it was" in n
               for n in err.value.__notes__)
    for p, g, v in zip(m.parameters(), before, values):
        assert p.grad is g  # the very tensors (no copy was made), or None
        assert g is None or torch.equal(g, v)
    # the next step runs normally and adds to what .grad held
    step.loss_fn = loss_fn
    step(xy())
    ref = small()
    if held:
        mse(ref, xy(seed=5)).backward()
    mse(ref, xy()).backward()
    assert_same(flat_grad(m), flat_grad(ref))


def test_an_exception_in_backward_leaves_grad_as_it_was():
    m = gpt2()
    batch = padded([16, 7, 12, 9])
    m(**batch).loss.backward()
    values = [p.grad.clone() for p in m.parameters()]
    calls = []

    def hook(module, grad_in, grad_out):
        calls.append(1)
        if len(calls) == 2:  # the second micro-batch's backward
            raise Fail("backward broke")

    handle = m.lm_head.register_full_backward_hook(hook)
    with pytest.raises(Fail) as err:
        act.Step(m, plan={"micro_batches": 2})(batch)
    handle.remove()
    assert any("micro-batch 2 of 2" in n for n in err.value.__notes__)
    assert all(torch.equal(p.grad, v) for p, v in zip(m.parameters(), values))


# -- a plain loop over a DataLoader with a padding collator ----------------------------------
def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {f"w{i}": i for i in range(PAD)}
    vocab["<pad>"] = PAD
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>")


@pytest.mark.parametrize("name", MODELS)
def test_a_dataloader_loop_with_a_padding_collator_gives_plain_gradients(name):
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(1, 24, (20,), generator=g).tolist()
    texts = [{"input_ids": torch.randint(0, PAD, (n,), generator=g).tolist()}
             for n in lengths]
    collate = tf.DataCollatorForLanguageModeling(tokenizer(), mlm=False)
    loader = torch.utils.data.DataLoader(texts, batch_size=5, collate_fn=collate)
    m, ref = MODELS[name](), MODELS[name]()
    step = act.Step(m, plan={"micro_batches": 3})
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for batch in loader:
        assert (batch["labels"] == -100).any()
        step(batch)
        ref(**batch).loss.backward()
        assert_same(flat_grad(m), flat_grad(ref))
        opt.step(), ref_opt.step()
        opt.zero_grad(), ref_opt.zero_grad()
        with torch.no_grad():  # the same start for the next batch's comparison
            for p, q in zip(m.parameters(), ref.parameters()):
                p.copy_(q)


def test_the_probes_draw_no_random_numbers_of_the_training():
    """A limit with room for plain training gives plain training's parameters bit for bit,
    dropout included: the first step's probes ran the model on the global generator, so the
    step's dropout masks (and every later step's) were not plain training's (gradients
    0.12 apart at most, the loss another)."""
    def dropping():
        torch.manual_seed(0)
        return tf.GPT2LMHeadModel(tf.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, n_positions=64, vocab_size=VOCAB, resid_pdrop=0.1,
            embd_pdrop=0.1, attn_pdrop=0.1))

    batches = [padded([16, 9, 12, 5], seed=seed) for seed in range(3)]
    model, reference = dropping(), dropping()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    step = act.Step(model, limit="free", optimizer=optimizer, chunk_loss=False)
    torch.manual_seed(5)
    for batch in batches:
        step(batch)
        optimizer.step(), optimizer.zero_grad()
    assert step.profile is not None and step.plan == act.Plan()  # probed, planned plain
    after = torch.rand(4)
    torch.manual_seed(5)
    for batch in batches:
        reference(**batch).loss.backward()
        ref_optimizer.step(), ref_optimizer.zero_grad()
    assert torch.equal(torch.rand(4), after)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)


def test_a_list_of_one_target_per_sample_is_cut_with_its_samples():
    """A tuple batch of stacked inputs and a list of targets of their own sizes per sample
    (as detection code collates them): the list was passed whole to each micro-batch, where
    a loss_fn zipping samples with targets paired them wrongly, silently."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, generator=g)
    targets = [torch.randn(n, generator=g) for n in (1, 3, 2, 5)]

    def loss_fn(model, batch):
        inputs, wanted = batch
        out = model(inputs)
        return torch.stack([(row - t.mean()).pow(2).sum() for row, t in zip(out, wanted)]).mean()

    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    reference = nn.Linear(3, 2)
    reference.load_state_dict(model.state_dict())
    loss_fn(reference, (x, targets)).backward()
    with act.Step(model, loss_fn=loss_fn, plan=act.Plan(micro_batches=2)) as step:
        step((x, targets))
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-6, atol=1e-7)


def test_split_false_keeps_a_loss_over_in_batch_negatives_whole():
    """A loss_fn contrasting each sample with the batch's others (in-batch negatives) takes a
    statistic Step cannot see: micro-batches would each see a part of the negatives. With
    split=False a pinned plan of micro-batches is refused, and a planned step keeps the
    batch whole and gives the plain gradient."""
    g = torch.Generator().manual_seed(1)
    batch = (torch.randn(8, 6, generator=g), torch.randn(8, 6, generator=g))

    def contrastive(model, b):
        a, p = F.normalize(model(b[0]), dim=1), F.normalize(model(b[1]), dim=1)
        return F.cross_entropy(a @ p.t() / 0.1, torch.arange(a.shape[0]))

    torch.manual_seed(0)
    model, reference = nn.Linear(6, 4), nn.Linear(6, 4)
    reference.load_state_dict(model.state_dict())
    with pytest.raises(ValueError, match="split=False"):
        act.Step(model, loss_fn=contrastive, split=False, plan=act.Plan(micro_batches=2))(batch)
    assert model.weight.grad is None
    contrastive(reference, batch).backward()
    with act.Step(model, "free", loss_fn=contrastive, split=False) as step:
        step(batch)
        assert not step.profile.split and step.plan.micro_batches == 1
    assert torch.equal(model.weight.grad, reference.weight.grad)
