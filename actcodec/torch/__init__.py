"""PyTorch adapters: compress saved activations through the actcodec codecs.

    with actcodec.torch.compress_saved():        # lossless by default
        loss = model(x).sum()
    loss.backward()

Needs torch (``pip install actcodec[torch]``).
"""
from .bridge import decode_tensor, encode_tensor, tensor_array
from .hooks import Policy, SavedStats, compress_saved

__all__ = ["Policy", "SavedStats", "compress_saved", "decode_tensor", "encode_tensor",
           "tensor_array"]
