#!/usr/bin/env bash
# The GPU measurements of issues 35 and 36 in one device run of under 9 minutes, for the run
# after ../shared/gpu/check.sh (which builds, runs two CUDA test files and its own bench):
#   device run: command "bash bench/gpu_run.sh", timeout_s 560
# In order, each under its own timeout so that a slow part leaves time to the next: the CUDA
# tests check.sh does not run (the fused kernels on the device, Step on CUDA, the chunked
# loss's device reads), bench/gpu.py on GPT-2 (codecs and their "fused-unread" rows, the
# quant kernels' tile x warps, the training step under the presets), then bench/gpu_step.py
# on GPT-2 (Step at a half and a third of plain's peak against checkpointing, per step and
# back to back, with the allocator's driver calls). Logs and tables under $OUT.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-run}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
START=$SECONDS
left() { echo $(( $1 - (SECONDS - START) )); }
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 \
  && echo "build ok ($((SECONDS - START)) s)" || { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
python3 - <<'EOF'
import time, torch
torch.ones(1, device="cuda")
for name, f in (("mem_get_info", torch.cuda.mem_get_info),
                ("memory_stats", torch.cuda.memory_stats),
                ("memory_stats_as_nested_dict", torch.cuda.memory_stats_as_nested_dict)):
    t = time.perf_counter()
    for _ in range(100):
        f()
    print(f"{name}: {(time.perf_counter() - t) * 1e4:.1f} us a call")
EOF
echo "== CUDA tests ($((SECONDS - START)) s)"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_torch_fused.py tests/test_step_cuda.py \
  tests/test_chunked_loss.py 2>&1 | tail -15
echo "== bench/gpu.py ($((SECONDS - START)) s)"
timeout "$(left 330)" python3 bench/gpu.py --models gpt2 --steps 3 2>&1 | tail -40
cp docs/gpu/latest.md docs/gpu/latest.json "$OUT/" 2>/dev/null
echo "== bench/gpu_step.py ($((SECONDS - START)) s)"
timeout "$(left 530)" python3 bench/gpu_step.py --models gpt2 --steps 4 --out "$OUT/step" 2>&1 | tail -30
echo "== end ($((SECONDS - START)) s)"
