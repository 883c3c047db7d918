#!/bin/bash
# Device session 3: runtime diagnostics on torch, then the attach-overhead benchmark per kind.
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/umctl_out} PYTHONUNBUFFERED=1 PIP_ROOT_USER_ACTION=ignore
[ -f .umctl_gpu/libbpf.so.1 ] && export UMCTL_LIBBPF=$PWD/.umctl_gpu/libbpf.so.1
mkdir -p "$OUT"
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
echo "== runtime diag"
ldd umctl/runtime/libumctl_rt.so | head
TL=$(python3 -c "import torch,os; print(os.path.join(os.path.dirname(torch.__file__),'lib'))")
ls $TL | grep -i cudart; ldd $TL/libtorch_cuda.so | grep -i "cudart\|libcuda"
for f in $(ldd $TL/libtorch_cuda.so | grep -o "/[^ ]*cudart[^ ]*"); do nm -D --defined-only $f | grep -i "LaunchKernel\|cudaMalloc$" | head; done
nm -D $TL/libtorch_cuda.so | grep -i " U cudaLaunch\| U cudaMalloc$" | head
LD_PRELOAD=$PWD/umctl/runtime/libumctl_rt.so UMCTL_RT_STATS=1 UMCTL_RT_MANAGED=1 python3 -c "import torch; a=torch.ones(1<<20,device='cuda'); b=a*2; torch.cuda.synchronize(); print('sum', b.sum().item())" 2>&1 | tail -8
timeout -k 5 150 python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/gpu/test_runtime_gpu.py 2>&1 | grep -i "{\|passed\|failed" | head -12
echo "== overhead"
timeout -k 5 420 python3 tests/gpu/bench_torch_overhead.py "$OUT" --steps 40 --reps 2 2>&1 | python3 -c "
import json,sys
for l in sys.stdin:
    try: r=json.loads(l)
    except Exception: print(l.rstrip()); continue
    print(f\"{r['config']:<34} {r['step_ms_median'] or 0:8.2f} ms  {r['overhead_pct'] if r['overhead_pct'] is not None else float('nan'):+6.1f} %  reps {[round(x,1) for x in r['rep_medians']]}  drops {r['dropped']} {r['errors']}\")"
