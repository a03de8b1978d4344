"""The memory limit: `Step`, a training step within a limit on the process's memory; the
profile that measures a model's step; the pure solver over micro-batches, recomputation and
storage; the repeated blocks and how a batch splits."""
