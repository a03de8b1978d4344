import os

import pytest
from hypothesis import HealthCheck, settings

import actcodec

try:  # without a GPU, Triton kernels run on CPU tensors under Triton's interpreter, which
    import torch  # must be on before the kernels are defined (at actcodec.torch's import)

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:
    pass

settings.register_profile(
    "default", deadline=None, max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                          HealthCheck.function_scoped_fixture],  # opts is per test, not per example
)
settings.register_profile("thorough", parent=settings.get_profile("default"), max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

PATHS = actcodec.simd_info()["available"]
THREADS = [1, 2]


@pytest.fixture(params=[(p, t) for p in PATHS for t in THREADS],
                ids=[f"{p}-{t}t" for p in PATHS for t in THREADS])
def opts(request):
    """One SIMD path and thread count, as the per-call options every codec call takes."""
    path, threads = request.param
    return {"simd": path, "threads": threads}
