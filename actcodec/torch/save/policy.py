"""Policies: which codec and precision each saved activation gets.

A policy maps (op kind, layer name) to a `Setting`. Resolution order, first match wins:
1. `overrides` keyed by layer name (fnmatch patterns such as "blocks.0.*" or "fc");
2. `overrides` keyed by op kind ("conv", "linear", "batch_norm", "softmax", ...);
3. exact op kinds (`exact`, by default "input": saves no gradient flows to, made by no
   differentiable op): stored lossless. Besides the model's input (which the caller holds
   anyway) these are statistics attention kernels keep for backward, such as
   scaled_dot_product_attention's log-sum-exp per query row: backward recomputes the
   attention probabilities as exp(scores - logsumexp), so an error d in it scales a whole
   row of probabilities by exp(-d). At 8 bits in groups of 256 that is up to about 1.5%
   (measured: on a byte-level GPT-2, the largest single source of 8-bit gradient error, from
   0.3% of the saved bytes);
4. sensitive op kinds (`sensitive`): stored at `sensitive_bits` when the policy's own bits are
   fewer (None = lossless). Measured why: normalisation inputs and softmax outputs feed
   backward formulas that amplify their error (a ViT's gradient at 2 bits keeps a cosine of
   0.08 to the exact one when LayerNorm inputs are quantized too, 0.73 when they are not);
   attention's queries, keys, values and output (op kind "attention": saved inside a module
   whose class name ends in "Attention", outside its projections) feed the gradients of
   every layer below: at 2 bits a byte-level GPT-2 trained on real text ended +52% over
   fp32's held-out loss, with them at 8 bits +6% (bench/text_convergence.py, one seed,
   +21% of the saved bytes);
5. the policy's own codec, bits, group size and rounding.
Saves whose backward reads which elements are positive (`SIGN_READ`: ReLU's output, which
threshold_backward turns into its mask) take "bitmap_quant" where the codec is "auto" and
lossy: dense quantization rounds a small positive next to a zero in its group to zero and
flips the mask (on a transformers ResNet, one such ReLU output left the stem batch norm's
bias gradient at a cosine of 0.9975 under 8 bits; kept sign-exact, 0.9999).
Tensors smaller than `min_bytes` are kept as they are: their metadata would cost more than
their compression saves.
"""
from __future__ import annotations

import copy
import fnmatch
from dataclasses import dataclass, field, replace

import torch

from ... import encoder, quant

OP_KINDS = ("input", "linear", "conv", "relu", "gelu", "silu", "batch_norm", "layer_norm",
            "group_norm", "max_pool", "avg_pool", "dropout", "softmax", "matmul", "clamp",
            "attention", "other")
SENSITIVE = ("batch_norm", "layer_norm", "group_norm", "softmax", "attention")
EXACT = ("input",)
SIGN_READ = ("relu",)

# Measured on a ResNet-18 and a small ViT (docs in README): 2-bit keeps batch norm inputs at
# 2 bits too, because at 8 bits they alone would hold the saved bytes above 1/10 of fp32;
# group size 64 lifts a ResNet-18's 2-bit gradient cosine from 0.51 to 0.83 over 256, and
# batch norm inputs in groups of 128 cost 0.01 of that for the last tenth of the bytes.
PRESETS = {
    "lossless": {"bits": None},
    "8bit": {"bits": 8},
    "4bit": {"bits": 4},
    "2bit": {"bits": 2, "group_size": 64, "overrides": {"batch_norm": {"group_size": 128}},
             "sensitive": ("layer_norm", "group_norm", "softmax", "attention")},
    "auto": {},
}


@dataclass(frozen=True)
class Setting:
    """How to store one tensor. codec: "auto" (the smallest that `bits` allows), "raw",
    "bitmap", "mask", "quant", "bitmap_quant", or "keep" (store it uncompressed).
    bits=None: lossless. threads: codec threads (None: torch.get_num_threads())."""

    codec: str = "auto"
    bits: int | None = 8
    group_size: int | None = 256
    rounding: str = "nearest"
    seed: int = 0
    threads: int | None = None

    def __post_init__(self):
        if self.codec != "keep":
            params = encoder.check(self.codec, self.bits, self.group_size, self.rounding,
                                   "raise", self.seed % 2**64, 0.0)
        elif self.bits is not None:
            params = quant.check_params(self.bits, self.group_size, self.rounding, "raise",
                                        self.seed % 2**64)
        else:
            params = None
        object.__setattr__(self, "params", params)  # the codec's parameters, checked

    def codec_kwargs(self) -> dict:
        if self.bits is None:
            return {}
        return {"bits": self.bits, "group_size": self.group_size, "rounding": self.rounding,
                "seed": self.seed % 2**64}

    def thread_count(self) -> int:
        return self.threads if self.threads is not None else max(1, torch.get_num_threads())


