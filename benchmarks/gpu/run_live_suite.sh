#!/bin/bash
# Issue 34's device suite in ONE device command (~9.5 min): install umctl, a brief `pytest -m gpu`,
# the runtime stress (§1), live control against the bound (§4-§5) and the attach overhead (§6).
# Every part runs under `timeout`; logs and JSON go to $OUT (7 files: suite.log, stress.log,
# stress.json, live.log, live.json, attach.log, attach.json).
#
#   bash benchmarks/gpu/run_live_suite.sh       # everything, ~9.5 min (live then gets only ~100 s)
#   PARTS=install,pytest,stress,attach bash benchmarks/gpu/run_live_suite.sh     # call 1 (~7.5 min)
#   PARTS=install,live LIVE_SECONDS=520 bash benchmarks/gpu/run_live_suite.sh    # call 2 (~9.5 min)
# A run costs ~8-13 s of start-up on the H100 (2026-11-28), so 520 s hold ~40 runs: all five programs
# x 4 conditions x 2 repetitions, or 3 repetitions of three programs (LIVE_ARGS="--programs
# transformer,convnet,decoder"); a third call can add the rest (LIVE_ARGS="--programs embedding,moe
# --replay") and `python3 benchmarks/gpu/live_control.py --merge A.json B.json` puts them together.
#
#   PARTS=install,smoke bash benchmarks/gpu/run_live_suite.sh   # each program once, tiny; embedding under deepum
#
# Environment: PARTS (comma list of install,smoke,pytest,stress,live,attach), TOTAL (seconds for the whole
# command, default 560), LIVE_SECONDS (default: what is left of TOTAL after the other parts' shares),
# LIVE_ARGS (extra live_control.py arguments, e.g. "--programs transformer,decoder --replay"),
# STRESS_RUNS (20), STRESS_PROGRAM_ARGS (default "--layers 2 --batch 4": a ~1 GiB transformer),
# STRESS_ARGS, ATTACH_ARGS, PYTEST_ARGS, PYTEST_SECONDS (90), STRESS_SECONDS (240), ATTACH_SECONDS (90).
# *_ARGS are shell words (quotes allowed): LIVE_ARGS="--program-args 'embedding=--rows 3000000'".
cd "$(dirname "$0")/../.." || exit 1
export OUT=${OUT:-/tmp/umctl_out} PYTHONUNBUFFERED=1 PIP_ROOT_USER_ACTION=ignore CUBLAS_WORKSPACE_CONFIG=:4096:8
mkdir -p "$OUT"
PARTS=",${PARTS:-install,pytest,stress,live,attach},"
TOTAL=${TOTAL:-560}
has() { [[ "$PARTS" == *",$1,"* ]]; }
left() { echo $(( TOTAL - SECONDS )); }
log() { echo "== [$SECONDS s] $*" | tee -a "$OUT/suite.log"; }
RC=0

log "parts ${PARTS}; total ${TOTAL} s"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader 2>&1 | tee -a "$OUT/suite.log"
if has install; then
  log install
  timeout -k 5 180 python3 -m pip install -q --no-build-isolation --no-deps -e . >> "$OUT/suite.log" 2>&1 \
    || { log "install FAILED"; tail -30 "$OUT/suite.log"; has smoke || exit 1; }
  python3 -c "import torch, umctl; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1 | tee -a "$OUT/suite.log"
fi

