"""SnuRHAC over several nodes (thesis §6.3), on MPI.

One node agent per MPI rank (``agent.py``) holds that node's copy of the unified-memory space
and serves the cluster protocol: distributed block descriptors (32-block runs round-robin),
per-block locks with wait lists, the fault protocol's lock / access list / page owners / page
request / unlock messages, write degradation, and the synchronisation after each kernel that
unmaps stale read copies. ``runtime.py`` decides, as the SnuRHAC runtime does at each launch,
which node runs which thread blocks (one slab per GPU of the cluster; atomics and write overlap
above 0.5 fall back to one GPU) and which buffers carry the read-only flag.

mpi4py (the optional ``mpi`` extra) is the transport; pages travel as MPI messages, which the
MPI library carries over RDMA where the fabric has it and TCP otherwise.
"""
