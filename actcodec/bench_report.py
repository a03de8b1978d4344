"""The codec report of `python -m actcodec bench`: every codec and bit width, encode and decode,
on float32 and float16, each row one interleaved run (benchmark.time_interleaved) of our codec,
a threaded copy of the same array and the alternatives that do the same job, in both memory
regimes; plus the min/max reductions. Markdown and PNG output: bench_render.py."""
from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import time
from dataclasses import dataclass, field
from statistics import median
from typing import Callable

import numpy as np

from . import _ext, bitmap, bitmap_quant, quant, raw
from .auto import choose, encode as auto_encode
from .benchmark import (REGIMES, fixed_mmap_threshold, load_bitsandbytes, load_torchao,
                        memory_regime, normal, numpy_bitmap_decode, numpy_bitmap_encode,
                        read_input, relu_like, threaded_copy, threaded_fill, time_interleaved,
                        torch_eager_dequantize, torch_eager_quantize)

try:
    import resource
except ImportError:  # not on Windows
    resource = None

CODECS = ("raw", "bitmap", "quant", "bitmap_quant", "auto")
DTYPES = ("float32", "float16")
BITMAP_ZEROS = (0.1, 0.5, 0.9)
QUANT_BITS = (1, 2, 4, 8)
RELU_ZEROS = 0.5            # a ReLU of zero-mean pre-activations: half exact zeros
BITMAP_QUANT_BITS = (2, 4, 8)
AUTO_CASES = ((None, 0.0), (None, RELU_ZEROS), (4, RELU_ZEROS), (4, 0.0))  # (bits, zeros)
TORCHAO_BITS = (1, 2, 4)    # torchao packs 1..7 bits; 8-bit codes are plain bytes
GROUP = 256                 # our default group and the eager alternatives' group/blocksize

# What each alternative runs, per codec: printed under its table.
ALTERNATIVES = {
    ("raw", "numpy"): "`ndarray.copy()` of the array (encode) and of the stored bytes "
                      "(decode), on one thread: what the raw codec itself runs.",
    ("raw", "torch"): "`Tensor.clone()` of the same memory (torch's threads).",
    ("bitmap", "numpy"): "`np.packbits` of the nonzero mask + boolean indexing of the bit "
                         "patterns; decode: `np.unpackbits` + masked assignment into zeros.",
    ("quant", "torch eager"): "the same codec in eager torch ops: per-group (256) "
                              "`torch.aminmax`, scale, round, clamp, shift-OR packing into "
                              "the same layout; decode: shifts, masks, `mn + code * scale`. "
                              "Computes in the input's dtype.",
    ("quant", "bitsandbytes"): "`bitsandbytes.functional.quantize_blockwise` / "
                               "`dequantize_blockwise`, blocksize 256, on the CPU: 8-bit codes "
                               "of its dynamic map scaled by each block's absmax (its own 8-bit "
                               "format; it has no 1/2/4-bit blockwise CPU path).",
    ("quant", "torchao pack"): "torchao's bit packing only (`pack_cpu` / `unpack_cpu` of "
                               "`torchao.prototype.dtypes.uintx.bitpacking`) of the same number "
                               "of k-bit codes, held one per byte in a uint8 tensor. It does not "
                               "quantize: no min/max, no scaling, and it reads 1 byte per "
                               "element where our encode reads the floats; its unpack gives "
                               "uint8 codes where our decode gives floats. So this is torchao's "
                               "packing step against our whole codec (k = 1, 2, 4).",
    ("bitmap_quant", "numpy + torch eager"): "numpy bitmap (as for bitmap) then the torch "
                                             "eager quantizer (as for quant) on the nonzero "
                                             "values; decode: torch eager dequantize, then "
                                             "numpy scatter into zeros.",
    ("auto", "direct call"): "`actcodec.encode(x, <the codec auto chose>, bits=k)`: the same "
                             "encoding without the choice; the difference is auto's counting "
                             "pass. Decode is that codec's decode.",
}


@dataclass
class Case:
    """One row's work: our encode, an encoding made up front (size ratio; decode candidate),
    and the alternatives, label -> (encode fn or None, decode fn or None)."""
    codec: str
    params: dict
    x: np.ndarray
    encode: Callable
    enc: object
    alts: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)      # more candidates, name -> fn
    notes: Callable | None = None                  # times -> {column: text}


