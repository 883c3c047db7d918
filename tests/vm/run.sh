#!/usr/bin/env bash
# The VM test bed (host side): builds the simulated driver and the umctl module for the stock
# Debian kernel installed in /boot, gives them BTF, builds the BPF objects, boots that kernel under
# QEMU with the host filesystem shared (virtme-ng), and runs tests/vm/guest.py inside.
#
# Needs (tests/vm/README.md; .ci/run installs them): linux-image-amd64 linux-headers-amd64
# qemu-system-x86 busybox-static dwarves clang libbpf-dev gcc make, and pip virtme-ng pyroute2.
# KVM is NOT used: our hosts' /dev/kvm does not run a stock kernel (always --disable-kvm, TCG),
# and the whole VM runs under `timeout`.
#
# Env: UMCTL_VM_KERNEL (default: newest /boot/vmlinuz-*-amd64 with headers), UMCTL_VM_BUILD
# (default /tmp/umctl-vm), UMCTL_VM_TIMEOUT (s, default 900), UMCTL_FUZZ_N (default 100000).
# Exit status: the guest's (0: every check passed). The last line of output is `VMRESULT {json}`.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${UMCTL_VM_BUILD:-/tmp/umctl-vm}
T0=$(date +%s)
stamp() { echo "[vm +$(( $(date +%s) - T0 ))s] $*" >&2; }
KIMG=${UMCTL_VM_KERNEL:-}
if [ -z "$KIMG" ]; then
  for k in $(ls /boot/vmlinuz-* 2>/dev/null | sort -V -r); do
    [ -d "/lib/modules/${k#/boot/vmlinuz-}/build" ] && { KIMG=$k; break; }
  done
fi
[ -n "$KIMG" ] || { echo "no /boot/vmlinuz-* with matching headers: install linux-image-amd64 linux-headers-amd64 (Ubuntu: linux-image-generic linux-headers-generic)" >&2; exit 2; }
KVER=${KIMG#/boot/vmlinuz-}
for t in vng qemu-system-x86_64 pahole clang make; do
  command -v $t >/dev/null || { echo "$t not found (see tests/vm/README.md)" >&2; exit 2; }
done
stamp "kernel $KVER, build dir $BUILD"
rm -rf "$BUILD"; mkdir -p "$BUILD/src"
cp -r "$REPO/kmod/uvm_sim" "$REPO/kmod/umctl" "$BUILD/src/"
python3 "$REPO/tests/vm/extract_vmlinux.py" "$KIMG" "$BUILD/vmlinux" \
  || "/lib/modules/$KVER/build/scripts/extract-vmlinux" "$KIMG" > "$BUILD/vmlinux"   # zstd/lz4 images
for m in uvm_sim umctl; do
  make -s -C "/lib/modules/$KVER/build" M="$BUILD/src/$m" modules 2>&1 | grep -v 'Skipping BTF' || true
  cp "$BUILD/src/$m/$m.ko" "$BUILD/"
  # module BTF, as Kbuild's modfinal would do with a vmlinux at hand
  LLVM_OBJCOPY=objcopy pahole -J --btf_gen_floats -j --lang_exclude=rust --btf_base "$BUILD/vmlinux" "$BUILD/$m.ko" 2>/dev/null \
    || LLVM_OBJCOPY=objcopy pahole -J --btf_base "$BUILD/vmlinux" "$BUILD/$m.ko"
  # and the .BTF_ids (umctl's kfunc set), as Kbuild's modfinal would with resolve_btfids
  python3 "$REPO/kmod/tools/resolve_btfids.py" --base "$BUILD/vmlinux" "$BUILD/$m.ko"
done
stamp "modules built"
make -s -C "$REPO/bpf" OUT="$REPO/umctl/bpf" >/dev/null
stamp "BPF objects built; booting (TCG)"
PY=$(python3 -c 'import sys; print(sys.executable)')
set +e
# stdout through a pipe: qemu reopens its stdout, which would truncate a redirected file
timeout "${UMCTL_VM_TIMEOUT:-900}" vng --run "$KIMG" --disable-kvm --force-9p --cpus 2 --memory 2G \
  --exec "UMCTL_FUZZ_N=${UMCTL_FUZZ_N:-100000} UMCTL_VM_CLI=${UMCTL_VM_CLI:-1} $PY $REPO/tests/vm/guest.py $BUILD" \
  2>"$BUILD/vng.err" | cat
rc=${PIPESTATUS[0]}
set -e
stamp "vm exit $rc"
if [ "$rc" -ne 0 ]; then grep -v '^\[ ' "$BUILD/vng.err" | tail -20 >&2; fi
exit "$rc"
