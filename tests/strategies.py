"""Hypothesis strategies for adversarial float arrays, built from raw bit patterns."""
import numpy as np
from hypothesis import strategies as st

from reference import UINT

DTYPES = ["float16", "bfloat16", "float32", "float64"]
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}

# Bit patterns of the awkward values, per element size: +0, -0, +-inf, quiet and signalling
# NaNs with payloads, the smallest and largest subnormals, the smallest normal, max finite, 1.
SPECIAL = {
    2: [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF, 0x0001, 0x03FF, 0x0400, 0x7BFF,
        0x3C00, 0x7F80, 0xFF80, 0x7FC0, 0x0080, 0x7F7F, 0x3F80],
    4: [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF,
        0x00000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x3F800000, 0x80000001],
    8: [0, 1 << 63, 0x7FF0000000000000, 0xFFF0000000000000, 0x7FF8000000000000,
        0x7FF0000000000001, (1 << 64) - 1, 1, 0x000FFFFFFFFFFFFF, 0x0010000000000000,
        0x7FEFFFFFFFFFFFFF, 0x3FF0000000000000],
}

# Lengths around every vector width and block edge, plus anything small.
LENGTHS = st.one_of(
    st.integers(0, 70),
    st.sampled_from([127, 128, 129, 255, 256, 257, 511, 513, 1023, 1025, 4095, 4097]),
    st.integers(0, 5000),
)


@st.composite
def bit_arrays(draw, itemsize=None, lengths=LENGTHS):
    """(dtype name, uint bit-pattern array) with a drawn zero density and special values."""
    name = draw(st.sampled_from(DTYPES)) if itemsize is None else draw(
        st.sampled_from([d for d in DTYPES if ITEMSIZE[d] == itemsize]))
    size = ITEMSIZE[name]
    n = draw(lengths)
    seed = draw(st.integers(0, 2**32 - 1))
    p_zero = draw(st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]))
    p_special = draw(st.sampled_from([0.0, 0.05, 0.5]))
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, np.iinfo(UINT[size]).max, n, dtype=UINT[size], endpoint=True)
    special = np.array(SPECIAL[size], dtype=UINT[size])
    pick = rng.random(n) < p_special
    bits[pick] = special[rng.integers(0, len(special), int(pick.sum()))]
    bits[rng.random(n) < p_zero] = 0
    return name, bits


def as_dtype(name: str, bits: np.ndarray):
    """The array a user would pass: a float view, or uint16 tagged as bfloat16."""
    if name == "bfloat16":
        return bits, "bfloat16"
    return bits.view(name), None
