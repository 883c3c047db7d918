"""Live event sources (the :class:`umctl.live.interfaces.Source` protocol): the UVM tools API
(``uvmtools/``), BPF on the driver's fault path (``kprobes.py``), and the launch sources: the
BPF launch probe (``uprobes.py``) and umctl's in-process runtime (``runtime.py``). What a replay
reads (scenarios, traces) is in :mod:`umctl.workload`; the driver's ABI in :mod:`umctl.driver`."""
