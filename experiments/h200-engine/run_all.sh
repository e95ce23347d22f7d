#!/usr/bin/env bash
# Everything experiments/h200-engine measures, in one device call of at most ~530 s on an H200:
# the decode table with its diagnoses (bench_decode.py, torch only; ~1-2 min) and the short tuning run
# (tune.py, which needs the tuner's dependencies: carried as wheels in .whl/, see README) in the time left.
# tune.py rewrites tune.md after every trial, so the time limit never loses a finished trial.
#   device run: carry [".whl"], command: bash experiments/h200-engine/run_all.sh, timeout_s 560
set -u
export PYTHONUNBUFFERED=1
TOTAL_S=${TOTAL_S:-530}
SMOKE=${SMOKE:+--smoke}   # SMOKE=1: both scripts' CPU smoke modes (checks this script anywhere)
OUT=${OUT:-out}; mkdir -p "$OUT"
nvidia-smi -L || true
timeout 200 python3 experiments/h200-engine/bench_decode.py $SMOKE --out "$OUT" > "$OUT/bench.log" 2>&1
echo "bench_decode: exit $? after ${SECONDS}s"; tail -45 "$OUT/decode.md" 2>/dev/null || tail -20 "$OUT/bench.log"
if [ -z "$SMOKE" ]; then  # the engine's GPU checks (graphs, async output, bf16/INT8, the server), not compile
  TUNER_GPU_TESTS_SKIP=compile timeout 100 python3 tests/integration/engine/test_engine_gpu.py > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests: exit $? after ${SECONDS}s"; grep -E "^(PASS|FAIL|SKIP)" "$OUT/gpu-tests.log"
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi
left=$((TOTAL_S - SECONDS))
echo "tune.py: ${left}s left"
timeout "$left" python3 experiments/h200-engine/tune.py $SMOKE --out "$OUT" > "$OUT/tune.log" 2>&1
echo "tune: exit $? after ${SECONDS}s"; head -16 "$OUT/tune.md" 2>/dev/null || tail -30 "$OUT/tune.log"
ls -la "$OUT"
