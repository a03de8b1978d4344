"""The optimizer's step after a training step, kept to the step's limit by the allocator itself
(a CUDA device's caching allocator, through the meter's `capped`).

A step leaves its freed blocks cached for the next. The optimizer's temporaries (AdamW's
square roots: on CUDA one per parameter at once) mostly fit in those blocks; where one does
not, the allocator would reserve a new block past the limit. Emptying the whole cache before
the optimizer's step keeps the limit but sends every block of the next step back to the
driver. Instead, the optimizer's own step runs with the allocator capped at the limit (step
pre- and post-hooks on the optimizer): it frees cached blocks only where a temporary fits
none of them. An optimizer step that raises leaves the cap in force until the next training
step starts (disarm), the next optimizer step, or close (release).

One per optimizer, shared by the Steps given it (`attach`; the last to release takes the
hooks off): the optimizer's step after a training step runs under that step's cap alone,
whichever Step ran it. The hooks hold this object, not the Steps: the optimizer's
state_dict, pickle and deepcopy carry no hooks (torch.optim's __getstate__ leaves them
out). The lock is reentrant: a Step collected (its finalizer releasing) while a hook holds
it, in the same thread, must not wait for itself.
"""
from __future__ import annotations

import threading


class OptimizerCap:
    """Arms the next `optimizer.step()` to run under `meter.capped(limit)`, once."""

    def __init__(self, optimizer):
        self.lock = threading.RLock()
        self._armed = None  # (meter, limit) for the next optimizer step
        self._open = None  # the cap context an optimizer step runs in now
        self.users = 1
        self._handles = [optimizer.register_step_pre_hook(self._before),
                         optimizer.register_step_post_hook(self._after)]

    @classmethod
    def attach(cls, optimizer) -> "OptimizerCap":
        """The optimizer's cap, with one user more: the one another Step put on it, or new."""
        for hook in getattr(optimizer, "_optimizer_step_pre_hooks", {}).values():
            cap = getattr(hook, "__self__", None)
            if isinstance(cap, cls):
                with cap.lock:
                    if cap.users > 0:
                        cap.users += 1
                        return cap
        return cls(optimizer)

    def arm(self, meter, limit: int) -> None:
        """The next optimizer step (only it) runs with the allocator kept to `limit`."""
        with self.lock:
            self._armed = (meter, limit)

    def disarm(self) -> None:
        """Nothing armed, and a cap an optimizer step left open (it raised) closed."""
        with self.lock:
            self._armed = None
            self._close()

    def release(self) -> None:
        """One user fewer; the last takes the hooks off (and closes a cap left open)."""
        with self.lock:
            if self.users <= 0:
                return
            self.users -= 1
            if self.users:
                return
            self.disarm()
            for handle in self._handles:
                handle.remove()
            self._handles = []

    def _before(self, optimizer, args, kwargs) -> None:
        with self.lock:
            self._close()
            armed, self._armed = self._armed, None
            if armed is None:
                return
            meter, limit = armed
            cap = meter.capped(limit)
            cap.__enter__()
            self._open = cap
            if self.users <= 0:  # released meanwhile (a Step collected in this thread)
                self._close()

    def _after(self, optimizer, args, kwargs) -> None:
        with self.lock:
            self._close()

    def _close(self) -> None:  # under lock
        cap, self._open = self._open, None
        if cap is not None:
            cap.__exit__(None, None, None)
