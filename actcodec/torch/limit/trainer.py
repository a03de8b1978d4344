"""transformers' Trainer with each training step run by act.Step (an optional module: it
needs transformers and accelerate, and nothing else in actcodec imports it):

    from actcodec.torch.limit.trainer import StepTrainer
    trainer = StepTrainer(model=model, args=args, train_dataset=data,
                          data_collator=collator, step_options={"limit": "2GiB"})
    trainer.train()

The Trainer keeps its loop: gradient accumulation over `gradient_accumulation_steps`
batches (its `no_sync` around all but the last), clipping, the optimizer, logging. Each of
its batches becomes one act.Step, which may split it further into micro-batches; their
gradients add to what the batches before it left in .grad. The loss is the model's own
(`model(**inputs).loss`), scaled as the Trainer's `training_step` scales it:

- given `num_items_in_batch` (the accumulated batches' target count, where the model's
  forward takes loss kwargs), the model's loss is a sum over that count, so Step's
  micro-batches and the Trainer's batches all simply add (a model whose loss ignores the
  count, BERT's or T5's, gives each batch its mean, as under the Trainer: Step weighs its
  micro-batches by their targets, loss_weights.divides_by_items);
- otherwise each batch's mean over its targets (Step weighs its micro-batches by their
  targets) divided by the batches accumulated.

Not supported (refused at the first step): `compute_loss_func`, label smoothing, several GPUs
in one process (DataParallel), DeepSpeed. An overridden `compute_loss` is not called."""
from __future__ import annotations

try:
    import transformers
except ImportError as exc:  # pragma: no cover - the test extra installs it
    raise ImportError("actcodec.torch.limit.trainer needs transformers and accelerate: "
                      "pip install transformers accelerate") from exc

from . import loss_weights
from . import micro_batches as mb
from .step import Step


class StepTrainer(transformers.Trainer):
    """A Trainer whose `training_step` runs an act.Step (see the module doc).

    step_options: Step's keyword arguments (limit, plan, bits, exact, spill_dir, ...); the
    loss, the GradScaler and the optimizer are the Trainer's. The Step is `self.act_step`,
    made at the first training step."""

    def __init__(self, *args, step_options: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_options = dict(step_options or {})
        taken = {"loss_fn", "scaler", "optimizer"} & set(self.step_options)
        if taken:
            raise ValueError(f"step_options may not set {sorted(taken)}: StepTrainer uses the "
                             f"Trainer's loss, GradScaler and optimizer")
        self.act_step: Step | None = None

    def training_step(self, model, inputs, num_items_in_batch=None):
        self._refuse_unsupported()
        model.train()
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()
        inputs = self._prepare_inputs(inputs)
        if self.act_step is None or self.act_step.model is not model:
            # the optimizer's own class, not accelerate's wrapper: Step counts the state
            # the first optimizer step will create
            optimizer = getattr(self.optimizer, "optimizer", self.optimizer)
            self.act_step = Step(model, scaler=self.accelerator.scaler, optimizer=optimizer,
                                 **self.step_options)
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            # the model's loss is a sum over num_items_in_batch: micro-batches add. Where the
            # Trainer multiplies the loss by the processes that averaged the count, the count
            # is divided by them instead.
            if self.args.average_tokens_across_devices:
                num_items_in_batch = num_items_in_batch / (
                    self.accelerator.num_processes // self.get_tp_size())
            self.act_step.loss_fn = mb.default_loss
            return self.act_step({**inputs, "num_items_in_batch": num_items_in_batch})
        accumulated = self.current_gradient_accumulation_steps

        def mean_over_accumulated(m, micro_batch):
            # the batch's mean loss over its targets, divided by the batches accumulated;
            # weighted by the micro-batch's targets (its samples where labels do not say)
            weight = loss_weights.targets(m, micro_batch)
            if weight is None:
                weight = mb.batch_size(micro_batch)
            return mb.default_loss(m, micro_batch) / accumulated, weight

        self.act_step.loss_fn = mean_over_accumulated
        return self.act_step(inputs)

    def _refuse_unsupported(self) -> None:
        why = []
        if self.compute_loss_func is not None:
            why.append("compute_loss_func")
        if self.label_smoother is not None:
            why.append("label_smoothing_factor")
        if self.args.n_gpu > 1:
            why.append(f"{self.args.n_gpu} GPUs in one process (DataParallel)")
        if self.is_deepspeed_enabled:
            why.append("DeepSpeed")
        if why:
            raise ValueError(f"StepTrainer runs the model's own loss through act.Step and does "
                             f"not support {', '.join(why)}")
