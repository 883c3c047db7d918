"""SnuRHAC on the multigpu scenarios over 1 to 32 GPUs (thesis §7.3, Figure 7.9's configurations).

For each program and variant (``snurhac``, ``-sp``, ``-sp-dp``), the speedup over the program on
one GPU as written (mode ``none``: CUDA without UM, the thesis's baseline) at 1, 2, 4, 8, 16 and 32
GPUs, four per node as in the thesis's cluster (1, 2, 4 GPUs: one node; 8: two nodes; 32: eight
nodes over InfiniBand EDR), replayed with the ``snurhac-v100-edr`` calibration (Table 7.9).

Figure 7.9 is an image: its bars are not in the thesis's text, so there is no thesis number per
bar to set beside these. The numbers the text does give are Table 7.11's one-GPU speedups: the
1-GPU column is compared with them (error per point). Everything else the text says about Figure
7.9 (and Figure 7.12) is a qualitative claim; each is checked and reported as pass or fail.

    PYTHONPATH=. python3 benchmarks/snurhac_eval.py [--scale fit|full] [--counts 1,2,4,8,16,32]
        [--programs mgpu-gemm,...] [--per-node 4] [--calibration snurhac-v100-edr] [--json out.json]

``--scale fit`` (default) runs the programs at 192 MiB (75 % of a 256 MiB GPU, about 2 minutes on
two cores); ``--scale full`` at Table 7.10's device memory sizes on 32 GiB GPUs (much longer).
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "papers"))

from common import geomean  # noqa: E402  (benchmarks/papers/common.py)
from snurhac import STAND_INS, TABLE_7_11  # noqa: E402  (benchmarks/papers/snurhac.py)

from umctl.controller import make_controller  # noqa: E402
from umctl.sim.calibration import Calibration  # noqa: E402
from umctl.sim.engine import simulate  # noqa: E402
from umctl.workload.families.multigpu import HANDWRITTEN  # noqa: E402
from umctl.workload.scenario import list_scenarios, load_scenario  # noqa: E402

VARIANTS = ["snurhac", "snurhac-sp", "snurhac-sp-dp"]
COUNTS = [1, 2, 4, 8, 16, 32]
#: the thesis's application each scenario stands for (Table 7.10), for Table 7.11's values
APP = {s: a for a, s in STAND_INS.items() if a not in ("sgemm", "correlation")}
MATMULS = ("mgpu-gemm", "mgpu-2mm", "mgpu-3mm")
COPY_BOUND = ("mgpu-gesummv", "mgpu-stencil", "mgpu-lavamd")
#: parallel efficiency (speedup at N GPUs over N x the speedup at one) below which a program
#: "scales poorly" for the claims below; the thesis gives no threshold
POOR = 0.5
#: the programs with a version written for several GPUs (``--param handwritten=true``), replayed
#: under mode none at the counts of one node: Figure 7.12's "CUDA" bars, on these programs
HAND = {f"mgpu-{p}" for p in HANDWRITTEN}
#: SnuRHAC-SP-DP's time within this factor of the hand-written program's: "almost the same"
NEAR = 1.25


def topology(count: int, per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) of a ``count``-GPU configuration, ``per_node`` GPUs a node."""
    if count <= per_node:
        return 1, count
    if count % per_node:
        raise SystemExit(f"error: {count} GPUs is not a whole number of {per_node}-GPU nodes")
    return count // per_node, per_node


def replay(name: str, count: int, mode: str, a, calib: Calibration) -> dict:
    """One point; mode ``handwritten`` is the program written for ``count`` GPUs, under mode none."""
    nodes, gpus = topology(count, a.per_node)
    params = {"nodes": str(nodes), "gpus": str(gpus), "tiles": str(a.tiles), "scale": a.scale,
              "handwritten": str(mode == "handwritten").lower()}
    mode = "none" if mode == "handwritten" else mode
    if a.gpu_mem:
        params["gpu_mem"] = a.gpu_mem
    w = load_scenario(name, params)
    opts = {"single_gpu": True} if count == 1 and mode != "none" else {}
    r = simulate(w, make_controller(mode, **opts), calib=calib)
    c = r.controller
    return {"program": name, "gpus": count, "nodes": nodes, "mode": "handwritten" if params["handwritten"] == "true"
            else mode, "time_ns": r.time_ns, "faults": r.faults,
            "bytes_h2d": r.bytes_h2d, "bytes_p2p": r.bytes_p2p, "bytes_internode": r.bytes_internode,
            "internode_messages": r.internode_messages, "kernels": c.get("kernels", 0),
            "partitioned": c.get("partitioned", 0), "fallback_overlap": c.get("fallback_overlap", 0),
            "fallback_atomics": c.get("fallback_atomics", 0), "wall_s": round(r.wall_s, 2)}


