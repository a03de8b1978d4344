# cython: boundscheck=False, wraparound=False
# The one extension module: a single copy of the C core, so the ISA choice and the thread
# count are shared by every codec. Each codec's bindings live in their own .pxi file.
import numpy as np
cimport numpy as cnp

cnp.import_array()

include "_capi.pxi"
include "_runtime.pxi"
include "_bitmap.pxi"
include "_quant.pxi"
include "_pages.pxi"