if has smoke; then
  # each program once with few steps (does it run, its lines, its footprint); then the embedding
  # program under the current umctl at half its footprint with migration events on (--kinds all),
  # to see how many bytes move per step, under deepum and under none
  for p in transformer convnet embedding decoder moe; do
    log "smoke $p"
    timeout -k 5 90 python3 benchmarks/gpu/programs/$p.py --steps 4 ${SMOKE_ARGS:-} > "/tmp/smoke_$p.log" 2>&1
    echo "rc=$?" >> "/tmp/smoke_$p.log"
    tail -14 "/tmp/smoke_$p.log" | tee -a "$OUT/smoke.log"
  done
  FP=$(awk '/^FOOTPRINT/ {print $2}' /tmp/smoke_embedding.log)
  if [ -n "$FP" ] && command -v umctl > /dev/null; then
    B=$(( FP / 2 / 1048576 ))MiB
    for m in ${SMOKE_MODES:-deepum none}; do
      log "smoke embedding under umctl --mode $m --budget $B --kinds all"
      timeout -k 5 ${SMOKE_UMCTL_SECONDS:-100} umctl run --runtime --managed --mode $m --budget "$B" --kinds all -q -- \
        python3 benchmarks/gpu/programs/embedding.py --steps 4 2>&1 | tail -40 | tee -a "$OUT/smoke.log"
      echo "rc=${PIPESTATUS[0]}" | tee -a "$OUT/smoke.log"
    done
  fi
fi

# shares of the remaining parts (seconds), so that live gets what is left
S_PYTEST=${PYTEST_SECONDS:-90}; S_STRESS=${STRESS_SECONDS:-240}; S_ATTACH=${ATTACH_SECONDS:-90}
eval "LA=(${LIVE_ARGS:-})"; eval "SA=(${STRESS_ARGS:-})"; eval "AA=(${ATTACH_ARGS:-})"
reserve=0
has stress && reserve=$((reserve + S_STRESS))
has attach && reserve=$((reserve + S_ATTACH))
has pytest && reserve=$((reserve + S_PYTEST))

if has pytest; then
  log "pytest -m gpu tests/gpu (${S_PYTEST} s at most)"
  timeout -k 5 "$S_PYTEST" python3 -m pytest -m gpu -p no:cacheprovider -q -x ${PYTEST_ARGS:-tests/gpu} 2>&1 \
    | tail -40 | tee -a "$OUT/suite.log"
  reserve=$((reserve - S_PYTEST))
fi

if has stress; then
  log "stress: ${STRESS_RUNS:-20} runs of the transformer under deepum"
  set -o pipefail
  timeout -k 5 "$S_STRESS" python3 benchmarks/gpu/stress_runtime.py --runs "${STRESS_RUNS:-20}" \
    --max-seconds $((S_STRESS - 10)) --json "$OUT/stress.json" --steps 3 \
    --program-args "${STRESS_PROGRAM_ARGS---layers 2 --batch 4}" "${SA[@]}" 2>&1 | tee "$OUT/stress.log" || RC=1
  set +o pipefail
  grep '^STRESS' "$OUT/stress.log" >> "$OUT/suite.log"
  reserve=$((reserve - S_STRESS))
fi

if has live; then
  L=${LIVE_SECONDS:-$(( $(left) - reserve - 15 ))}
  log "live_control (${L} s)"
  if [ "$L" -gt 60 ]; then
    timeout -k 5 $((L + 10)) python3 benchmarks/gpu/live_control.py --max-seconds "$L" --json "$OUT/live.json" \
      "${LA[@]}" 2>&1 | tee "$OUT/live.log"
    sed -n '/^Goals:/,$p' "$OUT/live.log" >> "$OUT/suite.log"
  else
    log "live_control skipped: only ${L} s left"
  fi
fi

if has attach; then
  A=$(( $(left) < S_ATTACH ? $(left) : S_ATTACH ))
  log "attach overhead: default sampling vs --sample 1 (${A} s)"
  if [ "$A" -gt 40 ]; then
    timeout -k 5 "$A" python3 benchmarks/gpu/attach_overhead.py --preset sampling --window 2 --rounds 5 \
      --warmup 5 --json "$OUT/attach.json" "${AA[@]}" 2>&1 | tee "$OUT/attach.log" | tail -8
    tail -6 "$OUT/attach.log" >> "$OUT/suite.log"
  else
    log "attach overhead skipped: only ${A} s left"
  fi
fi
log "done"
exit $RC
