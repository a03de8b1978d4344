"""The chunked head and loss (act.chunked_cross_entropy, act.causal_lm_loss): the loss and every
gradient equal the unchunked ones (torch's cross entropy on the full logits; transformers' own
`model(**batch).loss`) up to float summation order, for any chunk count, and the full
tokens x vocab logits never exist. Tiny models built from configs (nothing downloaded)."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import actcodec.torch as act
from actcodec.torch.limit import chunked_loss

tf = pytest.importorskip("transformers")
tf.utils.logging.set_verbosity_error()

VOCAB, PAD = 101, 100


def reference(hidden, weight, labels, bias=None, logit_scale=None, softcap=None, shift=False,
              reduction="mean", num_items_in_batch=None):
    """The unchunked loss: full logits (in float32, as transformers' losses take them), then
    torch's cross entropy."""
    logits = hidden @ weight.t() if bias is None else torch.addmm(
        bias, hidden.reshape(-1, hidden.shape[-1]), weight.t()).view(*hidden.shape[:-1], -1)
    logits = logits.to(torch.promote_types(hidden.dtype, torch.float32))
    if logit_scale is not None:
        logits = logits * logit_scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    if shift:
        labels = F.pad(labels, (0, 1), value=-100)[..., 1:]
    flat, targets = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    if num_items_in_batch is not None:
        return F.cross_entropy(flat, targets, reduction="sum") / num_items_in_batch
    return F.cross_entropy(flat, targets, reduction=reduction)


def inputs(tokens=(2, 9), size=16, vocab=VOCAB, dtype=torch.float32, seed=0, ignored=3):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*tokens, size, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, size, generator=g) / math.sqrt(size)).to(dtype).requires_grad_()
    bias = torch.randn(vocab, generator=g).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, tokens, generator=g)
    labels.view(-1)[:ignored] = -100
    return hidden, weight, bias, labels