LOSSLESS = Setting(bits=None)
KEEP = Setting(codec="keep", bits=None)


@dataclass(frozen=True)
class Policy:
    """How saved activations are stored (see the module docstring for the rules).

    bits: 1, 2, 4, 8, or None for lossless only; codec: "auto" picks the smallest encoding
    the bits allow per tensor by its density (k-bit dense, bitmap + k-bit nonzeros, bitmap,
    raw), or name one. rounding "stochastic" draws from a seed that changes every step and
    every tensor (`draw`: the save session numbers them). overrides: {op kind or layer
    pattern: dict of Setting fields, or None to keep those tensors uncompressed}. exact: op
    kinds stored lossless unless an override names them (default "input", see the module
    docstring). threads: the codec's threads per
    call (None: torch.get_num_threads() at that moment).
    """

    bits: int | None = 8
    group_size: int | None = 256
    rounding: str = "nearest"
    codec: str = "auto"
    seed: int = 0
    sensitive_bits: int | None = 8
    sensitive: tuple = SENSITIVE
    exact: tuple = EXACT
    overrides: dict = field(default_factory=dict)
    min_bytes: int = 16 * 1024
    threads: int | None = None

    def __post_init__(self):
        base = Setting(self.codec, self.bits, self.group_size, self.rounding,
                       threads=self.threads)
        object.__setattr__(self, "_base", base)
        if self.sensitive_bits is not None:
            Setting(bits=self.sensitive_bits)  # validates
        for key, value in self.overrides.items():
            if value is not None:
                replace(base, **value)  # unknown fields or bad values raise here

    def __hash__(self):
        return id(self)

    @classmethod
    def preset(cls, name: str, **changes) -> "Policy":
        """A named policy; keywords adjust it.

        "lossless": bitmap or raw, whichever is smaller. "8bit", "4bit", "2bit": per tensor
        the smallest of k-bit dense, bitmap + k-bit nonzeros, bitmap and raw (ReLU outputs get
        bitmap + k-bit, which keeps their zeros exact: dense 8-bit everywhere rounds small
        positives to zero and flips ReLU's backward mask, cosine 0.984 on a ResNet-18), with
        sensitive saves at 8 bits. "auto": the default Policy(), today the same as "8bit"."""
        if name not in PRESETS:
            raise ValueError(f"unknown policy preset {name!r}; known: {', '.join(PRESETS)}")
        return cls(**{**copy.deepcopy(PRESETS[name]), **changes})

    def setting(self, op: str, layer: str | None = None, nbytes: int | None = None,
                draw: tuple = (0, 0)):
        """The Setting for one tensor saved by `op` in `layer`, or KEEP. draw: (step, index
        of the save in the step), which a stochastic rounding's seed mixes in."""
        if nbytes is not None and nbytes < self.min_bytes:
            return KEEP
        found, chosen = False, None
        if layer is not None:
            for key, value in self.overrides.items():
                if key not in OP_KINDS and fnmatch.fnmatchcase(layer, key):
                    found, chosen = True, value
                    break
        if not found and op in self.overrides:
            found, chosen = True, self.overrides[op]
        if found:
            if chosen is None:
                return KEEP
            s = replace(self._base, **chosen)
        elif op in self.exact:
            s = replace(self._base, codec="auto", bits=None)
        elif op in self.sensitive and self._coarser(self.bits, self.sensitive_bits):
            s = replace(self._base, bits=self.sensitive_bits)
            if s.bits is None and s.codec in ("quant", "bitmap_quant"):
                s = replace(s, codec="auto")
        else:
            s = self._base
        if op in SIGN_READ and s.codec == "auto" and s.bits is not None:
            s = replace(s, codec="bitmap_quant")  # zeros exact, positives stay positive
        if s.rounding == "stochastic":
            # A distinct stream per step and per tensor: the same seed for every tensor would
            # round correlated positions of different tensors the same way.
            s = replace(s, seed=_mix(self.seed, *draw))
        return s

    @staticmethod
    def _coarser(bits, sensitive_bits) -> bool:
        """True when `bits` keeps less than `sensitive_bits` (None = lossless = everything)."""
        if bits is None:
            return False
        return sensitive_bits is None or bits < sensitive_bits


def _mix(*values: int) -> int:
    """A 64-bit hash of a few integers (splitmix64 steps), for per-tensor seeds."""
    x = 0
    for v in values:
        x = (x ^ (v % 2**64)) + 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
    return x
