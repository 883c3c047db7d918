#!/bin/bash
# Does the budget hold by admission on a real GPU, and what does it cost? For each program
# (default: transformer, embedding): a plain run (footprint), then `umctl run --runtime --managed
# --budget FOOTPRINT/2` under modes none and deepum, with --budget-hold admit and evict, printing
# each run's step times and umctl's budget lines. Logs to $OUT/admission_smoke.log.
#
#   PROGRAMS="transformer embedding" STEPS=8 bash benchmarks/gpu/admission_smoke.sh
cd "$(dirname "$0")/../.." || exit 1
export OUT=${OUT:-/tmp/umctl_out} PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
mkdir -p "$OUT"
L="$OUT/admission_smoke.log"
STEPS=${STEPS:-8}
for p in ${PROGRAMS:-transformer embedding}; do
  P=benchmarks/gpu/programs/$p.py
  echo "== $p plain" | tee -a "$L"
  timeout -k 5 60 python3 "$P" --steps "$STEPS" > /tmp/plain_$p.log 2>&1
  grep -E "^(STEP|FOOTPRINT|DONE)" /tmp/plain_$p.log | tr '\n' ' ' | tee -a "$L"; echo | tee -a "$L"
  FP=$(awk '/^FOOTPRINT/ {print $2}' /tmp/plain_$p.log)
  [ -n "$FP" ] || continue
  B=$(( FP / 2 / 1048576 ))MiB
  for m in ${MODES:-none deepum}; do
    for h in ${HOLDS:-admit evict}; do
      echo "== $p --mode $m --budget $B --budget-hold $h" | tee -a "$L"
      timeout -k 5 ${RUN_SECONDS:-75} umctl run --runtime --managed --mode "$m" --budget "$B" --budget-hold "$h" -q -- \
        python3 "$P" --steps "$STEPS" > /tmp/run.log 2>&1
      echo "rc=$?" | tee -a "$L"
      grep -E "^(STEP|DONE)" /tmp/run.log | tr '\n' ' ' | tee -a "$L"; echo | tee -a "$L"
      grep -E "budget|admission|faults|actuator|prefetch" /tmp/run.log | grep -v "^STEP" | tail -12 | tee -a "$L"
    done
  done
done