def relative_error(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def cosine(a, b):
    return float(F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


def chunkings(tokens):
    """Chunk sizes giving one chunk, three chunks (the last ragged where it falls so), and
    one chunk per token."""
    return [tokens, -(-tokens // 3), 1]


OPTIONS = [{}, {"bias": True}, {"logit_scale": 0.4}, {"softcap": 2.0},
           {"bias": True, "logit_scale": 3.0, "softcap": 5.0}, {"shift": True},
           {"reduction": "sum"}, {"num_items_in_batch": 11}]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(o) or "plain")
@pytest.mark.parametrize("chunk", [0, 1, 2], ids=["1chunk", "3chunks", "per-token"])
def test_equals_the_unchunked_loss_in_float32(options, chunk):
    hidden, weight, bias, labels = inputs()
    options = dict(options)
    bias = bias if options.pop("bias", False) else None
    chunk_tokens = chunkings(labels.numel() - 3)[chunk]
    expected = reference(hidden, weight, labels, bias=bias, **options)
    params = [hidden, weight] + ([bias] if bias is not None else [])
    expected_grads = torch.autograd.grad(expected, params)

    loss = act.chunked_cross_entropy(hidden, weight, labels, bias=bias,
                                     chunk_tokens=chunk_tokens, **options)
    grads = torch.autograd.grad(loss, params)
    assert loss.dtype == torch.float32
    assert abs(loss.item() - expected.item()) <= 1e-6 * max(1.0, abs(expected.item()))
    for got, want in zip(grads, expected_grads):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert relative_error(got, want) < 1e-5
        assert cosine(got, want) >= 0.99999


@pytest.mark.parametrize("options", [{}, {"softcap": 2.0, "logit_scale": 0.5}],
                         ids=["plain", "scale-softcap"])
def test_bfloat16_is_as_close_to_the_exact_loss_as_torchs_own(options):
    """bfloat16 inputs: against the float64 loss of the same (bfloat16) values, ours is as
    close as the unchunked bfloat16 autograd, at any chunk count (the logits' gradient in
    float32, rounded to bfloat16 for the hidden states' matmul as autograd rounds it; the
    weight's and bias's gradients added up over chunks in float32, not rounded per chunk)."""
    hidden, weight, bias, labels = inputs(tokens=(4, 64), size=64, dtype=torch.bfloat16)
    exact_params = [t.detach().double().requires_grad_() for t in (hidden, weight, bias)]
    exact = reference(*exact_params[:2], labels, bias=exact_params[2], **options)
    exact_grads = torch.autograd.grad(exact, exact_params)
    torch_loss = reference(hidden, weight, labels, bias=bias, **options)
    torch_grads = torch.autograd.grad(torch_loss, [hidden, weight, bias])
    for chunk_tokens in (253, 42, 7, 1):
        loss = act.chunked_cross_entropy(hidden, weight, labels, bias=bias,
                                         chunk_tokens=chunk_tokens, **options)
        grads = torch.autograd.grad(loss, [hidden, weight, bias])
        assert loss.dtype == torch.float32
        assert abs(loss.item() - exact.item()) <= 2 * abs(torch_loss.item() - exact.item()) + 1e-4
        for got, theirs, want in zip(grads, torch_grads, exact_grads):
            assert got.dtype == torch.bfloat16
            assert relative_error(got, want) <= 1.1 * relative_error(theirs, want) + 1e-4


def test_no_target_gives_torchs_nan_mean_or_zero_with_num_items():
    hidden, weight, _, labels = inputs()
    labels = torch.full_like(labels, -100)
    expected = reference(hidden, weight, labels)
    expected_grads = torch.autograd.grad(expected, [hidden, weight])
    loss = act.chunked_cross_entropy(hidden, weight, labels, chunk_tokens=4)
    grads = torch.autograd.grad(loss, [hidden, weight])
    assert math.isnan(expected.item()) and math.isnan(loss.item())
    for got, want in zip(grads, expected_grads):
        assert torch.equal(got, want) and not got.any()
    loss = act.chunked_cross_entropy(hidden, weight, labels, num_items_in_batch=torch.tensor(5))
    assert loss.item() == 0.0
    assert not any(g.any() for g in torch.autograd.grad(loss, [hidden, weight]))


def test_the_full_logits_never_exist():
    """Every tensor created in forward and backward (chunk of 8 targets) is far smaller than the
    tokens x vocab logits; the biggest are the weight's gradient and one chunk's logits."""
    hidden, weight, bias, labels = inputs(tokens=(2, 40), size=8, vocab=1000, ignored=0)
    with Largest() as largest:
        loss = act.chunked_cross_entropy(hidden, weight, labels, bias=bias, chunk_tokens=8)
        loss.backward()
    assert largest.numel == max(weight.numel(), 8 * 1000) < labels.numel() * 1000 / 5
    with Largest() as largest:
        reference(hidden, weight, labels, bias=bias).backward()
    assert largest.numel >= labels.numel() * 1000  # the check sees the unchunked logits


class Largest(TorchDispatchMode):
    """The largest number of elements of any tensor an op returns while it is active."""

    def __enter__(self):
        self.numel = 0
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def test_only_the_gradients_backward_can_use_are_computed(monkeypatch):
    seen = []
    original = chunked_loss.chunked_loss_and_grads

    def spy(*args):
        loss, grads = original(*args)
        seen.append(tuple(g is not None for g in grads))
        return loss, grads

    monkeypatch.setattr(chunked_loss, "chunked_loss_and_grads", spy)
    hidden, weight, bias, labels = inputs()
    weight.requires_grad_(False)
    loss = act.chunked_cross_entropy(hidden, weight, labels, bias=bias)
    (grad_hidden, grad_bias) = torch.autograd.grad(loss, [hidden, bias])
    assert seen[-1] == (True, False, True)
    with torch.no_grad():
        loss = act.chunked_cross_entropy(hidden, weight, labels, bias=bias)
    assert seen[-1] == (False, False, False) and loss.grad_fn is None
    assert loss.item() == pytest.approx(reference(hidden, weight, labels, bias=bias).item(),
                                        rel=1e-6)


def test_backward_scales_by_the_incoming_gradient_and_runs_once():
    hidden, weight, _, labels = inputs()
    loss = act.chunked_cross_entropy(hidden, weight, labels, chunk_tokens=5)
    (3.0 * loss).backward(retain_graph=True)
    expected = torch.autograd.grad(3.0 * reference(hidden, weight, labels), [hidden, weight])
    assert relative_error(hidden.grad, expected[0]) < 1e-5
    assert relative_error(weight.grad, expected[1]) < 1e-5
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


@given(labels=st.lists(st.sampled_from([-100, -100, -7, 0, 1, 5, 100, 101, 3000]),
                       max_size=12), ignore=st.sampled_from([-100, 0, 5]))
def test_the_targets_and_their_bounds_come_from_one_read(labels, ignore):
    """_targets gives the positions that have a target and the least and greatest of their
    labels, as a plain mask would (the bounds taken over those positions only)."""
    t = torch.tensor(labels, dtype=torch.int64)
    rows, low, high = chunked_loss._targets(t, ignore)
    kept = [i for i, v in enumerate(labels) if v != ignore]
    assert rows.tolist() == kept and rows.dtype == torch.int64
    if kept:
        assert (low, high) == (min(labels[i] for i in kept), max(labels[i] for i in kept))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_device_forward_waits_for_it_once_and_backward_never():
    """Each wait for the device leaves it idle while the host queues the next work: forward
    reads the targets' count and bounds together; backward reads nothing."""
    import warnings
    hidden, weight, bias, labels = (t.detach().cuda() for t in inputs(tokens=(4, 33)))
    hidden.requires_grad_(), weight.requires_grad_()
    torch.cuda.synchronize()
    mode = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as forward:
            warnings.simplefilter("always")
            loss = act.chunked_cross_entropy(hidden, weight, labels, bias=bias, chunk_tokens=16,
                                             shift=True)
        with warnings.catch_warnings(record=True) as backward:
            warnings.simplefilter("always")
            loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode(mode)
    syncs = [str(w.message) for w in forward if "synchroniz" in str(w.message)]
    assert len(syncs) == 1, syncs
    assert not [str(w.message) for w in backward if "synchroniz" in str(w.message)]


def test_saved_tensor_hooks_do_not_touch_the_stored_gradients():
    """The gradients forward keeps are not autograd's saved tensors: a hook that would spoil
    every saved tensor (as a lossy codec might) leaves them exact."""
    hidden, weight, _, labels = inputs()
    expected = torch.autograd.grad(reference(hidden, weight, labels), [hidden, weight])
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: torch.zeros_like(t)):
        loss = act.chunked_cross_entropy(hidden, weight, labels, chunk_tokens=4)
    grads = torch.autograd.grad(loss, [hidden, weight])
    for got, want in zip(grads, expected):
        assert relative_error(got, want) < 1e-5


@given(batch=st.integers(1, 3), length=st.integers(1, 7), size=st.integers(1, 9),
       vocab=st.integers(1, 40), chunk_tokens=st.integers(1, 30), shift=st.booleans(),
       ignored=st.integers(0, 30), seed=st.integers(0, 2**16))
def test_any_shape_and_chunking_equals_the_unchunked_loss(batch, length, size, vocab,
                                                          chunk_tokens, shift, ignored, seed):
    hidden, weight, bias, labels = inputs((batch, length), size, vocab, seed=seed,
                                          ignored=min(ignored, batch * length))
    expected = reference(hidden, weight, labels, bias=bias, shift=shift, reduction="sum")
    expected_grads = torch.autograd.grad(expected, [hidden, weight, bias])
    loss = act.chunked_cross_entropy(hidden, weight, labels, bias=bias, shift=shift,
                                     reduction="sum", chunk_tokens=chunk_tokens)
    grads = torch.autograd.grad(loss, [hidden, weight, bias])
    assert abs(loss.item() - expected.item()) <= 1e-5 * max(1.0, abs(expected.item()))
    for got, want in zip(grads, expected_grads):
        assert (got.double() - want.double()).abs().max() <= 1e-5 * max(1.0, want.abs().max())


@pytest.mark.parametrize("change, message", [
    (dict(labels=torch.full((2, 9), VOCAB)), "outside the vocabulary"),
    (dict(labels=torch.zeros(2, 8, dtype=torch.long)), "labels' shape"),
    (dict(labels=torch.zeros(2, 9)), "integer class indices"),
    (dict(weight=torch.zeros(VOCAB, 15)), "weight must be"),
    (dict(weight=torch.zeros(VOCAB, 16, dtype=torch.float64)), "dtype and device"),
    (dict(bias=torch.zeros(VOCAB + 1)), "bias must be"),
    (dict(chunk_tokens=0), "chunk_tokens"),
    (dict(reduction="none"), "reduction"),
    (dict(reduction="sum", num_items_in_batch=4), "num_items_in_batch"),
    (dict(num_items_in_batch=0), "positive number"),
    (dict(softcap=0.0), "softcap"),
    (dict(logit_scale=float("nan")), "logit_scale"),
])
def test_bad_input_names_the_problem(change, message):
    hidden, weight, _, labels = inputs()
    args = dict(hidden=hidden, weight=weight, labels=labels)
    args.update(change)
    positional = [args.pop(k) for k in ("hidden", "weight", "labels")]
    with pytest.raises((ValueError, TypeError), match=message):
        act.chunked_cross_entropy(*positional, **args)


# transformers' causal language models: causal_lm_loss(model, batch) == model(**batch).loss

COMMON = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
              bos_token_id=0, eos_token_id=0, pad_token_id=PAD)
MODELS = {
    "gpt2-tied": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, n_positions=64, vocab_size=VOCAB, bos_token_id=0,
        eos_token_id=0, pad_token_id=PAD)),
    "llama-untied": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(tie_word_embeddings=False,
                                                               **COMMON)),
    "gemma2-softcap": lambda: tf.Gemma2ForCausalLM(tf.Gemma2Config(
        head_dim=8, final_logit_softcapping=0.5, **COMMON)),
    "cohere-logit-scale": lambda: tf.CohereForCausalLM(tf.CohereConfig(logit_scale=0.7,
                                                                       **COMMON)),
    "granite-logits-scaling": lambda: tf.GraniteForCausalLM(tf.GraniteConfig(
        logits_scaling=3.0, **COMMON)),
    "hyperclovax-logits-scaling": lambda: tf.HyperCLOVAXForCausalLM(tf.HyperCLOVAXConfig(
        logits_scaling=0.4, **COMMON)),  # multiplies by it
    "recurrent-gemma-soft-cap": lambda: tf.RecurrentGemmaForCausalLM(tf.RecurrentGemmaConfig(
        logits_soft_cap=0.5, lru_width=32, attention_window_size=8, head_dim=8,
        **dict(COMMON, num_hidden_layers=3))),  # its third block attends
}


