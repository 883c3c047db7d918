#!/bin/bash
# Device session: runtime on the real stack, live control bench, torch trace kept for analysis.
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/umctl_out} PYTHONUNBUFFERED=1 PIP_ROOT_USER_ACTION=ignore
[ -f .umctl_gpu/libbpf.so.1 ] && export UMCTL_LIBBPF=$PWD/.umctl_gpu/libbpf.so.1
mkdir -p "$OUT"
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
ls -la umctl/runtime/
echo "== runtime gpu test"
timeout -k 5 150 python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/gpu/test_runtime_gpu.py 2>&1 | tail -25
echo "== HUM live on torch copies"
cat > /tmp/hum_prog.py <<'PY'
import time, hashlib, torch
n = 64 << 20
h = [torch.full((n,), float(i)) for i in range(4)]    # 4 x 256 MiB pageable host buffers
torch.cuda.synchronize()
t = time.perf_counter()
for it in range(3):
    d = [x.to("cuda", non_blocking=False) for x in h]
    s = sum(float(x[::4096].sum()) for x in h) # host work between copies and use
    r = sum(x.sum() for x in d)
    torch.cuda.synchronize()
print("TIME_MS", round((time.perf_counter() - t) * 1e3, 1), "SUM", float(r), s)
PY
python3 /tmp/hum_prog.py
timeout -k 5 120 umctl run --mode hum -q -- python3 /tmp/hum_prog.py 2>&1 | grep -v "^  lag\|^  attach"
echo "== control bench"
timeout -k 5 300 python3 tests/gpu/bench_control.py --budget 1GiB --sync-each --modes none,deepum@4,deepum,deepum@4+rt 2>&1 | tail -22
echo "== torch record"
timeout -k 5 100 umctl run -q -o "$OUT/torch.parquet" -- python3 tests/gpu/wl_torch.py --steps 20 | grep -v STEP | head -4
ls -la "$OUT"
