"""DeepUM controller cost: fault records ingested per second (table updates, chaining and
command generation included) and how much slower a replay gets than mode none. Prints
tables; asserts nothing.

    python3 benchmarks/deepum_ingest.py [--accesses 10M]

The fault stream is the one mode none produces on a GPT-2 XL-shaped loop (recorded once in
memory), fed to the controller in drains of 2 K, 16 K and 64 K records (a live drain every
2 ms at 1 M faults/s holds 2 K)."""

from __future__ import annotations

import argparse
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from umctl.controller import make_controller
from umctl.controller.base import ControllerContext
from umctl.events.schema import EventBatch, Kind
from umctl.sim.engine import Simulator

from sim_throughput import _count, dnn_workload


class _Keep:
    """A recorder that keeps launch and fault events in memory."""

    def __init__(self):
        self.launch, self.fault = [], []

    def write(self, b: EventBatch) -> None:
        if Kind.LAUNCH in b:
            self.launch.append(b[Kind.LAUNCH])
        if Kind.FAULT in b:
            self.fault.append(b[Kind.FAULT])

    def close(self) -> None:
        pass


def feed(w, launches: np.ndarray, faults: np.ndarray, chunk: int) -> tuple[float, dict]:
    ctl = make_controller("deepum")
    ctl.attach(ControllerContext(n_gpus=1, gpu_mem=list(w.gpu_mem)))
    # cut the stream into drains of `chunk` fault records, launches placed by time
    cuts = np.arange(chunk, len(faults), chunk)
    t_cut = faults["t_ns"][cuts]
    lsplit = np.searchsorted(launches["t_ns"], t_cut)
    fparts, lparts = np.split(faults, cuts), np.split(launches, lsplit)
    t0 = time.perf_counter()
    for f, la in zip(fparts, lparts):
        b = EventBatch(now_ns=int(f["t_ns"][-1]) if len(f) else 0)
        b.arrays[Kind.FAULT] = f
        b.arrays[Kind.LAUNCH] = la
        ctl.on_events(b)
    return time.perf_counter() - t0, ctl.stats()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accesses", default="10M")
    args = ap.parse_args()
    w = dnn_workload(_count(args.accesses), 2.0)
    keep = _Keep()
    none = Simulator(w, make_controller("none"), recorder=keep).run()
    launches = np.concatenate(keep.launch)
    faults = np.concatenate(keep.fault)
    con = Console(width=120)
    con.print(f"{w.name}: {w.n_accesses:,} accesses; fault stream of mode none: {len(faults):,} records, "
              f"{len(launches):,} launches")
    t = Table(title="DeepUM ingest (one core)", title_justify="left")
    for col in ("drain size", "wall", "fault records/s", "launches/s", "table entries"):
        t.add_column(col, justify="right")
    for chunk in (2048, 16384, 65536):
        wall, st = feed(w, launches, faults, chunk)
        t.add_row(f"{chunk:,}", f"{wall:.3f} s", f"{len(faults) / wall / 1e6:.2f} M",
                  f"{len(launches) / wall / 1e3:.0f} k", f"{st['table_entries']:,}")
    con.print(t)
    t = Table(title="replay wall time: deepum vs none (same workload, one core, best of 3)", title_justify="left")
    for col in ("mode", "wall", "vs none", "sim time", "GPU faults"):
        t.add_column(col, justify="right")
    best = {}
    for mode in ("none", "deepum", "oracle"):  # best of 3: the machine may be busy
        best[mode] = min((Simulator(w, make_controller(mode)).run() for _ in range(3)), key=lambda r: r.wall_s)
    for mode, r in best.items():
        t.add_row(mode, f"{r.wall_s:.2f} s", f"{r.wall_s / best['none'].wall_s:.2f}×", f"{r.time_s:.3f} s",
                  f"{r.faults:,}")
    con.print(t)


if __name__ == "__main__":
    main()
