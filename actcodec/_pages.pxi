# Memory of its own for large decode outputs (csrc/pages.c): a writable byte buffer that
# numpy arrays and torch tensors can sit on; the mapping goes back to the system when the last
# array using it is gone.

cdef class PageBuffer:
    cdef void *ptr
    cdef size_t nbytes   # what the buffer exposes
    cdef size_t mapped   # what ac_free_pages is given
    cdef Py_ssize_t exports
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]
    cdef object __weakref__

    def __cinit__(self, size_t nbytes):
        self.ptr = ac_alloc_pages(nbytes)
        if self.ptr == NULL:
            raise MemoryError(f"cannot map {nbytes} bytes")
        self.nbytes = self.mapped = nbytes

    def __dealloc__(self):
        ac_free_pages(self.ptr, self.mapped)

    cdef void shrink(self, size_t keep):
        """Cut the buffer to its first `keep` bytes, giving the rest back (an encoder that
        wrote less than the worst case it mapped). Only before anything has a view of it."""
        if self.exports == 0 and keep < self.nbytes:
            self.mapped = ac_shrink_pages(self.ptr, self.mapped, keep)
            self.nbytes = keep

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
        self.exports += 1

    def __releasebuffer__(self, Py_buffer *view):
        self.exports -= 1
