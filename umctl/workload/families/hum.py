"""Traditional CUDA programs with explicit host-to-device copies (HUM, PPoPP'20 §4, §5).

The program shape of HUM's Figure 3, generalised to the benchmark programs it evaluates
(Parboil, Rodinia, CUDA Samples, §5.1): the host ``malloc``s input buffers and ``cudaMalloc``s
device buffers, then each iteration writes input k on the host (host time), copies it with
``cudaMemcpy`` or ``cudaMemcpyAsync`` (several copies back to back, host work between them),
does some other host computation (Fig. 3 line 6), launches kernels that read the device inputs
(kernel j works on the j-th slice of every input, so a kernel can start once its slices
arrived: what HUM's chunked round-robin copies exploit, §4.5-4.6), and copies the result back
synchronously. With ``rewrite`` the host writes an input's source buffer again right after its
copy was issued, before the kernels: legal CUDA (the source is pageable, so the async copy has
staged it), and exactly the case HUM must detect by write-protecting the source (§4.2, Fig. 4;
lbm and tpacf in Parboil do this).

Variants for the shapes of §4.5-4.6 (defaults keep the original shape): ``write_first`` writes
every input before the copies, so the copies go back to back (Fig. 7, vector addition);
``host_between_gbps`` adds host computation after each copy (host work between copies);
``mixed_copies`` copies odd-numbered inputs with ``cudaMemcpyAsync`` and the others with
``cudaMemcpy``; ``interleave`` makes each kernel read its slices element-wise across the inputs
(``C[i] = A[i] + B[i]``) instead of one input after the other.

The program fits in device memory (HUM uses "the largest dataset that fits", §5.1): ``fill``
sets the device footprint as a fraction of ``gpu_mem``; ``oversub`` is accepted for uniformity
and does not apply.
"""

from __future__ import annotations

import numpy as np

from ...events.schema import CopyKind
from ..workload import Buffer, Workload, WorkloadBuilder
from .common import at_least, check, check_common, grid_for


def generate(params: dict) -> Workload:
    """The ``hum`` family: one program of the shape above on GPU 0."""
    check_common(params)
    for key in ("inputs", "outputs", "kernels"):
        at_least(params, key, 1)
    check(0 < params["fill"] <= 1, f"fill must be in (0, 1] (got {params['fill']})")
    for key in ("host_write_gbps", "kernel_gbps"):
        check(params[key] > 0, f"{key} must be positive (got {params[key]})")
    at_least(params, "host_compute_gbps", 0)
    at_least(params, "host_between_gbps", 0)
    n_in, n_out, n_k = params["inputs"], params["outputs"], params["kernels"]
    size = int(params["fill"] * params["gpu_mem"]) // (n_in + n_out)
    b = WorkloadBuilder("scenario", gpu_mem=params["gpu_mem"])

    def pair(name: str) -> tuple[Buffer, Buffer]:
        host = b.alloc(f"host_{name}", size, managed=False, gpu=-1, emit=True)   # malloc
        dev = b.alloc(f"dev_{name}", size, managed=False, gpu=0, emit=True)      # cudaMalloc
        return host, dev

    inputs = [pair(f"in{k}") for k in range(n_in)]
    outputs = [pair(f"out{k}") for k in range(n_out)]

    def duration(nbytes: int, gbps: float) -> int:
        return int(nbytes / gbps) if gbps > 0 else 0

    copy_async = params["async_copy"]
    in_bytes = size * n_in
    for it in range(params["iterations"]):
        b.iteration = it
        if params["write_first"]:
            for host, _ in inputs:
                b.host_write(host, duration(size, params["host_write_gbps"]))
        for k, (host, dev) in enumerate(inputs):
            if not params["write_first"]:
                b.host_write(host, duration(size, params["host_write_gbps"]))
            b.copy(host, dev, kind=CopyKind.H2D, is_async=copy_async or (params["mixed_copies"] and k % 2 == 1))
            if params["rewrite"] and k == 0:
                b.host_write(host, duration(size, params["host_write_gbps"]))
            if params["host_between_gbps"] > 0:
                b.host(duration(size, params["host_between_gbps"]))
        if params["host_compute_gbps"] > 0:
            b.host(duration(in_bytes, params["host_compute_gbps"]))
        for j in range(n_k):
            reads = [dev.split(n_k)[j] for _, dev in inputs]
            writes = [dev.split(n_k)[j] for _, dev in outputs]
            touched = sum(x.nbytes for x in reads + writes)
            kw: dict = dict(reads=reads, writes=writes)
            if params["interleave"] and len(reads) > 1:   # element-wise: A[i], B[i], ... then the outputs
                n = min(len(x.pages()) for x in reads)
                kw = dict(pages=[(np.stack([x.pages()[:n] for x in reads], 1).ravel(), False)]
                          + [(x.pages()[n:], False) for x in reads] + [(x.pages(), True) for x in writes])
            b.kernel(f"kernel{j}", compute_ns=duration(touched, params["kernel_gbps"]),
                     args=(j,) + tuple(x.addr for x in reads + writes), grid=grid_for(touched / 4, 1024), **kw)
        for host, dev in outputs:
            b.copy(dev, host, kind=CopyKind.D2H, is_async=False)
    return b.build()
