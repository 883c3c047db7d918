#!/bin/bash
# Device session 5: runtime on torch (launch names), HUM with DMA chunks, PyTorch training loop
# under a budget (none vs deepum, runtime launches at kernel start), kill test.
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/umctl_out} PYTHONUNBUFFERED=1 PIP_ROOT_USER_ACTION=ignore
[ -f .umctl_gpu/libbpf.so.1 ] && export UMCTL_LIBBPF=$PWD/.umctl_gpu/libbpf.so.1
mkdir -p "$OUT"
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== runtime gpu test"
timeout -k 5 150 python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/gpu/test_runtime_gpu.py 2>&1 | grep -i "{\|passed\|failed\|Error" | head -12
echo "== HUM on torch copies"
cat > /tmp/hum_prog.py <<'PY'
import time, torch
n = 64 << 20
h = [torch.full((n,), float(i)) for i in range(4)]
torch.cuda.synchronize()
t = time.perf_counter()
for it in range(3):
    d = [x.to("cuda") for x in h]
    s = sum(float(x[::4096].sum()) for x in h)
    r = sum(x.sum() for x in d)
    torch.cuda.synchronize()
print("TIME_MS", round((time.perf_counter() - t) * 1e3, 1), "SUM", float(r), s)
PY
for i in 1 2; do python3 /tmp/hum_prog.py; UMCTL_RT_STATS=1 timeout -k 5 120 umctl run --mode hum -q -- python3 /tmp/hum_prog.py 2>&1 | grep "TIME_MS\|umctl_rt\|error"; done
echo "== torch training under a budget"
timeout -k 5 330 python3 tests/gpu/bench_torch_control.py --budget 512MiB 2>&1 | tail -40
echo "== kill test"
timeout -k 5 120 bash tests/gpu/kill_test.sh 2>&1 | tail -8