def program_points(p: str, counts: list[int], a, calib: Calibration) -> dict:
    """Every replay of one program (a process of its own with --jobs)."""
    t0, pts = time.perf_counter(), {}
    todo = [(1, "none")] + [(g, m) for g in counts for m in VARIANTS]
    if p in HAND:
        todo += [(g, "handwritten") for g in counts if g <= a.per_node]
    for k, (g, m) in enumerate(todo):
        pts[p, g, m] = replay(p, g, m, a, calib)
        print(f"[{p} {k + 1}/{len(todo)}] {m} {g} GPU(s): {pts[p, g, m]['wall_s']:.1f} s "
              f"(total {time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    return pts


def claims(pts: dict, progs: list[str], counts: list[int]) -> list[dict]:
    """The thesis's statements about Figures 7.9 and 7.12, each a pass or a fail with its evidence."""
    sp = lambda p, g, m: pts[p, g, m]["speedup"]  # noqa: E731
    multi = [g for g in counts if g > 1]
    top = max(counts)
    out = []

    def claim(text: str, ok: bool | None, evidence: str) -> None:
        out.append({"claim": text, "result": "n/a" if ok is None else ("pass" if ok else "FAIL"),
                    "evidence": evidence})

    worse = [f"{p} {g}" for p in progs for g in counts
             if pts[p, g, "snurhac-sp-dp"]["time_ns"] > 1.01 * min(pts[p, g, m]["time_ns"] for m in VARIANTS)]
    claim("SnuRHAC-SP-DP shows the best performance for all applications", not worse,
          "SP-DP within 1 % of the fastest variant everywhere" if not worse else "slower than another variant: "
          + ", ".join(worse))
    poorest = [(p, g) for p in progs for g in multi if pts[p, g, "snurhac"]["time_ns"] >=
               max(pts[p, g, m]["time_ns"] for m in VARIANTS) * 0.999]
    n = len(progs) * len(multi)
    claim("SnuRHAC (on demand) shows the poorest performance for most applications", len(poorest) > n / 2,
          f"poorest at {len(poorest)} of {n} multi-GPU points")
    if "mgpu-lavamd" in progs:
        gain = sp("mgpu-lavamd", top, "snurhac-sp-dp") / sp("mgpu-lavamd", top, "snurhac-sp")
        claim("SP-DP notably ahead of SP for lavaMD (MAPA cannot analyse its accesses)", gain > 1.1,
              f"lavaMD at {top} GPUs: SP-DP / SP = {gain:.2f}")
    near = {p: max(abs(sp(p, g, "snurhac-sp-dp") / sp(p, g, "snurhac-sp") - 1) for g in counts)
            for p in progs if p != "mgpu-lavamd"}
    off = {p: d for p, d in near.items() if d > 0.05}
    claim("SP similar to SP-DP for the other applications", not off,
          "within 5 % everywhere" if not off else ", ".join(f"{p} {d:+.0%}" for p, d in off.items()))

    def eff(p: str) -> float:
        return sp(p, top, "snurhac-sp-dp") / (top * sp(p, 1, "snurhac-sp-dp"))

    for group, text in ((MATMULS, "2-D matrix multiplications (gemm, 2mm, 3mm) scale poorly: every GPU needs all of B"),
                        (COPY_BOUND, "copy-bound hotspot, lavaMD and gesummv scale poorly"),
                        (("mgpu-particles",), "particlefilter suffers: kernels use one buffer under different "
                                              "patterns, so its pages move between GPUs at every launch")):
        have = [p for p in group if p in progs]
        if have:
            e = {p: eff(p) for p in have}
            claim(text, all(x < POOR for x in e.values()), f"SP-DP parallel efficiency at {top} GPUs: "
                  + ", ".join(f"{p.removeprefix('mgpu-')} {x:.0%}" for p, x in e.items()) + f" (poor: < {POOR:.0%})")
    mm = [p for p in MATMULS if p in progs]
    node_counts = [g for g in multi if pts[mm[0], g, "snurhac-sp-dp"]["nodes"] > 1] if mm else []
    if len(node_counts) >= 2:
        grows = all(pts[p, a, "snurhac-sp-dp"]["bytes_internode"] < pts[p, b, "snurhac-sp-dp"]["bytes_internode"]
                    for p in mm for a, b in zip(node_counts, node_counts[1:]))
        claim("matmuls: network traffic grows with the GPUs taking part", grows,
              "SP-DP bytes over the network, " + "; ".join(
                  f"{p.removeprefix('mgpu-')} " + " / ".join(
                      f"{pts[p, g, 'snurhac-sp-dp']['bytes_internode'] / 2**20:.0f}" for g in node_counts)
                  for p in mm) + f" MiB at {' / '.join(map(str, node_counts))} GPUs")
    for p, why in (("mgpu-covariance", "write-overlap check"), ("mgpu-histogram", "atomics")):
        if p in progs:
            key = "fallback_overlap" if p == "mgpu-covariance" else "fallback_atomics"
            one = all(pts[p, g, m][key] == pts[p, g, m]["kernels"] > 0 for g in multi for m in VARIANTS)
            spread = [sp(p, g, "snurhac-sp-dp") for g in multi]
            claim(f"{p.removeprefix('mgpu-')} runs on a single GPU ({why})", one,
                  f"every kernel on GPU 0 at every count; SP-DP speedup {min(spread):.2f}-{max(spread):.2f}")
    hand = [(p, g) for p in progs for g in multi if (p, g, "handwritten") in pts]
    if hand:
        far = [f"{p.removeprefix('mgpu-')} {g}: {pts[p, g, 'snurhac-sp-dp']['time_ns'] / pts[p, g, 'handwritten']['time_ns']:.2f}x"
               for p, g in hand if pts[p, g, "snurhac-sp-dp"]["time_ns"] > NEAR * pts[p, g, "handwritten"]["time_ns"]]
        scal = ", ".join(f"{p.removeprefix('mgpu-')} {g}: {sp(p, g, 'snurhac-sp-dp') / sp(p, 1, 'snurhac-sp-dp'):.2f} vs "
                         f"{sp(p, g, 'handwritten') / sp(p, 1, 'handwritten'):.2f}" for p, g in hand)
        claim("Figure 7.12: almost the same scalability and performance as hand-written multi-GPU programs "
              "(here: gemm, 2mm, gesummv written for the GPUs of one node)", not far,
              (f"SP-DP slower than hand-written by more than {NEAR}x at " + ", ".join(far) if far else
               f"SP-DP within {NEAR}x of hand-written everywhere") + f"; scaling over 1 GPU (SP-DP vs hand-written) {scal}. "
              "The thesis's own Figure 7.12 programs (CUDA samples) have no stand-in, and its values are not in its text")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=("fit", "full"), default="fit")
    ap.add_argument("--counts", default=",".join(map(str, COUNTS)), help="GPU counts (a multiple of --per-node "
                    "beyond one node)")
    ap.add_argument("--per-node", type=int, default=4, help="GPUs per node (the thesis's cluster: 4)")
    ap.add_argument("--programs", default=",".join(i.name for i in list_scenarios("multigpu")))
    ap.add_argument("--tiles", type=int, default=32, help="thread-block rows of a kernel's grid, the same at every "
                    "count (at least the largest count, so that every GPU gets a slab)")
    ap.add_argument("--gpu-mem", default=None, help="GPU memory (default: the scenario's 256MiB; 32GiB at full scale)")
    ap.add_argument("--calibration", default="snurhac-v100-edr")
    ap.add_argument("--json", metavar="PATH", help="write every point and claim as JSON ('-': stdout)")
    ap.add_argument("--jobs", type=int, default=1, help="programs replayed at once (processes)")
    a = ap.parse_args()
    from umctl import UmctlError

    if a.scale == "full" and not a.gpu_mem:
        a.gpu_mem = "32GiB"   # Table 7.9: V100 PCIe 32 GB
    progs = a.programs.split(",")
    if a.scale == "full":   # Table 7.10 sizes exist only for the programs standing for one of its applications
        from umctl.workload.families.multigpu import FULL_MB

        skip = [p for p in progs if load_scenario(p).meta["program"] not in FULL_MB]
        if skip:
            print(f"scale full: {', '.join(skip)} left out (no Table 7.10 size)", file=sys.stderr)
            progs = [p for p in progs if p not in skip]
    counts = sorted({int(c) for c in a.counts.split(",")} | {1})
    try:
        calib = Calibration.load(a.calibration)
        for g in counts:
            topology(g, a.per_node)
        t0 = time.perf_counter()
        pts: dict[tuple[str, int, str], dict] = {}
        if a.jobs > 1:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(min(a.jobs, len(progs))) as ex:
                for part in ex.map(program_points, progs, *zip(*[(counts, a, calib)] * len(progs))):
                    pts.update(part)
        else:
            for p in progs:
                pts.update(program_points(p, counts, a, calib))
    except UmctlError as e:
        raise SystemExit(f"error: {e}") from None
    for (p, g, m), r in pts.items():
        r["speedup"] = pts[p, 1, "none"]["time_ns"] / r["time_ns"]
        thesis = TABLE_7_11.get(APP.get(p, ""))
        if g == 1 and m in VARIANTS and thesis:
            r["thesis"] = thesis[VARIANTS.index(m)]
            r["error"] = r["speedup"] / r["thesis"] - 1
    checked = claims(pts, progs, counts)

    out = sys.stdout if a.json != "-" else sys.stderr
    print(f"Speedup over the program on one GPU (CUDA, no UM); {a.per_node} GPUs per node; scale {a.scale}; "
          f"calibration {calib.name}\n", file=out)
    for p in progs:
        app = APP.get(p)
        print(f"### {p}" + (f" ({app})" if app else " (not in the thesis)"), file=out)
        print("| variant | " + " | ".join(f"{g} GPU{'s' if g > 1 else ''}" for g in counts)
              + " | Table 7.11 (1 GPU) | error |", file=out)
        print("| --- |" + " ---: |" * (len(counts) + 2), file=out)
        for m in VARIANTS:
            one = pts[p, 1, m]
            ref = f"{one['thesis']:.3f} | {one['error']:+.0%}" if "thesis" in one else "— | —"
            print(f"| {m} | " + " | ".join(f"{pts[p, g, m]['speedup']:.2f}" for g in counts) + f" | {ref} |", file=out)
        if (p, 1, "handwritten") in pts:
            print("| hand-written (CUDA, one node) | " + " | ".join(
                f"{pts[p, g, 'handwritten']['speedup']:.2f}" if (p, g, "handwritten") in pts else "—" for g in counts)
                + " | — | — |", file=out)
        print(file=out)
    errs = [abs(r["error"]) for r in pts.values() if "error" in r]
    if errs:
        print(f"Table 7.11 points: {len(errs)}, median |error| {statistics.median(errs):.0%}, geometric mean of "
              f"1 + |error| {geomean(1 + e for e in errs):.2f}\n", file=out)
    print("| thesis claim (§7.3.2) | result | evidence |\n| --- | --- | --- |", file=out)
    for c in checked:
        print(f"| {c['claim']} | {c['result']} | {c['evidence']} |", file=out)
    print(f"\n(wall {time.perf_counter() - t0:.0f} s)", file=out)
    if a.json:
        doc = {"calibration": calib.name, "scale": a.scale, "per_node": a.per_node, "tiles": a.tiles,
               "gpu_mem": a.gpu_mem, "points": list(pts.values()), "claims": checked}
        text = json.dumps(doc, indent=1)
        if a.json == "-":
            print(text)
        else:
            Path(a.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
