"""GPU workload for replay fidelity: an irregular gather over a large managed table (an
embedding lookup). Run it under ``umctl run --runtime --managed``.

The host fills the table (``--mib``, rows of ``--width`` float32) through its managed pointer;
then each step gathers ``--rows`` random rows (``index_select`` with indices drawn on the GPU,
seeded) and reduces them. The rows a step touches are scattered over the whole table, so its
fault batches span many 2 MiB blocks and the density prefetcher sees sparse blocks: the
pattern DLRM-like lookups have. Every ``--update-every`` steps the host rewrites a few random
rows (a sparse optimizer's update on the host), which sends their pages back to the host.
Prints ``DONE ms t0=NS t1=NS check ok`` (span from before the table's allocation to the last
synchronisation, ends on CLOCK_MONOTONIC); the reduction is checked against the row values."""

import argparse

import numpy as np
import torch
from wl_span import Span, host_view, require_managed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512, help="table size")
    ap.add_argument("--width", type=int, default=256, help="floats per row")
    ap.add_argument("--rows", type=int, default=16384, help="rows gathered per step")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--update-every", type=int, default=4)
    ap.add_argument("--update-rows", type=int, default=512)
    a = ap.parse_args()
    require_managed("wl_gather")
    nrows = (a.mib << 20) // (a.width * 4)
    free, _ = torch.cuda.mem_get_info()
    if (a.mib << 20) > free // 4:
        raise SystemExit(f"wl_gather: {a.mib} MiB is more than a quarter of the free GPU memory")
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(7)
    rng = np.random.default_rng(7)
    w = torch.arange(1024, device=dev, dtype=torch.float32).reshape(4, 256)
    w.index_select(0, torch.tensor([1, 3], device=dev)).double().sum().item()   # kernels loaded
    span = Span()
    table = torch.empty(nrows, a.width, device=dev)
    host = host_view(table)
    value = (np.arange(nrows) % 1000).astype(np.float32)   # row i holds i % 1000 (+ its updates)
    host[:] = value[:, None]
    ok = True
    for step in range(a.steps):
        if step and step % a.update_every == 0:
            upd = rng.choice(nrows, a.update_rows, replace=False)
            value[upd] += 1.0
            host[upd] = value[upd, None]
        idx = torch.randint(0, nrows, (a.rows,), device=dev, generator=g)
        got = table.index_select(0, idx).double().sum().item()
        want = float(value[idx.cpu().numpy()].astype(np.float64).sum()) * a.width
        ok &= got == want
        print(f"STEP {step} {span.ms():.1f}", flush=True)
    span.done(ok)


if __name__ == "__main__":
    main()
