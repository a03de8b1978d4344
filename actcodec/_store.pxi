# Bindings for the activation store (csrc/store.c): a Store hands out StoreBlocks, buffers
# numpy and torch can sit on; a block's pages return to the store when the last array or
# tensor using it is gone.

cdef extern from "actcodec.h" nogil:
    ctypedef struct ac_store:
        pass
    ctypedef struct ac_store_usage:
        size_t reserved_bytes
        size_t mapped_bytes
        size_t used_bytes
        size_t peak_used_bytes
        size_t blocks
        size_t regions
    ac_store *ac_store_new(size_t reserve_bytes)
    void ac_store_delete(ac_store *s)
    void *ac_store_alloc(ac_store *s, size_t nbytes)
    int ac_store_release(ac_store *s, void *p)
    void ac_store_stats(ac_store *s, ac_store_usage *out)
    void ac_store_reset_peak(ac_store *s)
    void ac_store_restart_peak(ac_store *s)
    void ac_store_forget_plan(ac_store *s)
    size_t ac_store_give_back_free(ac_store *s)


cdef class Store:
    """Pages for blocks that live from a forward pass to its backward (csrc/store.c).
    `reserve_bytes`: address space reserved at a time (0: 32 GiB on 64-bit systems)."""
    cdef ac_store *s
    cdef bint pinned

    def __cinit__(self, size_t reserve_bytes=0):
        self.s = ac_store_new(reserve_bytes)
        if self.s == NULL:
            raise MemoryError("cannot create a store")

    def __dealloc__(self):
        # Blocks hold a reference to their store, so none of those is alive here; a pinned
        # store may still hold memory that C code handed out (torch's allocator), which can
        # be freed even after the interpreter has let go of everything: it stays.
        if not self.pinned:
            ac_store_delete(self.s)

    def pin(self):
        """Never unmap this store's memory as a whole (C code holds its address)."""
        self.pinned = True

    def block(self, size_t nbytes):
        """A StoreBlock of nbytes (uninitialized; 0 bytes gives an empty block)."""
        cdef StoreBlock b = StoreBlock.__new__(StoreBlock)
        b.store = self
        b.nbytes = nbytes
        if nbytes:
            with nogil:
                b.ptr = ac_store_alloc(self.s, nbytes)
            if b.ptr == NULL:
                raise MemoryError(f"the store cannot map {nbytes} bytes")
        return b

    def stats(self):
        cdef ac_store_usage u
        ac_store_stats(self.s, &u)
        return {"reserved_bytes": u.reserved_bytes, "mapped_bytes": u.mapped_bytes,
                "used_bytes": u.used_bytes, "peak_used_bytes": u.peak_used_bytes,
                "blocks": u.blocks, "regions": u.regions}

    def reset_peak(self):
        """A step ends: give back the free pages beyond what its peak needed."""
        ac_store_reset_peak(self.s)

    def give_back_free(self):
        """Every free page goes back to the system, those below live blocks too (a reset
        keeps them); they stay usable. Returns the bytes given back."""
        return ac_store_give_back_free(self.s)

    def restart_peak(self):
        """peak_used_bytes from now on: the pages in use now, and nothing else changes."""
        ac_store_restart_peak(self.s)

    def forget_plan(self):
        """A period ends with no plan for the next and no page given back: the next goes
        first fit over the pages held (one larger than the last)."""
        ac_store_forget_plan(self.s)

    @property
    def address(self):
        """The C store (an ac_store *) for C code that allocates from it."""
        return <size_t>self.s


def store_functions():
    """Addresses of ac_store_alloc and ac_store_release, for C code handed a Store's address."""
    return <size_t>&ac_store_alloc, <size_t>&ac_store_release


cdef class StoreBlock:
    """nbytes of a Store's pages, as a writable byte buffer; released with the last user."""
    cdef Store store
    cdef void *ptr
    cdef size_t nbytes
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]
    cdef object __weakref__

    def __dealloc__(self):
        if self.ptr != NULL:
            ac_store_release(self.store.s, self.ptr)

    @property
    def nbytes(self):
        return self.nbytes

    @property
    def address(self):
        return <size_t>self.ptr

    def __getbuffer__(self, Py_buffer *view, int flags):
        self.shape[0] = <Py_ssize_t>self.nbytes
        self.strides[0] = 1
        view.buf = self.ptr
        view.obj = self
        view.len = <Py_ssize_t>self.nbytes
        view.readonly = 0
        view.itemsize = 1
        view.format = "B"
        view.ndim = 1
        view.shape = self.shape
        view.strides = self.strides
        view.suboffsets = NULL
        view.internal = NULL

    def __releasebuffer__(self, Py_buffer *view):
        pass
