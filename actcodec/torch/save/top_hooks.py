"""Which saved-tensor hooks are innermost now: torch keeps a stack of them per thread (its
`saved_tensors_hooks` contexts, a non-reentrant checkpoint's region), and only the top pair
sees a save."""
from __future__ import annotations

import torch


def top_pack():
    """The pack function of the innermost saved-tensor hooks (None: none, or a torch that
    does not say)."""
    try:
        top = torch._C._autograd._top_saved_tensors_default_hooks(False)
    except (AttributeError, RuntimeError, TypeError):
        return None
    return top[0] if top else None
