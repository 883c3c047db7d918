#!/usr/bin/env python3
"""Fill a kernel module's ``.BTF_ids`` section with BTF type ids, as the kernel's own
``resolve_btfids`` does at the end of a module build (Makefile.modfinal) — which distribution
header packages (Debian's linux-headers) do not ship, so out-of-tree modules built against them
keep zeros there and every kfunc set they register is empty.

Why our own tool rather than building the kernel's: resolve_btfids needs the kernel's tools/ tree
and libbpf sources (linux-source, ~140 MB, minutes to unpack and build on CI's 2 cores); this is
one dependency-free file that does the part modules need, checked by tests/test_resolve_btfids.py.

What it does, after ``pahole -J --btf_base VMLINUX MODULE.ko`` has put the module's split BTF in
its ``.BTF`` section (the format of include/linux/btf_ids.h, kernel 5.19+):
  * every symbol ``__BTF_ID__{func,struct,union,typedef}__NAME__N`` in ``.BTF_ids`` gets the id
    of the BTF type of that kind and name — looked up in the base (vmlinux) BTF, then the
    module's split BTF, whose ids continue after the base's type count (void included); the
    first match wins, as in resolve_btfids;
  * every ``__BTF_ID__set__NAME`` (``struct btf_id_set``: u32 cnt, u32 ids[]) and
    ``__BTF_ID__set8__NAME`` (``struct btf_id_set8``: u32 cnt, u32 flags, {u32 id, u32 flags}[])
    gets its count from the symbol size (BTF_SET*_END sets it) and its entries sorted by id,
    which the kernel's bsearch of kfunc sets relies on; the flags travel with their ids.
Run it once per build, like the kernel's: after a set is sorted its entries' symbols no longer
point at them, so a second run would scramble the set. A name that resolves to nothing is an error (exit status 1): a kfunc set with a zero id would
register silently and refuse every program.

Usage: resolve_btfids.py --base VMLINUX_OR_RAW_BTF MODULE.ko   (the module is patched in place)
Only 64-bit little-endian ELF (x86-64, arm64).
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

BTF_MAGIC = 0xEB9F
KIND_INT, KIND_PTR, KIND_ARRAY, KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_FWD, KIND_TYPEDEF = 1, 2, 3, 4, 5, 6, 7, 8
KIND_FUNC, KIND_FUNC_PROTO, KIND_VAR, KIND_DATASEC, KIND_DECL_TAG, KIND_ENUM64 = 12, 13, 14, 15, 17, 19
#: bytes that follow a type's 12-byte header: fixed, or per vlen entry
_EXTRA_FIXED = {KIND_INT: 4, KIND_ARRAY: 12, KIND_VAR: 4, KIND_DECL_TAG: 4}
_EXTRA_PER_VLEN = {KIND_STRUCT: 12, KIND_UNION: 12, KIND_ENUM: 8, KIND_FUNC_PROTO: 8, KIND_DATASEC: 12,
                   KIND_ENUM64: 12}
#: the symbol prefixes of btf_ids.h -> BTF kind
PREFIX_KIND = {"func": KIND_FUNC, "struct": KIND_STRUCT, "union": KIND_UNION, "typedef": KIND_TYPEDEF}
SHT_SYMTAB = 2


class ResolveError(Exception):
    """Bad input; the message is one line."""


class Btf:
    """The types of one BTF blob: (kind, name) per id, ids from ``start_id``."""

    def __init__(self, data: bytes, base: "Btf | None" = None, what: str = "BTF") -> None:
        if len(data) < 24:
            raise ResolveError(f"{what}: too short for a BTF header")
        magic, _ver, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
        if magic != BTF_MAGIC:
            raise ResolveError(f"{what}: bad BTF magic {magic:#x} (big-endian or not BTF)")
        type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
        types = data[hdr_len + type_off: hdr_len + type_off + type_len]
        self.strings = data[hdr_len + str_off: hdr_len + str_off + str_len]
        self.base = base
        self.start_id = base.count if base else 1          # split ids continue after the base
        self.start_str = base.str_end if base else 0       # and so do string offsets
        self.str_end = self.start_str + len(self.strings)
        self.kinds: list[int] = []
        self.names: list[str] = []
        off = 0
        while off < len(types):
            if off + 12 > len(types):
                raise ResolveError(f"{what}: truncated type at byte {off}")
            name_off, info, _size = struct.unpack_from("<III", types, off)
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            off += 12 + _EXTRA_FIXED.get(kind, 0) + _EXTRA_PER_VLEN.get(kind, 0) * vlen
            self.kinds.append(kind)
            self.names.append(self.name(name_off))
        if off != len(types):
            raise ResolveError(f"{what}: type section ends inside a type")

    @property
    def count(self) -> int:
        """btf__type_cnt(): ids below this exist (void, id 0, included)."""
        return self.start_id + len(self.kinds)

    def name(self, off: int) -> str:
        if off < self.start_str:
            return self.base.name(off) if self.base else ""
        rel = off - self.start_str
        end = self.strings.find(b"\0", rel)
        return self.strings[rel: end if end >= 0 else len(self.strings)].decode(errors="replace")

    def ids(self) -> dict[tuple[int, str], int]:
        """(kind, name) -> first id, base types first."""
        out = self.base.ids() if self.base else {}
        for i, (k, n) in enumerate(zip(self.kinds, self.names)):
            if n:
                out.setdefault((k, n), self.start_id + i)
        return out


class Elf:
    """Just enough of an ELF64 little-endian file: sections by name, the symbol table."""

    def __init__(self, data: bytes, what: str) -> None:
        if data[:4] != b"\x7fELF":
            raise ResolveError(f"{what}: not an ELF file")
        if data[4] != 2 or data[5] != 1:
            raise ResolveError(f"{what}: only 64-bit little-endian ELF is supported")
        self.data = data
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        self.sections = []   # (name, type, offset, size, link)
        raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        names = raw[shstrndx]
        for sh in raw:
            n_off = names[4] + sh[0]
            name = data[n_off: data.index(b"\0", n_off)].decode()
            self.sections.append((name, sh[1], sh[4], sh[5], sh[6]))

    def section(self, name: str) -> tuple[int, int, int] | None:
        """(index, file offset, size) of the first section called ``name``."""
        for i, (n, _t, off, size, _l) in enumerate(self.sections):
            if n == name:
                return i, off, size
        return None

    def symbols(self):
        """(name, value, size, section index) of every symbol."""
        for _n, typ, off, size, link in self.sections:
            if typ != SHT_SYMTAB:
                continue
            stroff = self.sections[link][2]
            for i in range(size // 24):
                name_off, _info, _other, shndx, value, sz = struct.unpack_from("<IBBHQQ", self.data, off + i * 24)
                s = self.data[stroff + name_off: self.data.index(b"\0", stroff + name_off)].decode(errors="replace")
                yield s, value, sz, shndx


def load_base(path: Path) -> Btf:
    """vmlinux (its .BTF section) or a raw BTF file such as /sys/kernel/btf/vmlinux."""
    data = path.read_bytes()
    if data[:4] == b"\x7fELF":
        elf = Elf(data, str(path))
        sec = elf.section(".BTF")
        if sec is None:
            raise ResolveError(f"{path}: no .BTF section (a kernel built without CONFIG_DEBUG_INFO_BTF?)")
        data = data[sec[1]: sec[1] + sec[2]]
    return Btf(data, what=str(path))


def resolve(module: Path, base: Btf) -> dict[str, int]:
    """Patch ``module``'s .BTF_ids in place; returns symbol -> value written (ids and counts)."""
    data = bytearray(module.read_bytes())
    elf = Elf(bytes(data), str(module))
    ids_sec = elf.section(".BTF_ids")
    if ids_sec is None:
        return {}   # nothing to resolve (no BTF_ID macros, or built without CONFIG_DEBUG_INFO_BTF)
    btf_sec = elf.section(".BTF")
    if btf_sec is None:
        raise ResolveError(f"{module}: no .BTF section: run pahole -J --btf_base vmlinux on it first")
    btf = Btf(bytes(data[btf_sec[1]: btf_sec[1] + btf_sec[2]]), base, what=f"{module} .BTF")
    table = btf.ids()
    shndx, sec_off, sec_size = ids_sec
    written: dict[str, int] = {}
    sets: list[tuple[int, int, int]] = []   # (offset in file, count, entry size)
    missing = []
    for name, value, size, ndx in elf.symbols():
        if ndx != shndx or not name.startswith("__BTF_ID__"):
            continue
        if value + 4 > sec_size:
            raise ResolveError(f"{module}: {name} lies outside .BTF_ids")
        kind, _, rest = name[len("__BTF_ID__"):].partition("__")
        if kind in ("set", "set8"):
            entry = 4 if kind == "set" else 8
            header = 4 if kind == "set" else 8
            if size < header or (size - header) % entry or value + size > sec_size:
                raise ResolveError(f"{module}: {name} has size {size}, not a {kind}")
            cnt = (size - header) // entry
            struct.pack_into("<I", data, sec_off + value, cnt)
            sets.append((sec_off + value + header, cnt, entry))
            written[name] = cnt
            continue
        if kind not in PREFIX_KIND:
            raise ResolveError(f"{module}: {name}: unknown BTF_ID kind {kind!r}")
        target = rest.rsplit("__", 1)[0]   # drop the __COUNTER__/__LINE__ suffix
        tid = table.get((PREFIX_KIND[kind], target))
        if tid is None:
            missing.append(f"{kind} {target}")
            continue
        struct.pack_into("<I", data, sec_off + value, tid)
        written[name] = tid
    if missing:
        raise ResolveError(f"{module}: no BTF type for {', '.join(sorted(set(missing)))} "
                           "(is the function global and non-inlined, and did pahole run?)")
    for off, cnt, entry in sets:
        items = [bytes(data[off + i * entry: off + (i + 1) * entry]) for i in range(cnt)]
        items.sort(key=lambda b: struct.unpack_from("<i", b)[0])
        data[off: off + cnt * entry] = b"".join(items)
    module.write_bytes(bytes(data))
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, type=Path, help="vmlinux with .BTF, or raw BTF (/sys/kernel/btf/vmlinux)")
    ap.add_argument("--verbose", "-v", action="store_true")
    ap.add_argument("module", type=Path)
    a = ap.parse_args(argv)
    try:
        written = resolve(a.module, load_base(a.base))
    except (ResolveError, OSError) as e:
        print(f"resolve_btfids: {e}", file=sys.stderr)
        return 1
    if a.verbose:
        for k, v in written.items():
            print(f"{k} = {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