@dataclass
class Row:
    codec: str
    dtype: str
    memory: str
    params: dict                 # column -> text, e.g. {"k": "4", "zeros": "50%"}
    ratio: float                 # size ratio of our encoding
    ms: dict                     # candidate -> median ms
    vs_copy: dict                # "encode"/"decode" -> our time / copy's time
    alts: dict                   # label -> {"encode": speedup or None, "decode": ...}
    notes: dict                  # column -> text


@dataclass
class Env:
    torch: object = None
    bnb: object = None
    torchao: object = None


def load_env() -> Env:
    try:
        import torch
    except ImportError:  # optional baseline
        torch = None
    return Env(torch=torch, bnb=load_bitsandbytes() if torch is not None else None,
               torchao=load_torchao() if torch is not None else None)


# --- cases ---------------------------------------------------------------------------------

def _zeros(zf: float) -> str:
    return f"{zf:.0%}" if zf else "dense N(0,1)"


def _raw_cases(nbytes, dtype, env):
    x = normal(nbytes, dtype)
    enc = raw.encode(x)
    stored = enc.buffers[0]
    alts = {"numpy": (lambda: x.copy(), lambda: stored.view(x.dtype).copy())}
    if env.torch is not None:
        xt, st = env.torch.from_numpy(x), env.torch.from_numpy(stored)
        alts["torch"] = (xt.clone, st.clone)
    yield Case("raw", {}, x, lambda: raw.encode(x), enc, alts)


def _bitmap_cases(nbytes, dtype, env):
    for zf in BITMAP_ZEROS:
        x = relu_like(nbytes, zf, dtype=dtype)
        enc = bitmap.encode(x)
        packed, values = numpy_bitmap_encode(x)
        if enc.decode().tobytes() != x.tobytes() or (
                numpy_bitmap_decode(packed, values, x.size).tobytes() != x.tobytes()):
            raise RuntimeError(f"bitmap round trip differs ({dtype}, {zf:.0%} zeros)")
        alts = {"numpy": (lambda x=x: numpy_bitmap_encode(x),
                          lambda x=x, p=packed, v=values: numpy_bitmap_decode(p, v, x.size))}
        yield Case("bitmap", {"zeros": _zeros(zf)}, x, lambda x=x: bitmap.encode(x), enc, alts)


def _with_conversion(on, fn):
    def run():
        _ext.set_bittrick(on)
        try:
            return fn()
        finally:
            _ext.set_bittrick(None)
    return run


def _quant_notes(t):
    notes = {"trick / cast (enc, dec)": f"{t['encode trick'] / t['encode cast']:.2f}, "
                                        f"{t['decode trick'] / t['decode cast']:.2f}"}
    if "torch eager: encode" in t:
        notes["torch eager / read"] = f"{t['torch eager: encode'] / t['read']:.1f}x"
    return notes


def _quant_cases(nbytes, dtype, env):
    x = normal(nbytes, dtype)
    torch = env.torch
    xt = torch.from_numpy(x) if torch is not None else None
    for k in QUANT_BITS:
        enc = quant.encode(x, k)
        alts = {}
        if torch is not None:
            tq = torch_eager_quantize(xt, k)
            alts["torch eager"] = (lambda k=k: torch_eager_quantize(xt, k),
                                   lambda k=k, tq=tq: torch_eager_dequantize(*tq, k))
        if env.bnb is not None and k == 8:
            bq = env.bnb.quantize_blockwise(xt, blocksize=GROUP)
            alts["bitsandbytes"] = (lambda: env.bnb.quantize_blockwise(xt, blocksize=GROUP),
                                    lambda bq=bq: env.bnb.dequantize_blockwise(*bq))
        if env.torchao is not None and env.torchao.ok and k in TORCHAO_BITS:
            ta = env.torchao
            codes = torch.randint(0, 1 << k, (x.size,), dtype=torch.uint8,
                                  generator=torch.Generator().manual_seed(k))
            packed = ta.pack(codes, k)
            alts["torchao pack"] = (lambda k=k, c=codes: ta.pack(c, k),  # noqa: B023
                                    lambda k=k, p=packed: ta.unpack(p, k))  # noqa: B023
        extra = {
            "encode trick": _with_conversion(True, lambda k=k: quant.encode(x, k)),
            "encode cast": _with_conversion(False, lambda k=k: quant.encode(x, k)),
            "decode trick": _with_conversion(True, enc.decode),
            "decode cast": _with_conversion(False, enc.decode),
        }
        yield Case("quant", {"k": str(k)}, x, lambda k=k: quant.encode(x, k), enc, alts,
                   extra, _quant_notes)


