#!/bin/bash
# Killing umctl at any moment leaves the target running and correct.
cd "$(dirname "$0")/../.."
for sig in INT KILL; do
  for delay in 0.5 2.5; do
    python3 benchmarks/gpu/workloads/wl_layers.py --iters 6 --sync-each > /tmp/wl_kill.log 2>&1 &
    WL=$!
    while ! grep -q READY /tmp/wl_kill.log; do sleep 0.05; done
    umctl attach --pid $WL --mode none --budget 1GiB --no-launches > /tmp/umctl_kill.log 2>&1 &
    UM=$!
    sleep $delay; kill -$sig $UM; wait $UM; urc=$?
    wait $WL; wrc=$?
    echo "attach killed with SIG$sig after ${delay}s: umctl rc=$urc, target rc=$wrc, $(grep -o 'DONE.*' /tmp/wl_kill.log)"
  done
done
# umctl run killed: the child runs on and finishes correctly
umctl run -q --mode deepum --budget 1GiB --runtime -- python3 benchmarks/gpu/workloads/wl_layers.py --iters 6 > /tmp/run_kill.log 2>&1 &
UM=$!
sleep 6; kill -KILL $UM; wait $UM
for i in $(seq 60); do grep -q DONE /tmp/run_kill.log && break; sleep 0.5; done
echo "run killed with SIGKILL after 6s: $(grep -o 'DONE.*' /tmp/run_kill.log || echo 'no DONE')"
# umctl run killed in a DeepUM-controlled torch training loop (managed memory, budget, runtime):
# the loop finishes with the checksum of a plain run of the same 12 steps. With the runtime's
# allocator (--allocator umctl) umctl's invalidations are under way through the runtime's
# control channel when it dies.
REF=$(python3 benchmarks/gpu/workloads/wl_torch_train.py --steps 12 | grep -o 'DONE.*' | cut -d' ' -f3)
for alloc in torch umctl; do
  umctl run -q --mode deepum --budget 512MiB --runtime --managed -- python3 benchmarks/gpu/workloads/wl_torch_train.py --steps 12 \
    --allocator $alloc > /tmp/torch_kill.log 2>&1 &
  UM=$!
  for i in $(seq 120); do grep -q "^STEP 4 " /tmp/torch_kill.log && break; sleep 0.25; done
  kill -KILL $UM; wait $UM
  for i in $(seq 120); do grep -q DONE /tmp/torch_kill.log && break; sleep 0.5; done
  echo "run (torch, deepum, allocator $alloc) killed with SIGKILL at step 4: $(grep -o 'DONE.*' /tmp/torch_kill.log || echo 'no DONE') (plain 12 steps: $REF)"
done
