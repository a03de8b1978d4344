"""PyTorch adapters: compress saved activations through the actcodec codecs.

Any model, no changes (saved-tensor hooks):

    with actcodec.torch.compress_saved(Policy.preset("4bit")) as c:
        loss = model(x)
    loss.backward()
    print(c.stats.table())

Needs torch (``pip install actcodec[torch]``).
"""
from .accounting import Accounting, record
from .bridge import decode_tensor, encode_tensor, tensor_array
from .convert import convert, unconvert
from .hooks import compress_saved
from .packing import Packed, Setting, set_codec_threads
from .policy import Policy

SavedStats = Accounting  # the name earlier versions used

__all__ = ["Accounting", "Packed", "Policy", "SavedStats", "Setting", "compress_saved",
           "convert", "decode_tensor", "encode_tensor", "record", "set_codec_threads",
           "tensor_array", "unconvert"]
