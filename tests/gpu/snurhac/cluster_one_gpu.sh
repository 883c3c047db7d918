#!/usr/bin/env bash
# SnuRHAC across nodes on one GPU (issue 26): two MPI ranks as two nodes sharing GPU 0, each running
# its half of every partitioned kernel of the programs here, pages moving between the ranks over MPI.
# Prints each program's plain (single-GPU, no umctl) line, then both ranks' lines (the CHECK hashes
# must be equal) and the agents' counters. Needs nvcc, mpirun (OpenMPI) and mpi4py for the python3
# on PATH; as root, OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1.
#   bash tests/gpu/snurhac/cluster_one_gpu.sh [OUTDIR]
set -u
cd "$(dirname "$0")/../../.."
OUT=${1:-/tmp/umctl-cluster}; mkdir -p "$OUT"
PY=$(command -v python3)
NV=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
B=$(mktemp -d)
gcc -O2 -shared -fPIC -Wall -o "$B/libumctl_rt.so" runtime/umctl_rt.c -ldl -lpthread || exit 4
for p in gemm gesummv stencil; do "$NV" -O3 -arch=sm_90 -cudart shared -o "$B/$p" "tests/gpu/snurhac/$p.cu" || exit 5; done
export UMCTL_RT_STATS=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
run_case() {
  name=$1; shift
  echo "== $name $*: plain"; timeout 120 "$B/$name" "$@" | tail -2
  echo "== $name $*: 2 nodes x 1 GPU (the same GPU)"
  timeout -k 5 150 mpirun --oversubscribe -n 2 "$PY" -m umctl.cluster.live --gpus 1 --um-space $((4 << 30)) \
     --timeout 60 --library "$B/libumctl_rt.so" --stats "$OUT/${name}_st" -- "$B/$name" "$@" 2>&1 \
     | tee "$OUT/${name}_cluster.txt" | grep -E "TIME_MS|KERNEL_MS|error|partitioned=" | cut -c1-200
  "$PY" - "$OUT/${name}_st" <<'PY'
import json, sys
for r in (0, 1):
    s = json.load(open(f"{sys.argv[1]}.{r}.json"))
    print(r, {k: s[k] for k in ("rc", "launches", "host_syncs", "pages_in", "bytes_in", "pages_out", "invalidated", "degraded")})
PY
}
run_case gemm 2048
run_case gesummv 4096
run_case stencil 2048 5
