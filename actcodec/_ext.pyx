# cython: boundscheck=False, wraparound=False
# The one extension module over the C core; each codec's bindings live in their own .pxi.
# Every binding takes the call's settings (threads, isa, bittrick; 0 / -1 for the process
# defaults) and changes no process-wide state.

include "_capi.pxi"
include "_runtime.pxi"
include "_bitmap.pxi"
include "_quant.pxi"
include "_store.pxi"
