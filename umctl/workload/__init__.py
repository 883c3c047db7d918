"""What a program does, in program order: the replay's input. Scenario families
(``scenario.py`` and the generators in ``families/``) and recorded traces (``tracefile.py``)
become a :class:`~umctl.workload.workload.Workload`; ``target.py`` resolves what the user named.
Live event sources are in :mod:`umctl.sources`."""
