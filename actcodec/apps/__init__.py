"""The command-line apps, ``python -m actcodec demo`` and ``python -m actcodec memory``: users
of the library, built on its public API only (``actcodec``, ``actcodec.torch``,
``actcodec.store``), never on its private modules.

- demo.py: the demo command (its options, the parent running one worker per configuration);
  demo_train.py: one worker (data, model, training loop, evaluation, the saved-bytes count);
  demo_digits.py and demo_text.py: its two tasks (data and model); demo_table.py: its
  table, notes and plot.
- memory.py: the memory command (its options, the parent, the table); memory_worker.py: one
  configuration in a fresh process.
- process_memory.py: what the process holds (RSS, its peak, glibc's statistics, live bytes, a
  sampler of their peak); zoo.py: the memory command's models; configs.py: the configuration
  names (fp32, checkpoint, presets, budget/N, offload) and the context each trains in.

Importing this package, demo.py or memory.py imports no torch: ``python -m actcodec`` builds
its parser from them, and the work is imported when a command runs.
"""
