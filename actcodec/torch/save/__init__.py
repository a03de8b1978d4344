"""The save path: what autograd saves is compressed as it is saved and restored in backward,
through saved-tensor hooks (`compress_saved`) or autograd Functions (`convert`), as a
`Policy` says; exact accounting of the bytes; the activation store's torch allocator."""
