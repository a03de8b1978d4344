"""PyTorch adapters: compress saved activations through the actcodec codecs.

Any model, no changes (saved-tensor hooks):

    with actcodec.torch.compress_saved(Policy.preset("4bit")) as c:
        loss = model(x)
    loss.backward()
    print(c.stats.table())

Or swap standard layers for ones whose autograd Functions save compressed inputs (`convert`).
Needs torch (``pip install actcodec[torch]``).
"""
from . import allocator
from .accounting import Accounting, record
from .convert import convert, unconvert
from .hooks import compress_saved
from .packing import Packed, Setting
from .policy import Policy
from .tensors import decode, encode

__all__ = ["Accounting", "allocator", "Packed", "Policy", "Setting", "compress_saved", "convert", "decode",
           "encode", "record", "unconvert"]
