"""A thread that samples the process's live bytes (actcodec.resident.live: RSS less what the
allocators hold free) for their peak; and the readers of actcodec.resident the apps use."""
from __future__ import annotations

import threading
import time

from actcodec.resident import (heap, held_free, live, peak_rss, reset_peak,  # noqa: F401
                               rss)


class Sampler(threading.Thread):
    """The peak of live bytes (RSS less held_free), read every `period` seconds."""

    def __init__(self, period: float = 0.002):
        super().__init__(daemon=True)
        self.period, self.peak_live, self.on = period, 0, False
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            if self.on:
                self.peak_live = max(self.peak_live, live())
            time.sleep(self.period)