def model(kind, seed=0):
    torch.manual_seed(seed)
    return MODELS[kind]().eval()  # eval: no dropout, so two forwards are the same function


def padded_batch(lengths=(13, 6, 0), width=13, seed=1):
    """Right-padded rows as Hugging Face collators give them (labels -100 where padded; a row
    of length 0 has no target)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, PAD, (len(lengths), width), generator=g)
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    ids[mask == 0] = PAD
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def loss_and_grads(m, compute):
    m.zero_grad(set_to_none=True)
    loss = compute()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()
                           if p.grad is not None}


@pytest.mark.parametrize("num_items", [None, 23], ids=["mean", "num_items_in_batch"])
@pytest.mark.parametrize("kind", MODELS)
def test_causal_lm_loss_equals_transformers_loss(kind, num_items):
    m = model(kind)
    batch = padded_batch()
    if num_items is not None:
        batch["num_items_in_batch"] = torch.tensor(num_items)
    expected, expected_grads = loss_and_grads(m, lambda: m(**batch).loss)
    targets = int((batch["labels"][:, 1:] != -100).sum())
    for chunk_tokens in chunkings(targets):
        loss, grads = loss_and_grads(m, lambda: act.causal_lm_loss(m, batch, chunk_tokens))
        assert abs(loss.item() - expected.item()) <= 1e-6 * abs(expected.item())
        assert grads.keys() == expected_grads.keys()
        for name, want in expected_grads.items():
            assert relative_error(grads[name], want) < 1e-5, name
            assert cosine(grads[name], want) >= 0.99999, name


@pytest.mark.parametrize("kind", MODELS)
def test_causal_lm_loss_under_autocast_equals_transformers_loss_there(kind):
    """Under torch.autocast (bfloat16 on the CPU) the model's head takes its product in
    bfloat16 from float32 hidden states: ours did the same for the logits, then wrote the
    bfloat16 gradient into float32 hidden states' (index_copy_: a RuntimeError, and every
    step of a causal LM under autocast and a limit failed). As the model's loss there."""
    m = model(kind)
    batch = padded_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, expected_grads = loss_and_grads(m, lambda: m(**batch).loss)
        for chunk_tokens in (7, None):
            loss, grads = loss_and_grads(
                m, lambda: act.causal_lm_loss(m, batch, chunk_tokens))
            assert abs(loss.item() - expected.item()) <= 1e-3 * abs(expected.item())
            for name, want in expected_grads.items():
                assert grads[name].dtype == want.dtype, name
                assert cosine(grads[name], want) >= 0.999, name


