#!/bin/bash
# Device session for live control (issue 6) and the issue-4 follow-ups: install, calibrate
# this GPU, live control bench under a soft budget, torch/sweep record + replay accuracy.
# Usage (device tool): bash tests/gpu/run_control.sh   (logs to $OUT)
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/umctl_out} PYTHONUNBUFFERED=1 PIP_ROOT_USER_ACTION=ignore
[ -f .umctl_gpu/libbpf.so.1 ] && export UMCTL_LIBBPF=$PWD/.umctl_gpu/libbpf.so.1
mkdir -p "$OUT"
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-' | sed 's/nvidia-//; s/-.*//')
echo "== calibrate ($GPU)"
timeout -k 5 150 python3 benchmarks/gpu/calibrate.py -o "$OUT/$GPU-r580.json" --reps 3 2>&1 | tail -25
echo "== live control bench"
timeout -k 5 280 python3 tests/gpu/bench_control.py --budget 1GiB 2>&1
echo "== torch record + replay"
timeout -k 5 100 umctl run -q -o "$OUT/torch.parquet" -- python3 tests/gpu/wl_torch.py --steps 20 | grep -v STEP
for c in default h200-r580 "$OUT/$GPU-r580.json"; do
  [ "$c" = default ] && opt="" || opt="--calibration $c"
  umctl replay "$OUT/torch.parquet" --mode none --json $opt | python3 -c "import json,sys; r=json.load(sys.stdin)[0]; print('PREDICTED torch none [$c]', round(r['time_s']*1e3,1), 'ms; faults', r['faults'])"
done
umctl trace info "$OUT/torch.parquet" | head -12
echo "== sweep record + replay"
timeout -k 5 90 umctl run -q -o "$OUT/sweep.parquet" -- python3 tests/gpu/wl_sweep.py --mib 1024 --passes 4 | grep -v PASS
for c in default h200-r580 "$OUT/$GPU-r580.json"; do
  [ "$c" = default ] && opt="" || opt="--calibration $c"
  umctl replay "$OUT/sweep.parquet" --mode none --json $opt | python3 -c "import json,sys; r=json.load(sys.stdin)[0]; print('PREDICTED sweep none [$c]', round(r['time_s']*1e3,1), 'ms; faults', r['faults'])"
done
rm -f "$OUT"/*.parquet
ls -la "$OUT"
