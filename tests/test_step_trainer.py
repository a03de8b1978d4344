"""act.Step inside transformers' Trainer (actcodec.torch.limit.trainer.StepTrainer): with
gradient accumulation, padded labels and micro-batches, every optimizer step sees the
gradient the plain Trainer computes, with num_items_in_batch and without."""
import pytest
import torch
import torch.nn.functional as F

tf = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from actcodec import resident  # noqa: E402
from actcodec.torch.limit.trainer import StepTrainer  # noqa: E402

VOCAB, PAD = 128, 127
MiB = 1 << 20


def gpt2():
    torch.manual_seed(0)
    return tf.GPT2LMHeadModel(tf.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, n_positions=64, vocab_size=VOCAB, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=PAD))


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {f"w{i}": i for i in range(PAD)}
    vocab["<pad>"] = PAD
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>")


def texts(n=20):
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(1, 24, (n,), generator=g).tolist()
    return [{"input_ids": torch.randint(0, PAD, (k,), generator=g).tolist()} for k in lengths]


class Grads(tf.TrainerCallback):
    """Each optimizer step's gradient, as the optimizer is about to see it."""

    def __init__(self):
        self.seen = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.seen.append(torch.cat([p.grad.flatten() for p in model.parameters()
                                    if p.grad is not None]).clone())


def train(tmp_path, cls, accepts_loss_kwargs: bool, args_options=None, **kw):
    args = tf.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=5,
        gradient_accumulation_steps=2, max_steps=2, learning_rate=0.5, optim="sgd",
        lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0, seed=0,
        report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0, **(args_options or {}))
    grads = Grads()
    trainer = cls(model=gpt2(), args=args, train_dataset=texts(),
                  data_collator=tf.DataCollatorForLanguageModeling(tokenizer(), mlm=False),
                  callbacks=[grads], **kw)
    trainer.model_accepts_loss_kwargs = accepts_loss_kwargs  # num_items_in_batch or not
    trainer.train()
    return trainer, grads.seen


@pytest.mark.parametrize("accepts_loss_kwargs", [True, False],
                         ids=["num_items_in_batch", "mean_per_batch"])
def test_step_trainer_gives_the_trainers_gradients(tmp_path, accepts_loss_kwargs):
    _, want = train(tmp_path / "plain", tf.Trainer, accepts_loss_kwargs)
    trainer, got = train(tmp_path / "step", StepTrainer, accepts_loss_kwargs,
                         step_options={"plan": {"micro_batches": 3}})
    assert trainer.act_step.stats.micro_batches == 3
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        assert F.cosine_similarity(g, w, dim=0) >= 0.99999
        assert (g - w).norm() / w.norm() < 1e-5


def test_step_trainer_under_a_limit_plans_with_the_trainers_optimizer(tmp_path):
    trainer, got = train(tmp_path, StepTrainer, True,
                         step_options={"limit": resident.rss() + 2048 * MiB})
    step = trainer.act_step
    assert step.stats.limit is not None and step.plan is not None
    assert isinstance(step.optimizer, torch.optim.SGD)  # accelerate's wrapper unwrapped
    assert len(got) == 2 and all(torch.isfinite(g).all() for g in got)


def test_step_trainer_refuses_what_it_does_not_run(tmp_path):
    with pytest.raises(ValueError, match="loss_fn"):
        StepTrainer(model=gpt2(), args=tf.TrainingArguments(output_dir=str(tmp_path),
                                                            report_to=[], use_cpu=True),
                    step_options={"loss_fn": None})
    args = tf.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True,
                                label_smoothing_factor=0.1, max_steps=1,
                                per_device_train_batch_size=2, disable_tqdm=True)
    trainer = StepTrainer(model=gpt2(), args=args, train_dataset=texts(4),
                          data_collator=tf.DataCollatorForLanguageModeling(tokenizer(),
                                                                           mlm=False))
    with pytest.raises(ValueError, match="label_smoothing_factor"):
        trainer.train()


def test_step_trainer_in_bfloat16_under_a_limit_gives_the_trainers_gradients(tmp_path):
    """bf16=True runs the Trainer's steps inside torch.autocast: under a limit, Step's
    chunked causal-LM loss raised there at every step."""
    _, want = train(tmp_path / "plain", tf.Trainer, True, args_options={"bf16": True})
    trainer, got = train(tmp_path / "step", StepTrainer, True, args_options={"bf16": True},
                         step_options={"limit": resident.rss() + 2048 * MiB})
    assert trainer.act_step.stats.limit is not None
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        assert F.cosine_similarity(g, w, dim=0) >= 0.999