def test_a_step_under_a_limit_and_autocast_gives_autocasts_gradient():
    """Step under a limit runs a causal LM's loss in chunks (causal_lm_loss): inside
    torch.autocast every such step raised; it gives the gradient autocast gives plainly."""
    m, plain = model("llama-untied"), model("llama-untied")
    batch = padded_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, want = loss_and_grads(plain, lambda: plain(**batch).loss)
        with act.Step(m, limit="free") as step:
            step(batch)
    for name, p in m.named_parameters():
        assert cosine(p.grad, want[name]) >= 0.999, name


def test_causal_lm_loss_takes_shift_labels_as_given():
    m = model("llama-untied")
    batch = padded_batch()
    batch["shift_labels"] = F.pad(batch["labels"], (0, 1), value=-100)[:, 1:].flip(1)
    expected, expected_grads = loss_and_grads(m, lambda: m(**batch).loss)
    loss, grads = loss_and_grads(m, lambda: act.causal_lm_loss(m, batch, 5))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    for name, want in expected_grads.items():
        assert relative_error(grads[name], want) < 1e-5, name


def test_causal_lm_loss_never_computes_the_full_logits():
    torch.manual_seed(0)
    m = tf.LlamaForCausalLM(tf.LlamaConfig(**dict(COMMON, vocab_size=2000, hidden_size=8,
                                                  intermediate_size=16, num_attention_heads=2,
                                                  num_key_value_heads=1))).eval()
    batch = padded_batch((30, 30), width=30)
    batch["input_ids"] = batch["input_ids"] % 2000
    tokens = batch["input_ids"].numel()
    with Largest() as largest:
        act.causal_lm_loss(m, batch, chunk_tokens=4).backward()
    assert largest.numel == 2000 * 8 < tokens * 2000 / 4  # the head's weight and its gradient
    with Largest() as largest:
        m(**batch).loss.backward()
    assert largest.numel >= tokens * 2000


class OwnHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.proj(x)


@pytest.mark.parametrize("make, message", [
    (lambda: tf.BertForMaskedLM(tf.BertConfig(num_hidden_layers=1, hidden_size=32,
                                              intermediate_size=64, num_attention_heads=2,
                                              vocab_size=VOCAB)), "logits_to_keep"),
    (lambda: OwnHead(), "not a transformers PreTrainedModel"),
])
def test_causal_lm_loss_refuses_what_it_does_not_cover(make, message):
    with pytest.raises(ValueError, match=message):
        act.causal_lm_loss(make(), padded_batch())


def test_causal_lm_loss_refuses_a_head_its_config_does_not_describe():
    """Cohere multiplies by the logit_scale it copied from its config at build time; changed
    afterwards, the config no longer says what the head does: refused, not mis-scaled."""
    m = model("cohere-logit-scale")
    m.logit_scale = 0.8
    with pytest.raises(ValueError, match="head does something else"):
        act.causal_lm_loss(m, padded_batch())


def test_a_step_runs_a_head_its_config_does_not_describe_with_the_models_own_loss():
    """Step under a limit checks the chunked loss against the model's own on the first batch's
    prefix: a head it does not describe raised ValueError at every step; now the model's own
    loss runs, with a warning, and gives plain gradients bit for bit."""
    m, plain = model("cohere-logit-scale"), model("cohere-logit-scale")
    m.logit_scale = plain.logit_scale = 0.8
    batch = padded_batch()
    _, want = loss_and_grads(plain, lambda: plain(**batch).loss)
    with pytest.warns(RuntimeWarning, match="chunked loss does not cover CohereForCausalLM"):
        with act.Step(m, limit="free") as step:
            step(batch)
    for name, p in m.named_parameters():
        assert torch.equal(p.grad, want[name]), name


