#!/usr/bin/env bash
# Everything experiments/h200-engine measures, in one device call (about 6-8 minutes on an H200):
# the decode table (bench_decode.py, torch only) and the short tuning run (tune.py, which needs the
# tuner's dependencies: carried as wheels in .whl/, see README). Results land in $OUT.
#   device run: carry [".whl"], command: bash experiments/h200-engine/run_all.sh, timeout_s 540
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
nvidia-smi -L
timeout 200 python3 experiments/h200-engine/bench_decode.py --out "$OUT" 2>&1 | tail -12
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi
timeout 330 python3 experiments/h200-engine/tune.py --out "$OUT" 2>&1 | tail -30
ls -la "$OUT"
