"""The saves of a step whose device encodings have not been read back yet.

On a GPU a quant encoding's size is known before its statistics are: the save path takes it
without waiting for the device (`pack(defer=True)`), and the statistics (is there a NaN/inf,
would "auto" rather take a bitmap codec) follow on their own. Until they are read the saved
tensor is held too, so that a save they contradict is encoded again from it, into exactly
what a waiting encode gives. A wait per save would leave the device idle while Python
prepares the next kernels; this window instead reads what has arrived at each save, waits
(for the oldest only, with later work still queued) when what it holds exceeds `limit`
bytes, and reads the rest when the step's forward ends.
"""
from __future__ import annotations

from collections import deque

IN_FLIGHT = 256 << 20  # bytes of saved tensors held until their encodings are read


class Window:
    """Unsettled Packed saves in the order they were made; `on_settled(packed, before)` is
    called after each one settles, with its (codec, nbytes) before, so that accounting can
    follow a save encoded again."""

    def __init__(self, on_settled, limit: int = IN_FLIGHT):
        self.on_settled, self.limit = on_settled, limit
        self._saves: deque = deque()
        self.nbytes = 0  # of the tensors held

    def __len__(self) -> int:
        return len(self._saves)

    def add(self, packed) -> None:
        """Hold an unsettled save; read what has arrived, and wait while over the limit."""
        self._saves.append(packed)
        self.nbytes += packed.unsettled.nbytes
        while True:
            self.settle_ready()
            if self.nbytes <= self.limit or len(self._saves) <= 1:
                return
            self._settle_oldest()

    def settle_ready(self) -> None:
        """Settle, in order, the saves whose statistics have arrived (no wait)."""
        while self._saves and self._saves[0].unsettled.unread.ready():
            self._settle_oldest()

    def settle_all(self) -> None:
        while self._saves:
            self._settle_oldest()

    def drop(self) -> None:
        """Forget the saves (a step that failed): each settles when it is read, if ever."""
        self._saves.clear()
        self.nbytes = 0

    def _settle_oldest(self) -> None:
        packed = self._saves[0]
        held = packed.unsettled.nbytes
        before = (packed.codec, packed.nbytes)
        packed.settle()  # raises for a NaN/inf: the save stays unsettled and held here
        self._saves.popleft()
        self.nbytes -= held
        self.on_settled(packed, before)
