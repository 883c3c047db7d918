"""A process registered with the simulated driver (kmod/uvm_sim), then makes the accesses its stdin
asks for. Used in the VM only.

It opens /dev/uvm_sim twice, as a CUDA process opens /dev/nvidia-uvm: the first fd becomes its
"mm fd" (UVM_MM_INITIALIZE with the second, the va_space fd), on which the driver answers every
other ioctl with NV_ERR_ILLEGAL_ACTION — opened first, so the umctl module's backend meets it
first in the file table and must skip it.

stdin lines: ``A BASE NBLOCKS PAGES ACCESS`` -> touch PAGES pages of each of NBLOCKS 2 MiB blocks
from BASE (ACCESS: 1 read, 2 write, 3 atomic); ``F BASE NBLOCKS`` -> free those blocks (their
range is no longer managed until touched again); both answer ``done`` once the driver has
serviced them. ``Q`` exits."""

import fcntl
import os
import struct
import sys

import numpy as np

FAULT = np.dtype([("addr", np.uint64), ("access", np.uint32), ("pad", np.uint32)])
UVM_MM_INITIALIZE = 75          # kmod/umctl/uvm_abi.h
UVM_SIM_ACCESS_FREE = 0xF7EE    # kmod/uvm_sim/uvm_sim.h


def main() -> None:
    mm_fd = os.open("/dev/uvm_sim", os.O_RDWR)
    fd = os.open("/dev/uvm_sim", os.O_RDWR)
    p = bytearray(struct.pack("=iI", fd, 0xFFFFFFFF))
    fcntl.ioctl(mm_fd, UVM_MM_INITIALIZE, p)
    st = struct.unpack("=iI", p)[1]
    if st != 0:
        print("UVM_MM_INITIALIZE", hex(st), file=sys.stderr)
        sys.exit(1)
    print("ready", os.getpid(), flush=True)
    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] == "Q":
            break
        if parts[0] == "F":
            base, nblocks = int(parts[1], 0), int(parts[2])
            a = np.zeros(nblocks, FAULT)
            a["addr"] = base + (np.arange(nblocks, dtype=np.uint64) << np.uint64(21))
            a["access"] = UVM_SIM_ACCESS_FREE
            os.write(fd, a.tobytes())
            print("done", flush=True)
            continue
        base, nblocks, pages, access = int(parts[1], 0), int(parts[2]), int(parts[3]), int(parts[4])
        blocks = base + (np.arange(nblocks, dtype=np.uint64) << np.uint64(21))
        offs = (np.arange(pages, dtype=np.uint64) * np.uint64(4096 * max(1, 512 // max(1, pages))))
        a = np.zeros(nblocks * pages, FAULT)
        a["addr"] = (blocks[:, None] + offs[None, :]).ravel()
        a["access"] = access
        os.write(fd, a.tobytes())
        print("done", flush=True)
    os.close(fd)
    os.close(mm_fd)


if __name__ == "__main__":
    main()
