"""PyTorch adapters: compress saved activations through the actcodec codecs.

Any model, no changes (saved-tensor hooks):

    with actcodec.torch.compress_saved(Policy.preset("4bit")) as c:
        loss = model(x)
    loss.backward()
    print(c.stats.table())

Or swap standard layers for ones whose autograd Functions save compressed inputs (`convert`).
Needs torch (``pip install actcodec[torch]``).
"""
import sys as _sys

from .codecs import backend  # registers the torch backend of the core (actcodec.backends)
from .save import allocator
from .save.accounting import Accounting
from .codecs.backend import decode, encode
from .budget.budget import parse_bytes
from .save.convert import convert, unconvert
from .save.hooks import compress_saved, record
from .save.offload import offload_saved
from .codecs.packed import Packed
from .save.policy import Policy, Setting
from .save.saved_bytes import CountSaved, count_saved
from .limit.limit_plan import Plan
from .limit.step import MemoryLimitError, Step
from .limit.chunked_loss import chunked_cross_entropy
from .limit.causal_lm import causal_lm_loss
from .limit.loss_weights import count_targets
from . import budget as _budget, codecs as _codecs, limit as _limit, save as _save

# The modules' paths before the packages (actcodec.torch.step, ...), kept for one release.
for _package in (_codecs, _save, _budget, _limit):
    for _name, _module in list(vars(_package).items()):
        if getattr(_module, "__name__", "").startswith(_package.__name__ + "."):
            _sys.modules.setdefault(f"{__name__}.{_name}", _module)
            if _name not in ("save", "budget"):
                globals().setdefault(_name, _module)
del _package, _name, _module

__all__ = ["Accounting", "CountSaved", "MemoryLimitError", "Packed", "Plan", "Policy", "Setting",
           "Step", "allocator", "causal_lm_loss", "chunked_cross_entropy", "compress_saved",
           "convert", "count_saved", "count_targets", "decode", "encode", "offload_saved",
           "parse_bytes", "record", "unconvert"]
