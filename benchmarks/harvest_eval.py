"""memHarvester on replay: HUVM's Table 2 cases (Figure 6 speedups over none and pre-ef-host),
the per-technique build-up of Figure 7 (H -> +PE -> +LP -> +PLF -> +LPF/MPF), the yielding
GPUs' slowdown (§6.2.1), and Figure 9's spare-memory sweep. Prints tables; asserts nothing.

    python3 benchmarks/harvest_eval.py [--cases 1,2,3,4] [--spares 0.05,0.1,0.2,0.4,0.6]

A tenant's time is the time its GPU's kernels ran, compute plus fault stalls
(SimResult.gpu_kernel_ns: the tenants share one simulated host thread, so end times would mix
in the other jobs' synchronisations); speedups are per
harvesting tenant, slowdowns per lending tenant, each against the same tenant under ``none``.
"""

from __future__ import annotations

import argparse

import numpy as np
from rich.console import Console
from rich.table import Table

from umctl.controller.base import make_controller
from umctl.controller.harvest import roles
from umctl.sim.engine import simulate
from umctl.workload.scenario import load_scenario

BUILDUP = ["harvest-h", "harvest-pe", "harvest-lp", "harvest-plf", "harvest-lpf", "harvest"]
MODES = ["none", "pre-ef-host", *BUILDUP]
#: HUVM Figure 6 / §6.2.1 text: memHarvester's speedup over Base and over Pre-ef-host per
#: harvester, and the yielding GPUs' performance impact.
PAPER = {
    1: ("3.53x", "1.31x", "negligible"),
    2: ("3.52x", "2.1x", "7-9 %"),
    3: ("3.83x / 3.21x", "2.71x / 2.67x", "none"),
    4: ("2.1-2.36x", "1.3-1.4x", "~7 %"),
}


LEND_LIMIT = True   # --no-lend-limit: lenders lend any free chunk (the model before the limit)


def tenant_times(name: str, modes: list[str], overrides: dict) -> tuple[dict[str, np.ndarray], list[int], list[int]]:
    w = load_scenario(name, overrides)
    harv, lend = roles(w, w.n_gpus)

    def ctl(m: str):
        return make_controller(m, **({"lend_limit": False} if not LEND_LIMIT and m.startswith("harvest") else {}))

    return {m: simulate(w, ctl(m)).gpu_kernel_ns.astype(float) for m in modes}, harv, lend


def geo(x) -> float:
    x = np.asarray(list(x), float)
    return float(np.exp(np.log(x).mean()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="1,2,3,4")
    ap.add_argument("--no-lend-limit", action="store_true", help="harvest modes with -O lend_limit=false")
    ap.add_argument("--spares", default="0.05,0.1,0.2,0.4,0.6")
    ap.add_argument("--iters", default=None, help="harvester iterations (scenario default if unset)")
    args = ap.parse_args()
    global LEND_LIMIT
    LEND_LIMIT = not args.no_lend_limit
    con = Console(width=160)
    ov = {"iterations": args.iters} if args.iters else {}

    main_t = Table(title="HUVM Table 2 cases: harvester speedup, yielding GPUs' slowdown (simulated)", title_justify="left")
    for col in ("case", "harvesters (GPU)", "harvest / none", "harvest / pre-ef-host", "pre-ef-host / none",
                "paper / Base", "paper / Pre-ef-host", "yielders' slowdown", "paper"):
        main_t.add_column(col, justify="right")
    build = Table(title="Technique build-up (HUVM Figure 7): speedup over none per harvester", title_justify="left")
    for col in ("case / GPU", *BUILDUP):
        build.add_column(col, justify="right")
    for c in [int(x) for x in args.cases.split(",")]:
        t, harv, lend = tenant_times(f"huvm-case{c}", MODES, ov)
        base, pre, hv = t["none"], t["pre-ef-host"], t["harvest"]
        sp_none = [base[g] / hv[g] for g in harv]
        sp_pre = [pre[g] / hv[g] for g in harv]
        pre_none = [base[g] / pre[g] for g in harv]
        slow = [hv[h] / base[h] for h in lend]
        p = PAPER.get(c, ("", "", ""))
        main_t.add_row(f"Case-{c}", ", ".join(map(str, harv)),
                       " / ".join(f"{x:.2f}x" for x in sp_none), " / ".join(f"{x:.2f}x" for x in sp_pre),
                       " / ".join(f"{x:.2f}x" for x in pre_none), p[0], p[1],
                       " / ".join(f"{(x - 1) * 100:+.1f} %" for x in slow), p[2])
        for g in harv:
            build.add_row(f"Case-{c} / {g}", *[f"{base[g] / t[m][g]:.2f}x" for m in BUILDUP])
    con.print(main_t)
    con.print(build)

    sweep = Table(title="Spare memory sweep (HUVM Figure 9): 2 GPUs, PageRank at 1.5x, speedup over none",
                  title_justify="left")
    for col in ("spare", "harvest-h", "harvest", "pre-ef-host", "yielder slowdown (harvest)"):
        sweep.add_column(col, justify="right")
    for s in args.spares.split(","):
        t, harv, lend = tenant_times("huvm-pair", ["none", "pre-ef-host", "harvest-h", "harvest"], {**ov, "spare": s})
        g, h = harv[0], lend[0]
        sweep.add_row(f"{float(s) * 100:.0f} %", *[f"{t['none'][g] / t[m][g]:.2f}x" for m in ("harvest-h", "harvest", "pre-ef-host")],
                      f"{(t['harvest'][h] / t['none'][h] - 1) * 100:+.1f} %")
    con.print(sweep)


if __name__ == "__main__":
    main()
