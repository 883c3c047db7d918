"""Actuators execute controller commands: ``uvm`` on a live process's managed memory
through its va_space (``umctl.actuators.uvm``), ``kmod`` through the umctl kernel module
(``umctl.actuators.kmod``); the simulator is the replay actuator. The interface is
:class:`umctl.live.interfaces.Actuator`; :class:`~umctl.actuators.base.ActuatorBase` holds the
result bookkeeping they share."""

from .base import ActuatorBase, result_records  # noqa: F401
