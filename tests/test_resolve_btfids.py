"""kmod/tools/resolve_btfids.py on a synthetic module: a C object whose .BTF_ids section is laid
out as include/linux/btf_ids.h lays it out (a BTF_SET8 of two kfuncs with flags, BTF_IDs of
structs in the base and in the module), with a split BTF embedded as its .BTF section."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "kmod" / "tools"))
import resolve_btfids as rb  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="needs a C compiler")


class BtfWriter:
    """A minimal BTF encoder: enough kinds for the test (INT, STRUCT without members, FUNC_PROTO
    without parameters, FUNC)."""

    def __init__(self, str_base: int = 0):
        self.types = b""
        self.strings = b"" if str_base else b"\0"
        self.str_base = str_base

    def s(self, name: str) -> int:
        off = self.str_base + len(self.strings)
        self.strings += name.encode() + b"\0"
        return off

    def add(self, kind: int, name: str, vlen: int = 0, size_or_type: int = 0, extra: bytes = b"") -> None:
        self.types += struct.pack("<III", self.s(name) if name else 0, (kind << 24) | vlen, size_or_type) + extra

    def blob(self) -> bytes:
        hdr = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(self.types), len(self.types), len(self.strings))
        return hdr + self.types + self.strings


def asm_id(kind: str, name: str, n: int, flags: int | None = None) -> str:
    """One BTF_ID / BTF_ID_FLAGS entry, in btf_ids.h's layout."""
    sym = f"__BTF_ID__{kind}__{name}__{n}"
    word = f".long {flags}\\n" if flags is not None else ""
    return (f'asm(".pushsection .BTF_ids,\\"a\\";\\n.local {sym};\\n.type {sym}, STT_OBJECT;\\n'
            f'.size {sym}, 4;\\n{sym}:\\n.zero 4\\n{word}.popsection;\\n");\n')


def build(tmp: Path, btf_blob: bytes, body: str) -> Path:
    (tmp / "mod.btf").write_bytes(btf_blob)
    src = tmp / "mod.c"
    src.write_text(body + f'asm(".pushsection .BTF,\\"\\";\\n.incbin \\"{tmp / "mod.btf"}\\"\\n.popsection\\n");\n')
    obj = tmp / "mod.o"
    cc = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([cc, "-c", str(src), "-o", str(obj)], check=True, capture_output=True)
    return obj


SET8 = ('asm(".pushsection .BTF_ids,\\"a\\";\\n.local kset;\\nkset:;\\n.popsection;\\n");\n'
        'asm(".pushsection .BTF_ids,\\"a\\";\\n.local __BTF_ID__set8__kset;\\n__BTF_ID__set8__kset:;\\n'
        '.zero 8\\n.popsection;\\n");\n')
SET8_END = 'asm(".pushsection .BTF_ids,\\"a\\";\\n.size __BTF_ID__set8__kset, .-kset\\n.popsection;\\n");\n'


def base_btf() -> tuple[bytes, rb.Btf]:
    w = BtfWriter()
    w.add(rb.KIND_INT, "int", size_or_type=4, extra=struct.pack("<I", 32))   # id 1
    w.add(rb.KIND_STRUCT, "task_struct", size_or_type=8)                       # id 2
    w.add(rb.KIND_FUNC_PROTO, "", 0, 1)                                        # id 3
    blob = w.blob()
    return blob, rb.Btf(blob)


def module_btf(base: rb.Btf) -> bytes:
    w = BtfWriter(str_base=base.str_end)
    w.add(rb.KIND_FUNC_PROTO, "", 0, 1)          # id 4 (split ids continue after the base's 3 + void)
    w.add(rb.KIND_FUNC, "kf_a", 0, 4)            # id 5
    w.add(rb.KIND_STRUCT, "mod_state", size_or_type=16)   # id 6
    w.add(rb.KIND_FUNC, "kf_b", 0, 4)            # id 7
    return w.blob()


def read_ids(obj: Path) -> bytes:
    elf = rb.Elf(obj.read_bytes(), "t")
    _i, off, size = elf.section(".BTF_ids")
    return obj.read_bytes()[off: off + size]


def test_set8_filled_and_sorted_with_flags(tmp_path: Path):
    _blob, base = base_btf()
    assert base.count == 4
    body = (SET8 + asm_id("func", "kf_b", 11, 3) + asm_id("func", "kf_a", 12, 5) + SET8_END
            + asm_id("struct", "task_struct", 13) + asm_id("struct", "mod_state", 14))
    obj = build(tmp_path, module_btf(base), body)
    # what the compiler leaves: zero ids and counts, the flags in place
    assert struct.unpack("<8I", read_ids(obj)) == (0, 0, 0, 3, 0, 5, 0, 0)
    written = rb.resolve(obj, base)
    assert written["__BTF_ID__set8__kset"] == 2
    assert written["__BTF_ID__func__kf_a__12"] == 5 and written["__BTF_ID__func__kf_b__11"] == 7
    cnt, flags, id0, f0, id1, f1, t_base, t_mod = struct.unpack("<8I", read_ids(obj))
    assert (cnt, flags) == (2, 0)
    assert (id0, f0, id1, f1) == (5, 5, 7, 3)   # sorted by id, flags moved along
    assert t_base == 2 and t_mod == 6           # a base type and a split type


def test_missing_function_is_an_error(tmp_path: Path):
    _blob, base = base_btf()
    obj = build(tmp_path, module_btf(base), SET8 + asm_id("func", "kf_nope", 1, 0) + SET8_END)
    with pytest.raises(rb.ResolveError, match="no BTF type for func kf_nope"):
        rb.resolve(obj, base)


def test_cli_errors_are_one_line(tmp_path: Path, capsys):
    blob, _base = base_btf()
    (tmp_path / "base.btf").write_bytes(blob)
    (tmp_path / "x.ko").write_bytes(b"not an elf")
    assert rb.main(["--base", str(tmp_path / "base.btf"), str(tmp_path / "x.ko")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not an ELF file" in err
    (tmp_path / "bad.btf").write_bytes(b"\0" * 32)
    assert rb.main(["--base", str(tmp_path / "bad.btf"), str(tmp_path / "x.ko")]) == 1
    assert "bad BTF magic" in capsys.readouterr().err
