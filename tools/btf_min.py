"""Reduce a kernel module's BTF to what umctl's fault-path BPF programs read, for the CO-RE test.

Why: the real nvidia_uvm BTF (a split BTF over the kernel's, 6.5 MB together) is what the CO-RE
relocations of bpf/uvmfault.bpf.c must resolve against, but it is too big to keep in the repo.
``bpftool gen min_core_btf`` keeps exactly the types and members our object's relocations touch,
at their real offsets, so tests/test_kprobes.py can load the object against it with libbpf
(``btf_custom_path``): any access the real driver lacks fails that load. When a program starts
reading a new field, the test fails until this is re-run with the full BTF (dumped on a GPU
machine: ``cat /sys/kernel/btf/nvidia_uvm > nvidia_uvm.btf; cat /sys/kernel/btf/vmlinux > vmlinux.btf``).

Usage: python3 tools/btf_min.py vmlinux.btf nvidia_uvm.btf umctl/bpf/uvmfault.bpf.o OUT.btf

bpftool takes one standalone BTF, so the split module BTF is first merged with its base: split
BTF numbers its types after the base's and its string offsets after the base's string section,
so concatenating the two type sections and the two string sections needs no renumbering.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import tempfile

HDR = struct.Struct("<HBBIIIII")   # magic, version, flags, hdr_len, type_off, type_len, str_off, str_len


def sections(blob: bytes) -> tuple[bytes, bytes]:
    magic, _ver, _flags, hdr_len, type_off, type_len, str_off, str_len = HDR.unpack_from(blob)
    if magic != 0xEB9F:
        raise SystemExit("not a raw BTF file (wrong magic)")
    base = hdr_len
    return blob[base + type_off: base + type_off + type_len], blob[base + str_off: base + str_off + str_len]


def merge(base: bytes, split: bytes) -> bytes:
    bt, bs = sections(base)
    st, ss = sections(split)
    types, strs = bt + st, bs + ss
    return HDR.pack(0xEB9F, 1, 0, HDR.size, 0, len(types), len(types), len(strs)) + types + strs


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    base, split, obj, out = argv
    with tempfile.NamedTemporaryFile(suffix=".btf") as tmp:
        tmp.write(merge(open(base, "rb").read(), open(split, "rb").read()))
        tmp.flush()
        subprocess.run(["bpftool", "gen", "min_core_btf", tmp.name, out, obj], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
