#!/bin/bash
# One device-machine session: install, GPU tests, benchmark + ring capture, CLI outputs.
# Usage (device tool): bash benchmarks/gpu/run_device.sh   (writes logs to $OUT)
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/umctl_out} PYTHONUNBUFFERED=1 PIP_ROOT_USER_ACTION=ignore
mkdir -p "$OUT"
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
python3 -c "import pyarrow, typer, rich, numpy; print(\"deps ok\", numpy.__version__)" || exit 1
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader | tee "$OUT/cli.log"
echo "== bench" ; timeout -k 5 200 python3 benchmarks/gpu/bench_live.py "$OUT" --capture "$OUT/uvm_ring_580.bin" 2>&1 | tee "$OUT/bench.log"
{
echo "== top --once (sweep running)"
python3 benchmarks/gpu/workloads/wl_sweep.py --mib 512 --seconds 12 > /tmp/sweep_bg.log 2>&1 &
BG=$!
sleep 3
timeout -k 5 30 umctl top --once --interval 2
echo "rc=$?"
echo "== attach --duration 3"
timeout -k 5 30 umctl attach --pid $BG --duration 3 --kinds all -o "$OUT/attach.parquet"
echo "rc=$?"
wait $BG
echo "== attach to a process without CUDA"; umctl attach --pid $$; echo "rc=$?"
echo "== run sweep"
timeout -k 5 90 umctl run -o "$OUT/sweep.parquet" -- python3 benchmarks/gpu/workloads/wl_sweep.py --mib 1024 --passes 4 | tee /tmp/sweep_run.log
echo "rc=$?"
grep DONE /tmp/sweep_run.log
timeout -k 5 120 umctl replay "$OUT/sweep.parquet" --mode none,oracle
umctl replay "$OUT/sweep.parquet" --mode none --json | python3 -c "import json,sys; r=json.load(sys.stdin)[0]; print('PREDICTED sweep none', r['time_s'], 's; faults', r['faults'], 'batches', r['fault_batches'])"
echo "== run torch"
timeout -k 5 120 umctl run -o "$OUT/torch.parquet" -- python3 benchmarks/gpu/workloads/wl_torch.py --steps 20 | tee /tmp/torch_run.log | grep -v STEP
echo "rc=$?"
grep DONE /tmp/torch_run.log
timeout -k 5 120 umctl replay "$OUT/torch.parquet" --mode none,oracle
umctl replay "$OUT/torch.parquet" --mode none --json | python3 -c "import json,sys; r=json.load(sys.stdin)[0]; print('PREDICTED torch none', r['time_s'], 's; faults', r['faults'], 'batches', r['fault_batches'])"
umctl trace info "$OUT/torch.parquet" | head -8
} 2>&1 | tee -a "$OUT/cli.log"
echo "== gpu tests"
timeout -k 5 240 python3 -m pytest -m gpu -p no:cacheprovider -q tests/gpu 2>&1 | tee "$OUT/pytest_gpu.log" | tail -30
rm -f "$OUT/sweep.parquet" "$OUT/attach.parquet" "$OUT/torch.parquet"
ls -la "$OUT"
