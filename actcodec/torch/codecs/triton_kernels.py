"""The codecs as fused Triton kernels: each pass reads its input once and writes the C path's
format (docs/FORMAT.md) byte for byte. Imported only where Triton is; actcodec.torch.codecs.fused
launches them and falls back to the torch-op path (device.py) for what they do not cover.

Bit identity with csrc/: every float operation is one float32 operation, correctly rounded:
divisions are `tl.math.div_rn` (a plain `/` may be approximate on a GPU), and the launches pass
`enable_fp_fusion=False`, so that no multiply and add become one fused multiply-add. Rounding
to nearest even is the C path's magic-number addition, exact for 0 <= t < 2^23.

Inputs come as integer views of their element bits (int32 for float32, int16 for float16 and
bfloat16; the quant kernels take the float tensors too and read their bits): the statistics
work on bits, as the C path's, and conversions to float32 are exact
(bfloat16 is the top half of a float32).
"""
import triton
import triton.language as tl

MAGIC = tl.constexpr(8388608.0)  # 2^23: t + 2^23 has an ulp of one, so it rounds t
MAGIC_BITS = tl.constexpr(0x4B000000)
# Statistics rows the programs fold into, program p into row p % SLOTS: atomics from every
# program on one row serialize (measured on an H100: +1.3 copies' time at 64M elements).
SLOTS = tl.constexpr(128)


