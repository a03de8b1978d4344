"""torch dtypes and the codecs' dtype names, and the integer types that view their bits."""
from __future__ import annotations

import numpy as np
import torch

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                "float64": torch.float64, "bool": torch.bool}
NAMES = {v: k for k, v in TORCH_DTYPES.items()}
# same-size integer views of the element bits (numpy has no bfloat16)
BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
         torch.float64: torch.int64, torch.bool: torch.uint8}
UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
