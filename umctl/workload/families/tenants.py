"""Several jobs sharing one multi-GPU server (memHarvester / HUVM, ATC'22 §2.1, §6.1 Table 2).

Tenant 0 (pid 0, GPU 0) is the harvester: a job oversubscribing its GPU (``oversub x
gpu_mem``); ``co_harvesters`` names more oversubscribed jobs on GPUs 1.. (HUVM Table 2 cases 2-4
have two or three), each at its own ``harvester_oversub`` entry when given. The tenants after
the harvesters (pid t, GPU t) are neighbours: they run smaller jobs that leave a ``spare`` fraction of
their GPU idle, the memory memHarvester lends the harvester as a victim cache. Jobs are named
by scenario (``harvester``, ``co_harvesters``, ``neighbours``, cycled over the neighbour GPUs; a
neighbour's free fraction is its ``neighbour_spare`` entry, else ``spare``) and built by that
scenario's own generator with its default shape, so a tenant runs exactly what the
one-GPU scenario runs. Their operations are interleaved by estimated compute time, as if the
jobs started together; the simulator runs them in the order of their own clocks instead, each
job on its own host thread (``Simulator._run_tenants``), so the real overlap is the replay's.
"""

from __future__ import annotations

import heapq
from typing import Callable, Iterator

from ..workload import Workload, WorkloadBuilder
from .common import ParamError, Params, Tick, check, check_common


#: name -> (the job generator of that scenario's family, its default parameters), ParamError if it
#: cannot run as a tenant: set by umctl.workload.scenario, which owns the scenario files and the
#: generator registry, so the imports run one way (scenario -> families)
find_job: Callable[[str], tuple[Callable[..., Iterator[Tick]], dict]] | None = None


def generate(params: dict) -> Workload:
    """The ``tenants`` family: one harvester and ``tenants - 1`` neighbours, one GPU each."""
    if find_job is None:
        raise ParamError("tenants scenarios are generated through umctl.workload.scenario (load_scenario)")
    check_common(params)
    n = params["tenants"]
    check(2 <= n <= 8, f"tenants must be between 2 and 8 (got {n})")
    check(0 <= params["spare"] < 1, f"spare must be in [0, 1) (got {params['spare']})")
    check(len(params["neighbours"]) >= 1, "neighbours must name at least one scenario")
    check(params["neighbour_iterations"] >= 1, "neighbour_iterations must be at least 1")
    check(params.get("job_hbm_gbps", 0) >= 0, f"job_hbm_gbps must not be negative (got {params.get('job_hbm_gbps')})")
    harvesters = [params["harvester"]] + list(params.get("co_harvesters", []))
    h = len(harvesters)
    check(h < n, f"{h} harvesters leave no neighbour on {n} GPUs: raise tenants")
    try:
        hover = [float(x) for x in params.get("harvester_oversub", [])]
        nspare = [float(x) for x in params.get("neighbour_spare", [])]
    except ValueError:
        raise ParamError("harvester_oversub and neighbour_spare must be lists of numbers") from None
    check(all(x > 0 for x in hover), "harvester_oversub entries must be positive")
    check(all(0 <= x < 1 for x in nspare), "neighbour_spare entries must be in [0, 1)")
    b = WorkloadBuilder("scenario", n_gpus=n, gpu_mem=params["gpu_mem"])
    jobs: list[Iterator[Tick]] = []
    tenants: list[dict] = []
    for t in range(n):
        harvests = t < h
        name = harvesters[t] if harvests else params["neighbours"][(t - h) % len(params["neighbours"])]
        job, defaults = find_job(name)
        sub = Params(defaults)
        sub.update(seed=params["seed"] + t,
                   iterations=params["iterations"] if harvests else params["neighbour_iterations"])
        if params.get("job_hbm_gbps", 0) > 0:   # the jobs run on another GPU than their own defaults'
            sub.update(hbm_gbps=params["job_hbm_gbps"])
        if harvests:
            ratio = hover[t] if t < len(hover) else params["oversub"]
        else:
            ratio = 1 - (nspare[t - h] if t - h < len(nspare) else params["spare"])
        footprint = ratio * params["gpu_mem"]
        meta = {"scenario": name, "pid": t, "gpu": t, "harvester": harvests, "ratio": ratio}
        jobs.append(job(b, sub, footprint=int(footprint), pid=t, gpu=t, meta=meta))
        tenants.append(meta)
    clock = [(0, t) for t in range(n)]
    while clock:
        now, t = heapq.heappop(clock)
        ns = next(jobs[t], None)
        if ns is not None:
            heapq.heappush(clock, (now + ns, t))
    return b.build(meta={"tenants": tenants})
