"""Accounting of what was saved for backward: per layer and op, the original bytes, the exact
compressed bytes of the unique tensors, the codecs chosen, and the time spent encoding and
decoding. Totals are sums over rows, and each row's compressed bytes are the real payload
sizes of the tensors it recorded. `stored_bytes` is what the step holds for backward at this
moment (payloads, and the tensors kept as they are, parameters excluded), which falls as
backward frees them; `peak_stored_bytes` the most it held at once.

Recording is on inside `compress_saved` (its `.stats`) and inside `record()`, which the
converted modules and Functions report to; outside both nothing is recorded.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class Row:
    layer: str
    op: str
    tensors: int = 0
    original_bytes: int = 0
    compressed_bytes: int = 0
    encode_seconds: float = 0.0
    decode_seconds: float = 0.0
    codecs: dict = field(default_factory=dict)


class Accounting:
    """Statistics of what a context saved for backward: per-layer/op rows, counts of shared,
    kept, re-encoded and paged-out saves, and the bytes held. The save session
    (actcodec.torch.save) writes them; `str()` is a summary line, `table()` the per-layer
    table."""

    def __init__(self, store=None):
        self.rows: dict = {}
        self.steps = 0          # steps recorded (entries of the context)
        self.deduplicated = 0   # saves served by an encoding made earlier in the step
        self.kept = 0           # saves left as they were (params, ints, small, policy "keep")
        self.stored_bytes = 0
        self.peak_stored_bytes = 0
        self.store = store      # the actcodec Store payloads went to, or None
        self.budget = None      # the byte budget of this step, if any
        self.reencoded = 0      # saves re-encoded at fewer bits to stay within the budget
        self.spilled = 0        # saves paged out to disk to stay within the budget
        self.spilled_bytes = 0
        self.over_budget = 0    # saves the budget could not hold (kept tensors above it)
        self.lock = threading.Lock()  # stored_bytes changes from backward and budget threads

    def new_step(self, budget: int | None) -> None:
        """A step begins: its counters start afresh; the peak from what is still held."""
        self.steps += 1
        self.budget = budget
        self.reencoded = self.spilled = self.spilled_bytes = self.over_budget = 0
        self.peak_stored_bytes = self.stored_bytes

    @property
    def store_mapped_bytes(self) -> int:
        """The store's mapped bytes now (0 without a store)."""
        return self.store.stats()["mapped_bytes"] if self.store is not None else 0

    def _total(self, name):
        return sum(getattr(r, name) for r in self.rows.values())

    tensors = property(lambda self: self._total("tensors"))
    original_bytes = property(lambda self: self._total("original_bytes"))
    compressed_bytes = property(lambda self: self._total("compressed_bytes"))
    encode_seconds = property(lambda self: self._total("encode_seconds"))
    decode_seconds = property(lambda self: self._total("decode_seconds"))

    @property
    def codecs(self) -> dict:
        out: dict = {}
        for r in self.rows.values():
            for k, v in r.codecs.items():
                out[k] = out.get(k, 0) + v
        return out

    @property
    def ratio(self) -> float:
        return self.original_bytes / self.compressed_bytes if self.compressed_bytes else 1.0

    def __str__(self) -> str:
        codecs = ", ".join(f"{k}: {v}" for k, v in sorted(self.codecs.items()))
        return (f"{self.tensors} tensors compressed ({self.deduplicated} repeat saves shared, "
                f"{self.kept} kept as is): {self.original_bytes / 2**20:.2f} MiB -> "
                f"{self.compressed_bytes / 2**20:.2f} MiB ({self.ratio:.2f}x); codecs {codecs}; "
                f"encode {self.encode_seconds * 1e3:.1f} ms, decode "
                f"{self.decode_seconds * 1e3:.1f} ms")

    def table(self) -> str:
        """A fixed-width table, one line per (layer, op), in the order first seen."""
        head = (f"{'layer':<28} {'op':<11} {'n':>3} {'original KiB':>12} {'saved KiB':>10} "
                f"{'ratio':>6} {'enc ms':>7} {'dec ms':>7}  codecs")
        lines = [head, "-" * len(head)]
        rows = list(self.rows.values())
        total = Row("total", "", self.tensors, self.original_bytes, self.compressed_bytes,
                    self.encode_seconds, self.decode_seconds, self.codecs)
        for r in rows + [total]:
            if r is total:
                lines.append("-" * len(head))
            ratio = r.original_bytes / r.compressed_bytes if r.compressed_bytes else 1.0
            codecs = ", ".join(f"{k} {v}" for k, v in sorted(r.codecs.items()))
            lines.append(f"{r.layer[-28:]:<28} {r.op:<11} {r.tensors:>3} "
                         f"{r.original_bytes / 1024:>12.1f} {r.compressed_bytes / 1024:>10.1f} "
                         f"{ratio:>6.2f} {r.encode_seconds * 1e3:>7.2f} "
                         f"{r.decode_seconds * 1e3:>7.2f}  {codecs}")
        return "\n".join(lines)
