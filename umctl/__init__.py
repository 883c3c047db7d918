"""umctl: observe and control CUDA Unified Memory.

Data flows sources -> events -> controller -> commands -> actuators; the simulator in
:mod:`umctl.sim` is both a source and an actuator, so a replay is a closed loop running the
same controller code as the live path.
"""

__version__ = "0.1.0"


class UmctlError(Exception):
    """An error the CLI reports as one line and a non-zero exit (never a traceback)."""

    exit_code = 2
