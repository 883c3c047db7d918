#!/bin/bash
# Device sessions of the live-control and live-observation measurements, one section per measurement.
#   bash benchmarks/gpu/run_control.sh [SECTION ...]     (default: every section; logs to $OUT)
# Sections: calibrate runtime hum humnvcc humab whyfaults gputests torch layers harvest tenants kill overhead2 overhead3 sampling replay fidelity core
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/umctl_out} PYTHONUNBUFFERED=1 PIP_ROOT_USER_ACTION=ignore
[ -f .umctl_gpu/libbpf.so.1 ] && export UMCTL_LIBBPF=$PWD/.umctl_gpu/libbpf.so.1
mkdir -p "$OUT"
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv,noheader
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-' | sed 's/nvidia-//; s/-.*//')
NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
SECTIONS=${*:-calibrate runtime hum humnvcc torch layers harvest kill overhead2 replay}

for s in $SECTIONS; do
  echo "== $s"
  case $s in
  calibrate) timeout -k 5 150 python3 benchmarks/gpu/calibrate.py -o "$OUT/$GPU-r580.json" --reps 3 2>&1 | tail -12 ;;
  runtime) timeout -k 5 150 python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/gpu/test_runtime_gpu.py 2>&1 | tail -8 ;;
  hum)
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
    python3 /tmp/hum_prog.py
    UMCTL_RT_STATS=1 timeout -k 5 120 umctl run --mode hum -q -- python3 /tmp/hum_prog.py 2>&1 | grep "TIME_MS\|umctl_rt\|error" ;;
  humnvcc) timeout -k 5 500 python3 benchmarks/gpu/hum_programs.py --reps 3 --ablation 2>&1 | tail -20 ;;
  torch) timeout -k 5 330 python3 benchmarks/gpu/bench_torch_control.py --budget 512MiB --modes none,deepum,deepum-prefetch 2>&1 | tail -12 ;;
  layers) timeout -k 5 300 python3 benchmarks/gpu/bench_control.py --budget 1GiB --sync-each --modes none,deepum 2>&1 | tail -12 ;;
  harvest) [ "$NGPU" -ge 2 ] && timeout -k 5 300 python3 benchmarks/gpu/bench_control.py --budget 1GiB --sync-each --modes none,harvest --spare-gpus 1 2>&1 | tail -12 || echo "needs 2 GPUs" ;;
  tenants) [ "$NGPU" -ge 2 ] && timeout -k 5 420 python3 benchmarks/gpu/harvest_tenants.py --json "$OUT/tenants.json" 2>&1 | tail -40 || echo "needs 2 GPUs" ;;
  kill) timeout -k 5 120 bash benchmarks/gpu/kill_test.sh 2>&1 | grep -v "^benchmarks/gpu" ;;
  overhead2)   # attach cost factor by factor, inside one running loop (with and without host writes)
    timeout -k 5 ${OVH_S:-200} python3 benchmarks/gpu/attach_overhead.py --window ${OVH_WIN:-2.5} --rounds ${OVH_ROUNDS:-3} --json "$OUT/ovh_touch.json" 2>&1 | grep -v "^round"
    timeout -k 5 ${OVH_S:-200} python3 benchmarks/gpu/attach_overhead.py --no-touch --window ${OVH_WIN:-2.5} --rounds ${OVH_ROUNDS2:-5} \
      --configs "tracker, nothing on;default kinds;all kinds" --json "$OUT/ovh_notouch.json" 2>&1 | grep -v "^round" ;;
  overhead3)   # the default view (10 % sample, launch probes) against every event, many windows
    timeout -k 5 ${OVH_S:-200} python3 benchmarks/gpu/attach_overhead.py --window ${OVH_WIN:-2.5} --rounds ${OVH_ROUNDS:-8} \
      --configs "default, sampled 10%;umctl attach default;default kinds" --json "$OUT/ovh_default.json" 2>&1 | grep -v "^round" ;;
  whyfaults)   # the torch loop under a 512 MiB budget, recorded, and each fault classified (umctl trace control)
    IFS=';' read -ra MODES <<< "${WHY_MODES:-none;deepum --degree 8;deepum}"   # modes with their options, ';'-separated
    i=0   # WHY_KEEP=1 keeps each run's trace as $OUT/why$i.parquet (for tools/deepum_offline.py, umctl replay)
    for m in "${MODES[@]}"; do
      echo "-- $m"; i=$((i+1)); tr="$OUT/why$i.parquet"
      timeout -k 5 150 umctl run -q --runtime --managed --mode $m --budget ${WHY_BUDGET:-512MiB} -o "$tr" -- \
        python3 benchmarks/gpu/workloads/wl_torch_train.py --steps ${WHY_STEPS:-12} > "$OUT/why$i.log" 2>&1
      grep -v "^STEP" "$OUT/why$i.log" | grep -i "faults\|budget\|DONE\|control\|error" | head -8
      grep "^STEP" "$OUT/why$i.log" | awk 'NR>2{print $3}' | sort -n | awk '{a[NR]=$1} END{if(NR) print "median step (from step 2)", a[int((NR+1)/2)], "ms over", NR}'
      timeout -k 5 60 umctl trace control "$tr" --skip ${WHY_SKIP:-3}
      [ -n "$WHY_KEEP" ] && ls -la "$tr" || rm -f "$tr"
    done ;;
  gputests) timeout -k 5 300 python3 -m pytest -m gpu -p no:cacheprovider -q tests/gpu 2>&1 | tail -15 ;;
  humab)   # HUM's protection split (this tree) against a previous build (HUM_OLD=path.so), with the runtime's counters
    cat /sys/kernel/mm/transparent_hugepage/enabled
    timeout -k 5 ${HUM_S:-240} python3 benchmarks/gpu/hum_programs.py --reps ${HUM_REPS:-3} --stats \
      ${HUM_OLD:+--config "previous build=LIBRARY=$HUM_OLD"} \
      ${HUM_VARIANTS:+--config "per-chunk unprotect=UMCTL_RT_HUM_UNPROT_STEP=2097152" --config "protect all at call=UMCTL_RT_HUM_PROTECT_GROUP=1099511627776"} \
      2>&1 | grep -v "^STATS.*previous build" | tail -90 ;;
  sampling)   # the live view, sampled (--sample 10%) and every event, on the same running loop
    python3 benchmarks/gpu/workloads/wl_torch.py --steps 400 > "$OUT/wl_sampling.log" 2>&1 & P=$!
    for i in $(seq 60); do grep -q "^STEP 3 " "$OUT/wl_sampling.log" && break; sleep 0.5; done   # in the loop, not in torch's start-up
    timeout -k 5 30 umctl attach --pid $P --duration 4 2>&1 | tail -14            # the default: a 10 % sample
    timeout -k 5 30 umctl attach --pid $P --duration 4 --sample 1 2>&1 | tail -14
    timeout -k 5 30 umctl top --once --pid $P --interval 2 2>&1 | tail -8
    kill $P 2>/dev/null; wait $P 2>/dev/null ;;
  replay)
    timeout -k 5 90 umctl run -q -o "$OUT/sweep.parquet" -- python3 benchmarks/gpu/workloads/wl_sweep.py --mib 1024 --passes 4 | grep DONE | sed 's/^/MEASURED sweep /'
    # --runtime: the loop's pluggable allocator frees and reallocates managed memory every step,
    # which only the runtime sees (the trace needs those ALLOC events to replay the refaults)
    timeout -k 5 100 umctl run -q --runtime -o "$OUT/torch.parquet" -- python3 benchmarks/gpu/workloads/wl_torch.py --steps 20 | grep DONE | sed 's/^/MEASURED torch /'
    timeout -k 5 150 umctl run -q --runtime --managed -o "$OUT/train.parquet" -- python3 benchmarks/gpu/workloads/wl_torch_train.py --steps 12 | grep DONE | sed 's/^/MEASURED train /'
    CALS="default"; [ -f "$OUT/$GPU-r580.json" ] && CALS="default $OUT/$GPU-r580.json"
    for t in sweep torch train; do for c in $CALS; do
      [ "$c" = default ] && CA="" || CA="--calibration $c"
      umctl replay "$OUT/$t.parquet" --mode none --json $CA | python3 -c "import json,sys; r=json.load(sys.stdin)[0]; print('PREDICTED $t none ($(basename $c))', round(r['time_s']*1e3,1), 'ms; faults', r['faults'], 'batches', r['fault_batches'], 'stall', round(r['stall_ns']/1e6,1), 'ms')"
    done; done ;;
  snurhac)   # gemm/gesummv/stencil over 1/2/4 GPUs under the runtime's grid partitioning vs the simulator
    timeout -k 5 400 python3 benchmarks/gpu/snurhac_real.py --budget 280 --json "$OUT/snurhac_real.json" 2>&1 | tail -45 ;;
  fidelity)   # four real workloads recorded, replayed with none, compared; the access-pattern probes
    timeout -k 5 ${FID_S:-420} python3 benchmarks/gpu/fidelity_real.py record --out "$OUT/real" ${FID_ONLY:+--only $FID_ONLY} 2>&1
    [ -n "$FID_PROBE" ] && timeout -k 5 150 python3 benchmarks/gpu/fidelity_real.py probe --out "$OUT/real" 2>&1 ;;
  core)   # CO-RE relocations of the fault-path programs against this machine's live nvidia_uvm BTF
    timeout -k 5 60 python3 tools/core_check.py ;;
  *) echo "unknown section $s" ;;
  esac
done
