#!/usr/bin/env bash
# The one device call of the detection experiment's GPU stream (record_gpu.py):
#   device run: carry [".whl"], command: RATE=16 SEED=700 bash experiments/detection/run_gpu.sh, timeout_s 570
# The GPU host has torch, aiohttp, numpy, typer, rich, pyyaml, prometheus_client and nvidia-ml-py but not pydantic:
# carry it as wheels in .whl/ (Python 3.12, x86-64; made as experiments/h200-engine/README.md says).
# PLAN=slowdown (default, ~8 min), PLAN=slowdown-short (~5 min) or PLAN=neighbours (the fifteenth step's, ~6 min: recorded-h200.jsonl.gz with
# RATE unset, recorded-h200-rate10.jsonl.gz with RATE=10 SEED=600); SMOKE=1 runs record_gpu.py --smoke anywhere.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
PLAN=${PLAN:-slowdown}
if [ "$PLAN" = neighbours ]; then NAME=recorded-h200${RATE:+-rate$RATE}; else NAME=recorded-h200-$PLAN${RATE:+-rate$RATE}; fi
nvidia-smi -L || true
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD
python3 - <<'PY' || true
import time, pynvml as N  # what NVML's sample buffers hold on this GPU (record_gpu's window means read them)
N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(0)
for name in ("NVML_GPU_UTILIZATION_SAMPLES", "NVML_TOTAL_POWER_SAMPLES", "NVML_PROCESSOR_CLK_SAMPLES"):
    try:
        vt, ss = N.nvmlDeviceGetSamples(h, getattr(N, name), 0)
        ts = [s.timeStamp for s in ss]
        print(f"{name}: {len(ss)} samples over {(max(ts) - min(ts)) / 1e6:.2f} s, value type {vt}, newest "
              f"{(time.time() * 1e6 - max(ts)) / 1e6:.2f} s ago")
    except N.NVMLError as e:
        print(f"{name}: {e}")
PY
timeout 540 python3 experiments/detection/record_gpu.py ${SMOKE:+--smoke} ${RATE:+--rate "$RATE"} --seed "${SEED:-500}" \
  --plan "$PLAN" --out "$OUT/$NAME.jsonl.gz"
echo "record_gpu: exit $? after ${SECONDS}s"
for f in "$OUT"/bench-*.log; do echo "== $f"; tail -4 "$f"; done
for f in "$OUT"/engine*.log; do tail -n 5 "$f"; done
ls -la "$OUT"
