"""PyTorch adapters: compress saved activations through the actcodec codecs.

Any model, no changes (saved-tensor hooks):

    with actcodec.torch.compress_saved(Policy.preset("4bit")) as c:
        loss = model(x)
    loss.backward()
    print(c.stats.table())

Or swap standard layers for ones whose autograd Functions save compressed inputs (`convert`).
Needs torch (``pip install actcodec[torch]``).
"""
from . import backend  # registers the torch backend of the core (actcodec.backends)
from . import allocator
from .accounting import Accounting
from .backend import decode, encode
from .budget import parse_bytes
from .convert import convert, unconvert
from .hooks import compress_saved, record
from .packed import Packed
from .policy import Policy, Setting
from .saved_bytes import CountSaved, count_saved
from .limit_plan import Plan
from .step import MemoryLimitError, Step

__all__ = ["Accounting", "CountSaved", "MemoryLimitError", "Packed", "Plan", "Policy", "Setting",
           "Step", "allocator", "compress_saved", "convert", "count_saved", "decode", "encode",
           "parse_bytes", "record", "unconvert"]
