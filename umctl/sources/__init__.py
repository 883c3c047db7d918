"""Sources of events and access streams. Replay: scenarios (``scenario.py`` and the generators in
``families/``), trace files (``tracefile.py``), resolved by ``target.py``. Live (the
:class:`umctl.live.interfaces.Source` protocol): the UVM tools API (``uvmtools/``), BPF on the
driver's fault path (``kprobes.py``), and the launch sources: the BPF launch probe
(``uprobes.py``) and umctl's in-process runtime (``runtime.py``)."""
