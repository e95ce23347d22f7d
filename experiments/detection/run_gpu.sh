#!/usr/bin/env bash
# The one device call of the detection experiment's GPU stream (record_gpu.py, ~6 min on an H200):
#   device run: carry [".whl"], command: bash experiments/detection/run_gpu.sh, timeout_s 480
# The GPU host has torch, aiohttp, numpy, typer, rich, pyyaml, prometheus_client and nvidia-ml-py but not pydantic:
# carry it as wheels in .whl/ (Python 3.12, x86-64; made as experiments/h200-engine/README.md says).
# SMOKE=1 runs record_gpu.py --smoke (tiny preset on the CPU) anywhere; RATE=10 SEED=600: another base rate and load.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
nvidia-smi -L || true
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD
timeout 420 python3 experiments/detection/record_gpu.py ${SMOKE:+--smoke} ${RATE:+--rate "$RATE"} --seed "${SEED:-500}" \
  --out "$OUT/recorded-h200${RATE:+-rate$RATE}.jsonl.gz"
echo "record_gpu: exit $? after ${SECONDS}s"
for f in "$OUT"/bench-*.log; do echo "== $f"; tail -4 "$f"; done
tail -5 "$OUT/engine.log"
ls -la "$OUT"