def test_a_step_compares_the_head_once_not_per_micro_batch(monkeypatch):
    """Each comparison of the model's last logits with the chunked path's head reads the
    device; the head is the same in every micro-batch of a step, so a step compares it at
    its first call only, and its gradient is the model's own loss's."""
    from actcodec.torch.limit import causal_lm, limit_plan
    m, plain = model("llama-untied"), model("llama-untied")
    batch = padded_batch(lengths=(13, 6, 9, 11), width=13)
    _, want = loss_and_grads(plain, lambda: plain(**batch).loss)
    compared, real = [], causal_lm._check_head
    monkeypatch.setattr(causal_lm, "_check_head", lambda *a: compared.append(1) or real(*a))
    with act.Step(m, limit="free", plan=limit_plan.Plan(4, ())) as step:
        step(batch)
        m.zero_grad(set_to_none=True)
        compared.clear()
        step(batch)
    assert len(compared) == 1, compared
    for name, p in m.named_parameters():
        assert relative_error(p.grad, want[name]) < 1e-5, name


MIXTURES = {
    "mixtral": lambda: tf.MixtralForCausalLM(tf.MixtralConfig(
        num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
        router_aux_loss_coef=0.5, **COMMON)),
    "jetmoe": lambda: tf.JetMoeForCausalLM(tf.JetMoeConfig(
        hidden_size=32, num_hidden_layers=2, num_key_value_heads=2, kv_channels=8,
        intermediate_size=64, vocab_size=VOCAB, num_local_experts=4, num_experts_per_tok=2,
        output_router_logits=True, aux_loss_coef=0.5, pad_token_id=PAD)),
}


@pytest.mark.parametrize("kind", MIXTURES)
def test_causal_lm_loss_adds_a_routers_load_balancing_loss(kind):
    """A mixture of experts given output_router_logits adds its router's load-balancing loss
    to the cross-entropy: the chunked loss left it out (a loss 1.0 lower, the router's
    gradient at cosine 0.75, under any limit, silently)."""
    torch.manual_seed(0)
    m = MIXTURES[kind]().eval()
    batch = padded_batch()
    expected, expected_grads = loss_and_grads(m, lambda: m(**batch).loss)
    loss, grads = loss_and_grads(m, lambda: act.causal_lm_loss(m, batch, 5))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert grads.keys() == expected_grads.keys()
    for name, want in expected_grads.items():
        assert cosine(grads[name], want) >= 0.99999, name


def test_causal_lm_loss_needs_labels():
    batch = padded_batch()
    del batch["labels"]
    with pytest.raises(ValueError, match="no 'labels'"):
        act.causal_lm_loss(model("gpt2-tied"), batch)