def _bitmap_quant_cases(nbytes, dtype, env):
    x = relu_like(nbytes, RELU_ZEROS, dtype=dtype, nonzero_multiple=GROUP)
    torch = env.torch
    packed, values = numpy_bitmap_encode(x)
    vt = torch.from_numpy(values.view(x.dtype)) if torch is not None else None
    for k in BITMAP_QUANT_BITS:
        enc = bitmap_quant.encode(x, k)
        alts = {}
        if torch is not None:
            tq = torch_eager_quantize(vt, k)

            def alt_encode(k=k):
                p, v = numpy_bitmap_encode(x)
                return p, torch_eager_quantize(torch.from_numpy(v.view(x.dtype)), k)

            def alt_decode(k=k, tq=tq):
                vals = torch_eager_dequantize(*tq, k).numpy()
                return numpy_bitmap_decode(packed, vals.view(values.dtype), x.size)
            alts["numpy + torch eager"] = (alt_encode, alt_decode)
        yield Case("bitmap_quant", {"k": str(k), "zeros": _zeros(RELU_ZEROS)}, x,
                   lambda k=k: bitmap_quant.encode(x, k), enc, alts)


def _auto_cases(nbytes, dtype, env):
    for bits, zf in AUTO_CASES:
        x = relu_like(nbytes, zf, dtype=dtype) if zf else normal(nbytes, dtype)
        chosen = choose(x, bits)
        enc = auto_encode(x, bits=bits)
        params = {"bits": "lossless" if bits is None else str(bits), "zeros": _zeros(zf)}
        alts = {"direct call": (lambda x=x, c=chosen, b=bits: auto_encode(x, c, bits=b), None)}
        yield Case("auto", params, x, lambda x=x, b=bits: auto_encode(x, bits=b), enc, alts,
                   notes=lambda t, c=chosen: {"chose": c})


BUILDERS = {"raw": _raw_cases, "bitmap": _bitmap_cases, "quant": _quant_cases,
            "bitmap_quant": _bitmap_quant_cases, "auto": _auto_cases}


# --- running -------------------------------------------------------------------------------

def run_case(case: Case, dtype: str, regime: str, rounds: int) -> Row:
    """Time one case in one memory regime: every candidate interleaved on the same input."""
    copy_faults = []
    cands = {"copy": lambda: _counting_faults(copy_faults, threaded_copy, case.x),
             "encode": case.encode,
             "decode": case.enc.decode, "read": read_input(case.x),
             "fill": lambda: threaded_fill(case.x.nbytes)}
    for label, fns in case.alts.items():
        for op, fn in zip(("encode", "decode"), fns):
            if fn is not None:
                cands[f"{label}: {op}"] = fn
    cands.update(case.extra)
    with memory_regime(regime):
        t = time_interleaved(cands, rounds=rounds)
    alts = {label: {op: (t[f"{label}: {op}"] / t[op] if f"{label}: {op}" in t else None)
                    for op in ("encode", "decode")} for label in case.alts}
    return Row(codec=case.codec, dtype=dtype, memory=regime, params=dict(case.params),
               ratio=case.enc.ratio, ms={name: s * 1e3 for name, s in t.items()},
               vs_copy={op: t[op] / t["copy"] for op in ("encode", "decode")},
               alts=alts, notes={**_floor_notes(t), **(case.notes(t) if case.notes else {}),
                                 **_fault_notes(copy_faults)})


def _counting_faults(counts: list, fn, *args):
    """fn(*args), appending the page faults it took to counts (where the OS tells)."""
    if resource is None:
        return fn(*args)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    out = fn(*args)
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return out


def _fault_notes(counts: list) -> dict:
    """The copy's median page faults per timed call (the warm-up call left out): the memory
    regime as the OS saw it. A fresh 64 MiB output takes 33 or more, a reused one none."""
    timed = counts[1:]
    return {"copy faults": str(int(median(timed)))} if timed else {}


