"""Actuators execute controller commands: ``uvm`` on a live process's managed memory
through its va_space (``umctl.actuators.uvm``); the simulator is the replay actuator."""
