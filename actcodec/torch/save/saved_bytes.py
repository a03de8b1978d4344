"""What plain PyTorch keeps for backward, counted: the bytes of the unique non-parameter
storages autograd saves, with nothing compressed or changed.

    with CountSaved() as counted:
        loss = loss_fn(model)
    print(counted.nbytes)              # or: count_saved(lambda: loss_fn(model))
"""
from __future__ import annotations

import torch


class CountSaved:
    """A counting-only saved_tensors_hooks pass: the unique storages of the saved tensors that
    are not parameters (what plain PyTorch keeps for backward)."""

    def __init__(self):
        self.storages: dict = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t):
        if (t.is_leaf and t.requires_grad) or isinstance(t, torch.nn.Parameter):
            return t
        s = t.untyped_storage()
        if s.nbytes():
            self.storages[(t.device.type, s.data_ptr())] = s.nbytes()
        # Not t itself: an op's output that its own node keeps would form a reference cycle
        # through autograd's C++ objects, which Python's gc cannot break, and the graph of a
        # forward that never runs backward would never be freed.
        return t.detach()

    @property
    def nbytes(self) -> int:
        return sum(self.storages.values())

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)


def count_saved(forward) -> int:
    """Bytes plain PyTorch saves for backward while `forward()` runs (parameters excluded)."""
    with CountSaved() as counted:
        out = forward()
    del out
    return counted.nbytes