def _floor_notes(t) -> dict:
    """How close encode and decode come to the least their reads and writes cost."""
    return {"encode / read": f"{t['encode'] / t['read']:.2f}",
            "decode / fill": f"{t['decode'] / t['fill']:.2f}",
            "fill / copy": f"{t['fill'] / t['copy']:.2f}"}


def codec_rows(mib: int = 64, rounds: int = 9, codecs=CODECS, dtypes=DTYPES,
               regimes=REGIMES, env: Env | None = None, progress=None) -> list[Row]:
    """One Row per (dtype, codec case, memory regime), in that order. Timed in another: every
    fresh row before the first reused one (see memory_regime), so the cases of all dtypes
    are built first and held."""
    env = env or load_env()
    fixed_mmap_threshold()
    cases = [(dtype, case) for dtype in dtypes for codec in codecs
             for case in BUILDERS[codec](mib << 20, dtype, env)]
    timed = {}
    for regime in sorted(regimes, key=REGIMES.index):
        for i, (dtype, case) in enumerate(cases):
            t0 = time.perf_counter()
            timed[i, regime] = run_case(case, dtype, regime, rounds)
            if progress is not None:
                progress(timed[i, regime], time.perf_counter() - t0)
    return [timed[i, r] for i in range(len(cases)) for r in regimes]


def reduce_rows(mib: int = 64, rounds: int = 9, threads: int = 2, dtypes=DTYPES):
    """actcodec.reduce.reduce_report per dtype, or a string saying why there are none."""
    try:
        from . import reduce
    except ImportError as exc:  # numba is optional
        return f"not run: {exc}"
    return [row for dt in dtypes for row in reduce.reduce_report(mib, rounds, threads, dt)]


def describe_machine(env: Env) -> dict:
    """Where and with what the numbers were taken."""
    from . import __version__, simd_info

    info = simd_info()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f
                        if ln.startswith("model name")), cpu)
    except OSError:
        pass
    versions = {"actcodec": __version__,
                "python": platform.python_version(), "numpy": np.__version__}
    for name in ("torch", "bitsandbytes", "numba", "matplotlib"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    if env.bnb is None and versions["bitsandbytes"] != "not installed":
        versions["bitsandbytes"] += " (failed to load or no torch: not run)"
    if env.torchao is None:
        versions["torchao"] = "not run (needs torch)"
    else:
        versions["torchao"] = env.torchao.status
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cores": os.cpu_count(), "system": f"{platform.system()} "
            f"{platform.release()}", "path": info["active"], "features": info["features"],
            "threads": info["threads"], "openmp": info["openmp"], "versions": versions,
            "load": load, "date": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%d %H:%M UTC"), "bittrick_default": _ext.get_bittrick()}


@dataclass
class Report:
    mib: int
    rounds: int
    regimes: tuple
    dtypes: tuple
    machine: dict
    rows: list
    reduce: object               # list of reduce_report rows, or a string (why not run)
    seconds: float = 0.0
    load_end: tuple | None = None


def run(mib: int = 64, rounds: int = 9, codecs=(*CODECS, "reduce"), dtypes=DTYPES,
        regimes=REGIMES, progress=None) -> Report:
    """The whole report. torch runs on actcodec's thread count (and so does Numba, in the
    reduce rows), restored afterwards."""
    t0 = time.perf_counter()
    env = load_env()
    threads = _ext.get_num_threads()
    old_torch = env.torch.get_num_threads() if env.torch is not None else None
    if env.torch is not None:
        env.torch.set_num_threads(threads)
    try:
        machine = describe_machine(env)
        rows = codec_rows(mib, rounds, [c for c in codecs if c in CODECS], dtypes, regimes,
                          env, progress)
        red = (reduce_rows(mib, rounds, threads, dtypes) if "reduce" in codecs
               else "not run (not asked for)")
    finally:
        if env.torch is not None:
            env.torch.set_num_threads(old_torch)
    return Report(mib, rounds, tuple(regimes), tuple(dtypes), machine, rows, red,
                  time.perf_counter() - t0,
                  os.getloadavg() if hasattr(os, "getloadavg") else None)
