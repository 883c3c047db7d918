"""Check, on a machine with the NVIDIA driver loaded, that every CO-RE relocation of the
fault-path BPF programs (bpf/uvmfault.bpf.c) resolves against the live nvidia_uvm BTF.

Why a separate check: the machine may refuse kprobes, so the programs cannot be attached there,
but libbpf applies the relocations and the kernel verifies the programs at load, before any
attach. The module's BTF is split over the kernel's; libbpf's btf_custom_path takes one
standalone BTF, so the two are merged first (tools/btf_min.py). The control load against the
kernel's BTF alone must fail, or the check proves nothing.

    python3 tools/core_check.py        (root; prints one line per load)
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from btf_min import merge  # noqa: E402


def load(path: str) -> str:
    from umctl.sources import kprobes as kp

    src = kp.KprobeSource(flavour="kprobe", btf_custom_path=path, check=False)
    try:
        src.load()
    except Exception as e:  # noqa: BLE001 - the message is the result
        return "refused: " + str(e).splitlines()[0]
    src.close()
    return "loaded (every relocation resolved, verifier accepted)"


def main() -> int:
    base, mod = "/sys/kernel/btf/vmlinux", "/sys/kernel/btf/nvidia_uvm"
    for p in (base, mod):
        if not os.path.exists(p):
            print(f"core_check: {p} missing (no kernel BTF, or nvidia_uvm not loaded)", file=sys.stderr)
            return 1
    with tempfile.NamedTemporaryFile(suffix=".btf") as tmp:
        tmp.write(merge(open(base, "rb").read(), open(mod, "rb").read()))
        tmp.flush()
        real = load(tmp.name)
    control = load(base)
    print(f"CORE live nvidia_uvm BTF: {real}")
    print(f"CORE control (kernel BTF only): {control}")
    return 0 if real.startswith("loaded") and control.startswith("refused") else 1


if __name__ == "__main__":
    sys.exit(main())
