#!/usr/bin/env bash
# The GPU measurements of issues 35 and 36 that ../shared/gpu/check.sh does not make, for the
# device run after it, in the device time the session has left (status: budget_left_s):
#   device run: command "GPU_RUN_SECONDS=<left - 30> bash bench/gpu_run.sh",
#               timeout_s <left - 20>
# Most needed first, each part under its own timeout inside the total, so that what a short
# budget cuts is what matters least:
#   1. the build, where the machine has none (a warm one keeps check.sh's);
#   2. the CUDA tests of the real streams, events and pinned memory, Step on CUDA and the
#      chunked loss's device reads (seconds);
#   3. bench/gpu_step.py on GPT-2: plain, checkpointing, Step at a third of plain's peak,
#      offload, then a half and the rest (each row printed as it ends);
#   4. the fused kernels' tests on the device (the tile test, whose variants take the
#      longest to compile, left out);
#   5. bench/gpu.py on GPT-2 (codecs with their "fused-unread" rows, tile x warps, the step
#      under the presets; its JSON written after each part);
#   6. bench/gpu_profile.py: where the time of plain, Step at a third and 8-bit steps goes.
# Logs and tables under $OUT.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-run}
BUDGET=${GPU_RUN_SECONDS:-300}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
START=$SECONDS
# seconds a part may take: at most $1, and what the budget has left (10 s kept for the end)
upto() {
  local left=$(( BUDGET - 10 - (SECONDS - START) ))
  echo $(( $1 < left ? $1 : left ))
}
part() {  # part <title> <at most seconds> <lines of output kept> <command...>
  local title=$1 most=$2 lines=$3 t
  shift 3
  t=$(upto "$most")
  if [ "$t" -lt 20 ]; then
    echo "== $title: skipped, $t s left"
    return 0
  fi
  echo "== $title ($((SECONDS - START)) s, up to $t s)"
  timeout "$t" "$@" 2>&1 | tail -n "$lines"
}
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if python3 -c "import actcodec._ext" 2>/dev/null; then
  echo "built already"
else
  python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 \
    && echo "build ok ($((SECONDS - START)) s)" \
    || { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
fi
PYTEST="python3 -m pytest -q -p no:cacheprovider"
part "CUDA tests: streams, Step, chunked loss" 120 15 \
  $PYTEST tests/test_step_cuda.py tests/test_offload.py tests/test_unsettled.py \
  tests/test_chunked_loss.py
part "bench/gpu_step.py" 240 40 \
  python3 bench/gpu_step.py --models gpt2 --steps 3 --out "$OUT/step"
part "fused kernels' tests" 120 15 \
  $PYTEST tests/test_torch_fused.py -k "not tile_a_program"
part "bench/gpu.py" 240 40 \
  python3 bench/gpu.py --models gpt2 --steps 3
part "bench/gpu_profile.py" 90 12 \
  python3 bench/gpu_profile.py "$OUT/profile.txt" --configs codecs,plain,limit,8bit --limit 6999
cp docs/gpu/latest.md docs/gpu/latest.json "$OUT/" 2>/dev/null
echo "== end ($((SECONDS - START)) s)"
