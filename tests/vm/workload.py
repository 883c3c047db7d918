"""A process registered with the simulated driver (kmod/uvm_sim): opens /dev/uvm_sim, then makes
the accesses its stdin asks for. Used in the VM only.

stdin lines: ``A BASE NBLOCKS PAGES ACCESS`` -> touch PAGES pages of each of NBLOCKS 2 MiB blocks
from BASE (ACCESS: 1 read, 2 write, 3 atomic); answers ``done`` after the driver has serviced
them. ``Q`` exits."""

import os
import sys

import numpy as np

FAULT = np.dtype([("addr", np.uint64), ("access", np.uint32), ("pad", np.uint32)])


def main() -> None:
    fd = os.open("/dev/uvm_sim", os.O_WRONLY)
    print("ready", os.getpid(), flush=True)
    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] == "Q":
            break
        base, nblocks, pages, access = int(parts[1], 0), int(parts[2]), int(parts[3]), int(parts[4])
        blocks = base + (np.arange(nblocks, dtype=np.uint64) << np.uint64(21))
        offs = (np.arange(pages, dtype=np.uint64) * np.uint64(4096 * max(1, 512 // max(1, pages))))
        a = np.zeros(nblocks * pages, FAULT)
        a["addr"] = (blocks[:, None] + offs[None, :]).ravel()
        a["access"] = access
        os.write(fd, a.tobytes())
        print("done", flush=True)
    os.close(fd)


if __name__ == "__main__":
    main()
