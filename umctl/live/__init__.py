"""The live path around a running process, usable without the CLI: the declared interfaces
(``interfaces.py``: Source, LaunchSource, Actuator), the session (``session.py``: attach, loop,
trace, stop), what a mode needs live and which actuator goes with a source (``spec.py``),
getting a source or starting a program (``attach.py``), the control loop with its residency
estimate and soft budget (``control.py``) and the statistics views show (``stats.py``)."""
