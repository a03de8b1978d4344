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

import weakref
from collections import deque

IN_FLIGHT = 256 << 20  # bytes of saved tensors held until their encodings are read


class Window:
    """Unsettled Packed saves in the order they were made. A save may settle elsewhere first
    (a backward inside the step reads it), or be let go unsettled (its graph freed: nothing
    will read it); either leaves the window at its turn. The window holds the saves weakly:
    they hold the tensors."""

    def __init__(self, limit: int = IN_FLIGHT):
        self.limit = limit
        self._saves: deque = deque()  # (ref to a packed save, bytes it holds)
        self.nbytes = 0  # of the tensors held

    def __len__(self) -> int:
        return len(self._saves)

    def add(self, packed) -> None:
        """Hold an unsettled save; read what has arrived, and wait while over the limit."""
        held = packed.unsettled.nbytes
        self._saves.append((weakref.ref(packed), held))
        self.nbytes += held
        while True:
            self.settle_ready()
            if self.nbytes <= self.limit or len(self._saves) <= 1:
                return
            self._settle_oldest()

    def settle_ready(self) -> None:
        """Settle, in order, the saves whose statistics have arrived (no wait)."""
        while self._saves:
            packed = self._saves[0][0]()
            u = None if packed is None else packed.unsettled
            if u is not None and not u.unread.ready():
                return
            self._settle_oldest()

    def settle_all(self) -> None:
        while self._saves:
            self._settle_oldest()

    def drop(self) -> None:
        """Forget the saves (a step that failed): each settles when it is read, if ever."""
        self._saves.clear()
        self.nbytes = 0

    def _settle_oldest(self) -> None:
        ref, held = self._saves[0]
        packed = ref()
        if packed is not None:
            packed.settle()  # raises for a NaN/inf: the save stays unsettled, and listed
        self._saves.popleft()
        self.nbytes -= held
