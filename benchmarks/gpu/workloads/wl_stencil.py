"""GPU workload for replay fidelity: Jacobi stencil sweeps over managed grids, 2-D (5-point)
then 3-D (7-point), written as torch slicing (several elementwise kernels and temporaries per
sweep). Run it under ``umctl run --runtime --managed``.

The host initialises each grid through its managed pointer (a hot boundary, a cold interior),
the GPU sweeps it ``--sweeps`` times, and every ``--bc-every`` sweeps the host rewrites the
boundary planes (a time-dependent boundary condition), which sends those pages back to the
host for the next sweep to fault in again. Prints ``DONE ms t0=NS t1=NS check ok`` (span from
before the first grid's allocation to the last synchronisation, ends on CLOCK_MONOTONIC).
Check: Jacobi averaging keeps every value within the boundary's range [0, bc]."""

import argparse

import torch
from wl_span import Span, host_view, require_managed


def sweep2(a: torch.Tensor, b: torch.Tensor) -> None:
    b[1:-1, 1:-1] = 0.25 * (a[:-2, 1:-1] + a[2:, 1:-1] + a[1:-1, :-2] + a[1:-1, 2:])


def sweep3(a: torch.Tensor, b: torch.Tensor) -> None:
    b[1:-1, 1:-1, 1:-1] = (a[:-2, 1:-1, 1:-1] + a[2:, 1:-1, 1:-1] + a[1:-1, :-2, 1:-1] + a[1:-1, 2:, 1:-1]
                           + a[1:-1, 1:-1, :-2] + a[1:-1, 1:-1, 2:]) / 6.0


def run(shape: tuple[int, ...], sweep, sweeps: int, bc_every: int, dev) -> bool:
    a = torch.empty(shape, device=dev)
    b = torch.empty(shape, device=dev)
    ha, hb = host_view(a), host_view(b)
    for h in (ha, hb):
        h[:] = 0.0
        h[0] = 1.0                         # the hot face
    bc = 1.0
    for s in range(sweeps):
        if s and s % bc_every == 0:
            bc = 1.0 + 0.5 * (s // bc_every)    # the boundary heats up; written on the host
            torch.cuda.synchronize()
            ha[0] = bc
            hb[0] = bc
        sweep(a, b)
        a, b = b, a
    torch.cuda.synchronize()
    lo, hi = float(a.min()), float(a.max())
    return 0.0 <= lo and hi <= bc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n2", type=int, default=6144, help="2-D grid edge")
    ap.add_argument("--n3", type=int, default=320, help="3-D grid edge")
    ap.add_argument("--sweeps", type=int, default=12)
    ap.add_argument("--bc-every", type=int, default=4)
    a = ap.parse_args()
    require_managed("wl_stencil")
    need = max(a.n2 ** 2, a.n3 ** 3) * 4 * 6   # two grids and the sweep's temporaries
    free, _ = torch.cuda.mem_get_info()
    if need > free // 4:
        raise SystemExit("wl_stencil: the grids need more than a quarter of the free GPU memory")
    dev = torch.device("cuda")
    w = torch.zeros(8, 8, 8, device=dev)
    sweep3(w, w.clone())
    sweep2(w[0], w[1])
    float(w.min()) + float(w.max())             # kernels loaded before the measured span
    span = Span()
    ok = run((a.n2, a.n2), sweep2, a.sweeps, a.bc_every, dev)
    print(f"STENCIL2D {span.ms():.1f}", flush=True)
    ok &= run((a.n3, a.n3, a.n3), sweep3, a.sweeps, a.bc_every, dev)
    span.done(ok)


if __name__ == "__main__":
    main()
