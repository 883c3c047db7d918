"""Calibrated discrete-event model of the nvidia-uvm driver (source and actuator of replays)."""
