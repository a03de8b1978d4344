"""Tensors through the codecs: the torch backend of the core (CPU tensors to the C codecs
without a copy), the same formats in torch ops for tensors on a device, and `Packed`, a
saved tensor in compressed form."""