@triton.jit
def _to_f32(xb, KIND: tl.constexpr):
    """Element bits (int32 for float32, int16 otherwise) as float32, exactly. KIND: 0 float32,
    1 float16, 2 bfloat16."""
    if KIND == 0:
        return xb.to(tl.float32, bitcast=True)
    elif KIND == 1:
        return xb.to(tl.float16, bitcast=True).to(tl.float32)
    else:
        return (xb.to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _bits_pointer(x_ptr, KIND: tl.constexpr):
    """x_ptr (the elements, or their bits) as a pointer to their bits: int32 for float32,
    int16 otherwise."""
    if KIND == 0:
        return x_ptr.to(tl.pointer_type(tl.int32))
    else:
        return x_ptr.to(tl.pointer_type(tl.int16))


@triton.jit
def _mix32(x):
    """ac_mix32 on uint32 lanes."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _stats_row(stats_ptr, pid, b, valid, EXP: tl.constexpr, HUGE: tl.constexpr,
               ABS: tl.constexpr, bad):
    """Fold a tile into its statistics row (six int32, each starting at INT32_MIN: one fill
    makes them) with atomics: nonzero count, the greatest complement (~) of a nonzero bit
    pattern and the greatest nonzero bit pattern (the least pattern is the complement of the
    first: the two are equal iff the nonzero elements are one pattern), non-finite elements,
    finite elements of magnitude at least HUGE (2^126: a group's range could overflow
    float32), and `bad` (the caller's count of bad groups). Counts add to INT32_MIN, wrapping:
    a row's count is its value + 2^31 (each under 2^32). b: the element bits as int32, and
    valid, of one shape (any rank: each reduction is over every element, in whatever order
    the compiler keeps them, so no layout is converted). Returns the nonzero count."""
    nz = (b != 0) & valid
    nonfinite = ((b & EXP) == EXP) & valid
    huge = ((b & ABS) >= HUGE) & ~nonfinite & valid
    count = tl.sum(nz.to(tl.int32))
    stats_ptr += (pid % SLOTS) * 6
    tl.atomic_add(stats_ptr, count, sem="relaxed")
    tl.atomic_max(stats_ptr + 1, tl.max(tl.where(nz, ~b, -2147483647 - 1)), sem="relaxed")
    tl.atomic_max(stats_ptr + 2, tl.max(tl.where(nz, b, -2147483647 - 1)), sem="relaxed")
    tl.atomic_add(stats_ptr + 3, tl.sum(nonfinite.to(tl.int32)), sem="relaxed")
    tl.atomic_add(stats_ptr + 4, tl.sum(huge.to(tl.int32)), sem="relaxed")
    tl.atomic_add(stats_ptr + 5, bad, sem="relaxed")
    return count


@triton.jit(do_not_specialize=["key"])  # a key of 1 would become a constant
def quant_encode(x_ptr, out_ptr, stats_ptr, n, nbytes, ngroups, key, mins_at, scales_at,
                 G: tl.constexpr, TILE: tl.constexpr, BITS: tl.constexpr,
                 STOCHASTIC: tl.constexpr, KIND: tl.constexpr, EXP: tl.constexpr,
                 HUGE: tl.constexpr, ABS: tl.constexpr):
    """Per-group quantization of a tile of TILE elements (whole groups of a power-of-two G;
    the array's last group may be short) in one read: group extrema, scales, codes packed in
    the unified layout, and the tile's statistics folded into a row (see _stats_row; bad
    groups: those whose scale is not finite, from a NaN/inf or a range beyond float32). The
    codes, mins and scales go into one byte buffer: the codes from its start, the float32
    mins and scales from byte offsets mins_at and scales_at (multiples of 4)."""
    pid = tl.program_id(0).to(tl.int64)
    packed_ptr = out_ptr
    mins_ptr = (out_ptr + mins_at).to(tl.pointer_type(tl.float32))
    scales_ptr = (out_ptr + scales_at).to(tl.pointer_type(tl.float32))
    ROWS: tl.constexpr = TILE // G
    LEVELS: tl.constexpr = (1 << BITS) - 1
    r = tl.arange(0, ROWS)
    idx = pid * TILE + r[:, None] * G + tl.arange(0, G)[None, :]
    valid = idx < n
    xb = tl.load(_bits_pointer(x_ptr, KIND) + idx, mask=valid, other=0)
    x = _to_f32(xb, KIND)
    # +0.0 turns a zero extreme into +0.0 whichever its sign, as the C path's range does.
    mn = tl.min(tl.where(valid, x, float("inf")), axis=1) + 0.0
    mx = tl.max(tl.where(valid, x, float("-inf")), axis=1) + 0.0
    scale = tl.math.div_rn(mx - mn, tl.full([ROWS], LEVELS, tl.float32))
    inv = tl.where(scale > 0, tl.math.div_rn(tl.full([ROWS], 1.0, tl.float32), scale), 0.0)
    d = x - mn[:, None]
    divide = inv == float("inf")
    if tl.max(divide.to(tl.int32), axis=0) > 0:
        # A scale too small to invert: its group divides by the scale (and multiplies by
        # one); the others divide by one (exact) and multiply by their inverse.
        divisor = tl.where(divide, scale, 1.0)
        factor = tl.where(divide, 1.0, inv)
        t = tl.math.div_rn(d, divisor[:, None]) * factor[:, None]
    else:
        t = d * inv[:, None]
    if STOCHASTIC:
        lo = idx.to(tl.uint32)  # the index modulo 2^32: the key covers the rest
        h = _mix32((lo * 0x9E3779B1) ^ key.to(tl.uint32)) >> 8
        y = t + h.to(tl.float32) * (1.0 / 16777216.0)
        q = tl.floor(y).to(tl.int32)
    else:
        q = (t + MAGIC).to(tl.int32, bitcast=True) - MAGIC_BITS
    q = tl.where(valid, tl.minimum(q, LEVELS), 0)
    if BITS == 8:  # one code a byte, in element order: byte i is element i's code
        tl.store(packed_ptr + idx, q.to(tl.uint8), mask=idx < nbytes)
    else:
        PER: tl.constexpr = 256 // BITS
        PLANES: tl.constexpr = 8 // BITS
        planes = tl.reshape(q, [TILE // PER, PLANES, 32])
        shifts = (tl.arange(0, PLANES) * BITS)[None, :, None]
        packed = tl.sum(planes << shifts, axis=1)  # distinct bits: the sum is the OR
        BLOCKS: tl.constexpr = TILE // PER
        out = pid * (BLOCKS * 32) + tl.arange(0, BLOCKS)[:, None] * 32 + \
            tl.arange(0, 32)[None, :]
        tl.store(packed_ptr + out, packed.to(tl.uint8), mask=out < nbytes)
    g = pid * ROWS + r
    tl.store(mins_ptr + g, mn, mask=g < ngroups)
    tl.store(scales_ptr + g, scale, mask=g < ngroups)
    bad = ((scale != scale) | (tl.abs(scale) == float("inf"))) & (g < ngroups)
    _stats_row(stats_ptr, pid, xb.to(tl.int32), valid, EXP, HUGE, ABS,
               tl.sum(bad.to(tl.int32), axis=0))


@triton.jit
def quant_decode(packed_ptr, mins_ptr, scales_ptr, out_ptr, n, nbytes, G,
                 TILE: tl.constexpr, BITS: tl.constexpr, OUT: tl.constexpr):
    """mins + code * scale for a tile of TILE codes (any group size G), a multiply and an add
    each rounded to float32, written as OUT: 0 float32, 1 float16, 2 bfloat16 (int16 bits,
    rounded to nearest even as torch converts). mins_ptr, scales_ptr: the bytes of their
    float32 values (4-byte aligned)."""
    pid = tl.program_id(0).to(tl.int64)
    mins_ptr = mins_ptr.to(tl.pointer_type(tl.float32))
    scales_ptr = scales_ptr.to(tl.pointer_type(tl.float32))
    PER: tl.constexpr = 256 // BITS
    PLANES: tl.constexpr = 8 // BITS
    BLOCKS: tl.constexpr = TILE // PER
    at = pid * (BLOCKS * 32) + tl.arange(0, BLOCKS)[:, None] * 32 + tl.arange(0, 32)[None, :]
    byte = tl.load(packed_ptr + at, mask=at < nbytes, other=0).to(tl.int32)
    shifts = (tl.arange(0, PLANES) * BITS)[None, :, None]
    codes = tl.reshape((byte[:, None, :] >> shifts) & ((1 << BITS) - 1), [TILE])
    idx = pid * TILE + tl.arange(0, TILE)
    valid = idx < n
    g = idx // G
    mn = tl.load(mins_ptr + g, mask=valid, other=0.0)
    sc = tl.load(scales_ptr + g, mask=valid, other=0.0)
    v = codes.to(tl.float32) * sc + mn
    if OUT == 0:
        tl.store(out_ptr + idx, v, mask=valid)
    elif OUT == 1:
        tl.store(out_ptr + idx, v.to(tl.float16), mask=valid)
    else:
        u = v.to(tl.int32, bitcast=True)
        nan = (u & 0x7FFFFFFF) > 0x7F800000
        rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        bf = tl.where(nan, 0x7FC0, rounded)
        tl.store(out_ptr.to(tl.pointer_type(tl.int16)) + idx, bf.to(tl.int16), mask=valid)


@triton.jit
def bitmap_encode(x_ptr, bitmap_ptr, counts_ptr, stats_ptr, n, TILE: tl.constexpr,
                  EXP: tl.constexpr, HUGE: tl.constexpr, ABS: tl.constexpr):
    """The bitmap of nonzero bit patterns (np.packbits, little bit order) of a tile, its
    nonzero count, and its statistics folded into a row (see _stats_row)."""
    pid = tl.program_id(0).to(tl.int64)
    idx = pid * TILE + tl.arange(0, TILE)
    valid = idx < n
    xb = tl.load(x_ptr + idx, mask=valid, other=0)
    nz = ((xb != 0) & valid).to(tl.int32)
    bits = tl.reshape(nz, [TILE // 8, 8]) << tl.arange(0, 8)[None, :]
    at = pid * (TILE // 8) + tl.arange(0, TILE // 8)
    tl.store(bitmap_ptr + at, tl.sum(bits, axis=1).to(tl.uint8), mask=at * 8 < n)
    count = _stats_row(stats_ptr, pid, xb.to(tl.int32), valid, EXP, HUGE, ABS, 0)
    tl.store(counts_ptr + pid, count)


@triton.jit
def compact(x_ptr, offsets_ptr, out_ptr, n, TILE: tl.constexpr):
    """The nonzero elements of a tile, in order, from the tile's offset into out."""
    pid = tl.program_id(0).to(tl.int64)
    idx = pid * TILE + tl.arange(0, TILE)
    valid = idx < n
    xb = tl.load(x_ptr + idx, mask=valid, other=0)
    nz = (xb != 0) & valid
    at = tl.load(offsets_ptr + pid) + tl.cumsum(nz.to(tl.int32), axis=0) - 1
    tl.store(out_ptr + at, xb, mask=nz)


@triton.jit
def _bits_of_tile(bitmap_ptr, pid, n, TILE: tl.constexpr):
    """A tile's bits of the bitmap (elements past n read as zero)."""
    at = pid * (TILE // 8) + tl.arange(0, TILE // 8)
    byte = tl.load(bitmap_ptr + at, mask=at * 8 < n, other=0).to(tl.int32)  # int64: no wrap
    bits = tl.reshape((byte[:, None] >> tl.arange(0, 8)[None, :]) & 1, [TILE])
    idx = pid * TILE + tl.arange(0, TILE)
    return tl.where(idx < n, bits, 0), idx


@triton.jit
def bitmap_counts(bitmap_ptr, counts_ptr, n, TILE: tl.constexpr):
    """How many bits each tile of the bitmap sets."""
    pid = tl.program_id(0).to(tl.int64)
    bits, idx = _bits_of_tile(bitmap_ptr, pid, n, TILE)
    tl.store(counts_ptr + pid, tl.sum(bits, axis=0).to(tl.int64))


@triton.jit
def expand(bitmap_ptr, offsets_ptr, values_ptr, out_ptr, n, TILE: tl.constexpr):
    """Scatter back: each set bit's element takes the next value, the others zero."""
    pid = tl.program_id(0).to(tl.int64)
    bits, idx = _bits_of_tile(bitmap_ptr, pid, n, TILE)
    at = tl.load(offsets_ptr + pid) + tl.cumsum(bits, axis=0) - 1
    v = tl.load(values_ptr + at, mask=bits != 0, other=0)
    tl.store(out_ptr + idx, v, mask=idx < n)
