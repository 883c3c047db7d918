"""Write the ELF vmlinux inside a compressed kernel image (bzImage) to a file.

Why: Debian's linux-headers ship no vmlinux, so Kbuild skips module BTF ("Skipping BTF
generation"); pahole needs the kernel's own BTF as the base (--btf_base) to give our test modules
split BTF, which CO-RE relocations and fentry attachment need. The vmlinux in the image carries
that .BTF section. Tries every xz / gzip payload in the image until one decompresses to an ELF.

Usage: python3 extract_vmlinux.py /boot/vmlinuz-VERSION OUT
"""

import gzip
import lzma
import sys
import zlib


def candidates(img: bytes):
    for magic, unpack in ((b"\xfd7zXZ\x00", lambda b: lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(b)),
                          (b"\x1f\x8b\x08", lambda b: zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(b))):
        at = img.find(magic)
        while at >= 0:
            try:
                yield unpack(img[at:])
            except (lzma.LZMAError, zlib.error, gzip.BadGzipFile, EOFError):
                pass
            at = img.find(magic, at + 1)


def main(src: str, out: str) -> int:
    img = open(src, "rb").read()
    for elf in candidates(img):
        if elf[:4] == b"\x7fELF":
            with open(out, "wb") as fh:
                fh.write(elf)
            return 0
    print(f"{src}: no xz or gzip payload decompresses to an ELF vmlinux", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
